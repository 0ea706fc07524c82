"""MMPO's loss for NeMo-RL: NeMo-RL's clipped surrogate, exactly as configured.

The paper (Eq. mmpo_surrogate) maximises ``min(rho A, clip(rho, 1-eps, 1+eps) A)`` with
eps = 0.2 and no KL term: NeMo-RL's ``ClippedPGLossFn`` with the settings of
:data:`nemo_mmpo.nemo_rl.paper_settings.PAPER_LOSS_SETTINGS`, which every recipe sets in
``loss_fn``. ``loss_fn.name: mmpo`` computes what NeMo-RL's loss computes for the same
``loss_fn`` (the trainer reads the same config, e.g. to skip ``prev_logprobs`` under
``force_on_policy_ratio`` or the reference model when the KL weight is 0, so a private rewrite
would mis-train) and reports, once, the settings that differ from the paper's. The ``mmpo/``
advantage metrics are computed once per step by the estimator
(:meth:`~nemo_mmpo.nemo_rl.estimator.MMPOAdvantageEstimator.compute_advantage`), not in every
micro-batch here, so this loss costs what NeMo-RL's does.

This module imports ``nemo_rl``; it is loaded by :func:`nemo_mmpo.nemo_rl.install` on the
driver and by unpickling in NeMo-RL's policy workers.
"""

from __future__ import annotations

from typing import Any

from nemo_rl.algorithms.loss import ClippedPGLossFn

from nemo_mmpo.nemo_rl.estimator import config_value
from nemo_mmpo.nemo_rl.paper_settings import paper_setting_deviations

LOSS_NAME = "mmpo"


class MMPOClippedPGLossFn(ClippedPGLossFn):
    """NeMo-RL's clipped policy-gradient loss, unchanged; reports non-paper settings once."""

    def __init__(self, cfg: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(cfg, *args, **kwargs)
        deviations = paper_setting_deviations(cfg)
        if deviations:
            print(f"[nemo-mmpo] loss_fn.name=mmpo with non-paper settings: {', '.join(deviations)}")


def build_loss(original_class: type, cfg: Any, *args: Any, **kwargs: Any) -> Any:
    """Construct ours for ``loss_fn.name == 'mmpo'``, else NeMo-RL's ``original_class``."""
    if config_value(cfg, "name") == LOSS_NAME:
        return MMPOClippedPGLossFn(cfg, *args, **kwargs)
    return original_class(cfg, *args, **kwargs)
