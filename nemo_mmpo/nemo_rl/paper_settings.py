"""The paper's loss settings, checked without importing NeMo-RL (the dry run uses them too).

The paper trains with NeMo-RL's ``ClippedPGLossFn`` at eps = 0.2 and no KL term. Our recipes set
these values in ``loss_fn``; a config that differs is reported, never rewritten.
"""

from __future__ import annotations

from typing import Any

from nemo_mmpo import sections

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


_ABSENT = object()


def paper_setting_deviations(config: Any) -> list[str]:
    """``loss_fn.key=value (paper: v)`` for each setting ``config`` trains with (given, or a
    pydantic field's default) that is not the paper's."""
    deviations = []
    for key, paper in PAPER_LOSS_SETTINGS.items():
        current = sections.value(config, key, _ABSENT)
        if current is not _ABSENT and current != paper:
            deviations.append(f"loss_fn.{key}={current!r} (paper: {paper!r})")
    return deviations
