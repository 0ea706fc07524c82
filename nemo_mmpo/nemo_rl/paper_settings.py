"""The paper's loss settings, checked without importing NeMo-RL (the dry run uses them too).

The paper trains with NeMo-RL's ``ClippedPGLossFn`` at eps = 0.2 and no KL term. Our recipes set
these values in ``loss_fn``; a config that differs is reported, never rewritten.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_mmpo.nemo_rl.estimator import config_value

PAPER_LOSS_SETTINGS: dict[str, Any] = {
    "reference_policy_kl_penalty": 0.0,
    "use_kl_in_reward": False,
    "disable_ppo_ratio": False,
    "ratio_clip_min": 0.2,
    "ratio_clip_max": 0.2,
    "ratio_clip_c": None,
    "sequence_level_importance_ratios": False,
    "use_cispo": False,
}


def _keys(config: Any) -> set[str]:
    if isinstance(config, Mapping):
        return set(config)
    return set(getattr(type(config), "model_fields", {})) | set(config.model_extra or {})


def paper_setting_deviations(config: Any) -> list[str]:
    """``loss_fn.key=value (paper: v)`` for each setting in ``config`` that is not the paper's."""
    keys = _keys(config)
    return [
        f"loss_fn.{key}={config_value(config, key)!r} (paper: {value!r})"
        for key, value in PAPER_LOSS_SETTINGS.items()
        if key in keys and config_value(config, key) != value
    ]
