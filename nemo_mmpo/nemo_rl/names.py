"""The names nemo-mmpo answers to inside NeMo-RL's configs and metrics, each defined once."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

#: ``grpo.adv_estimator.name`` of MMPO (its ``estimator`` key picks the formula).
MMPO_ESTIMATOR = "mmpo"
#: ``grpo.adv_estimator.name`` values NeMo-RL's ``_create_advantage_estimator`` builds itself
#: (v0.7.0 and main); ours never shadow them.
NEMO_RL_ESTIMATORS = ("grpo", "gdpo", "opd", "reinforce_plus_plus")
#: Keys NeMo-RL's own estimators read from ``grpo.adv_estimator`` (v0.7.0's TypedDict, main's
#: ``AdvEstimatorConfig``); they may sit beside ours in a shared config. A contract test checks
#: that the installed NeMo-RL reads no other.
NEMO_RL_ESTIMATOR_KEYS = (
    "normalize_rewards",
    "use_leave_one_out_baseline",
    "minus_baseline",
    "reward_weights",
)

#: ``loss_fn.name`` values: ours, and NeMo-RL's own clipped surrogate.
MMPO_LOSS = "mmpo"
DMPO_LOSS = "dmpo"
NEMO_RL_LOSS = "clipped_pg"
LOSS_NAMES = (MMPO_LOSS, DMPO_LOSS, NEMO_RL_LOSS)

#: Prefixes of the step metrics our estimator and DMPO's batch terms log.
ESTIMATOR_METRICS = "mmpo/"
DMPO_METRICS = "dmpo/"


def near_miss(value: Any, names: Iterable[str]) -> str | None:
    """The one of ``names`` that ``value`` misspells (case, surrounding spaces, a typo), or None
    (an exact name, or nothing close). Names are matched exactly: a near miss is refused with
    this spelling, never read as the name."""
    names = list(names)
    if not isinstance(value, str) or value in names:
        return None
    folded = value.strip().lower()
    for name in names:
        if folded == name.lower():
            return name
    close = difflib.get_close_matches(folded, names, n=1, cutoff=0.8)
    return close[0] if close else None
