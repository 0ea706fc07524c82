"""MMPO's loss for NeMo-RL: NeMo-RL's clipped surrogate, exactly as configured, plus metrics.

The paper (Eq. mmpo_surrogate) maximises ``min(rho A, clip(rho, 1-eps, 1+eps) A)`` with
eps = 0.2 and no KL term: NeMo-RL's ``ClippedPGLossFn`` with :data:`PAPER_LOSS_SETTINGS`,
which every recipe sets in ``loss_fn``. ``loss_fn.name: mmpo`` computes what NeMo-RL's loss
computes for the same ``loss_fn`` (the trainer reads the same config, e.g. to skip
``prev_logprobs`` under ``force_on_policy_ratio`` or the reference model when the KL weight
is 0, so a private rewrite would mis-train), and adds advantage metrics. Settings that differ
from the paper's are reported by the dry run and once at construction, never changed.

This module imports ``nemo_rl``; it is loaded by :func:`nemo_mmpo.nemo_rl.install` on the
driver and by unpickling in NeMo-RL's policy workers.
"""

from __future__ import annotations

from typing import Any

import torch
from nemo_rl.algorithms.loss import ClippedPGLossFn

from nemo_mmpo.nemo_rl.paper_settings import config_get, paper_setting_deviations

LOSS_NAME = "mmpo"
METRIC_NAMES = (
    "mmpo/advantage_token_mean",
    "mmpo/advantage_abs_token_mean",
    "mmpo/positive_advantage_token_fraction",
)


class MMPOClippedPGLossFn(ClippedPGLossFn):
    """NeMo-RL's clipped policy-gradient loss, unchanged, with MMPO's advantage metrics.

    Extra metrics (globally normalised like NeMo-RL's, so micro-batch sums are exact):
    :data:`METRIC_NAMES`, over tokens with ``token_mask * sample_mask``.
    """

    def __init__(self, cfg: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(cfg, *args, **kwargs)
        deviations = paper_setting_deviations(cfg)
        if deviations:
            print(f"[nemo-mmpo] loss_fn.name=mmpo with non-paper settings: {', '.join(deviations)}")

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
        metrics.update(advantage_metrics(data, global_valid_toks))
        return loss, metrics


def advantage_metrics(data: Any, global_valid_toks: Any) -> dict[str, float]:
    """The :data:`METRIC_NAMES` of one micro-batch, in one device-to-host transfer."""
    with torch.no_grad():
        advantages = data["advantages"][:, 1:]
        mask = data["token_mask"][:, 1:] * data["sample_mask"].unsqueeze(-1)
        sums = torch.stack(
            [
                (advantages * mask).sum(),
                (advantages.abs() * mask).sum(),
                ((advantages > 0) * mask).sum(),
            ]
        ).double()
        total = float(global_valid_toks) if not torch.is_tensor(global_valid_toks) else None
        if total is None:
            sums = sums / global_valid_toks.to(sums.device, torch.float64).clamp(min=1)
            values = sums.tolist()
        else:
            values = [value / max(total, 1.0) for value in sums.tolist()]
    return dict(zip(METRIC_NAMES, values, strict=True))


def build_loss(original_class: type, cfg: Any, *args: Any, **kwargs: Any) -> Any:
    """Construct ours for ``loss_fn.name == 'mmpo'``, else NeMo-RL's ``original_class``."""
    if config_get(cfg, "name") == LOSS_NAME:
        return MMPOClippedPGLossFn(cfg, *args, **kwargs)
    return original_class(cfg, *args, **kwargs)
