"""MMPO's loss for NeMo-RL: the PPO clipped surrogate with the paper's settings and metrics.

The paper (Eq. mmpo_surrogate) maximises ``min(rho A, clip(rho, 1-eps, 1+eps) A)`` with
eps = 0.2 and no KL term, i.e. NeMo-RL's ``ClippedPGLossFn`` with the settings in
:data:`PAPER_LOSS_SETTINGS`. Selecting ``loss_fn.name: mmpo`` applies them (printing any value
it changes) and adds advantage metrics; ``ratio_clip_min``/``ratio_clip_max`` stay sweepable.

This module imports ``nemo_rl``; it is loaded by :func:`nemo_mmpo.nemo_rl.install` on the
driver and by unpickling in NeMo-RL's policy workers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from nemo_rl.algorithms.loss import ClippedPGLossFn

LOSS_NAME = "mmpo"
PAPER_LOSS_SETTINGS: dict[str, Any] = {
    "reference_policy_kl_penalty": 0.0,
    "use_kl_in_reward": False,
    "disable_ppo_ratio": False,
    "ratio_clip_c": None,
    "sequence_level_importance_ratios": False,
    "use_cispo": False,
    "force_on_policy_ratio": False,
}


def _get(config: Any, key: str) -> Any:
    return config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)


def with_paper_settings(config: Any) -> Any:
    """A copy of ``config`` (mapping or pydantic model) with :data:`PAPER_LOSS_SETTINGS`."""
    changed = {
        key: (_get(config, key), value)
        for key, value in PAPER_LOSS_SETTINGS.items()
        if _get(config, key) != value
    }
    for key, (old, new) in changed.items():
        print(f"[nemo-mmpo] loss_fn.name=mmpo sets loss_fn.{key}: {old!r} -> {new!r} (paper)")
    if isinstance(config, Mapping):
        return {**config, **PAPER_LOSS_SETTINGS}
    return config.model_copy(update=PAPER_LOSS_SETTINGS)


class MMPOClippedPGLossFn(ClippedPGLossFn):
    """NeMo-RL's clipped policy-gradient loss with MMPO's settings and advantage metrics.

    Extra metrics (globally normalised like NeMo-RL's, so microbatch sums are exact):
    ``mmpo/advantage_token_mean``, ``mmpo/advantage_abs_token_mean`` and
    ``mmpo/positive_advantage_token_fraction``.
    """

    def __init__(self, cfg: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(with_paper_settings(cfg), *args, **kwargs)

    def __call__(
        self,
        next_token_logprobs: torch.Tensor,
        data: Any,
        global_valid_seqs: torch.Tensor,
        global_valid_toks: torch.Tensor,
        *args: Any,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, dict]:
        loss, metrics = super().__call__(
            next_token_logprobs, data, global_valid_seqs, global_valid_toks, *args, **kwargs
        )
        with torch.no_grad():
            advantages = data["advantages"][:, 1:].float()
            mask = data["token_mask"][:, 1:] * data["sample_mask"].unsqueeze(-1)
            total = (
                global_valid_toks.clamp(min=1)
                if torch.is_tensor(global_valid_toks)
                else max(float(global_valid_toks), 1.0)
            )
            metrics["mmpo/advantage_token_mean"] = float((advantages * mask).sum() / total)
            metrics["mmpo/advantage_abs_token_mean"] = float(
                (advantages.abs() * mask).sum() / total
            )
            metrics["mmpo/positive_advantage_token_fraction"] = float(
                ((advantages > 0) * mask).sum() / total
            )
        return loss, metrics


def build_loss(original_class: type, cfg: Any, *args: Any, **kwargs: Any) -> Any:
    """Construct ours for ``loss_fn.name == 'mmpo'``, else NeMo-RL's ``original_class``."""
    if _get(cfg, "name") == LOSS_NAME:
        return MMPOClippedPGLossFn(cfg, *args, **kwargs)
    return original_class(cfg, *args, **kwargs)
