"""Names of NeMo-RL's config keys and metric prefixes nemo-mmpo reads; the estimator and loss
names live in the registries (:mod:`nemo_mmpo.estimators`, :mod:`nemo_mmpo.losses`)."""

from __future__ import annotations

from nemo_mmpo.registry import NEMO_RL_ESTIMATORS, NEMO_RL_LOSSES, near_miss

#: Keys NeMo-RL's own estimators read from ``grpo.adv_estimator`` (v0.7.0's TypedDict, main's
#: ``AdvEstimatorConfig``); they may sit beside ours in a shared config. A contract test checks
#: that the installed NeMo-RL reads no other.
NEMO_RL_ESTIMATOR_KEYS = (
    "normalize_rewards",
    "use_leave_one_out_baseline",
    "minus_baseline",
    "reward_weights",
)

#: Prefixes of the step metrics our estimators and DMPO's batch terms log.
ESTIMATOR_METRICS = "mmpo/"
DMPO_METRICS = "dmpo/"

__all__ = [
    "DMPO_METRICS",
    "ESTIMATOR_METRICS",
    "NEMO_RL_ESTIMATORS",
    "NEMO_RL_ESTIMATOR_KEYS",
    "NEMO_RL_LOSSES",
    "near_miss",
]
