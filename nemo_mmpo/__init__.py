"""nemo-mmpo: Multi-Moment Policy Optimization estimators for NeMo-RL.

Public API (stable names)::

    from nemo_mmpo import moment_objective, compute_advantages, mmpo_advantages
"""

from nemo_mmpo import baselines as _baselines  # noqa: F401  (registers the baseline estimators)
from nemo_mmpo import empirical_bayes as _empirical_bayes  # noqa: F401  (registers it)
from nemo_mmpo.diagnostics import moment_diagnostics
from nemo_mmpo.dmpo import distribution_matching_penalty
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.estimators import (
    available_estimators,
    compute_advantages,
    get_estimator,
    mmpo_advantages,
    register_estimator,
)
from nemo_mmpo.grouping import RewardGroups, group_ids_from_prompt_rows
from nemo_mmpo.objectives import MomentObjective, moment_objective

__version__ = "0.2.0"  # the one place: pyproject.toml reads it

__all__ = [
    "MMPOInputError",
    "MomentObjective",
    "RewardGroups",
    "available_estimators",
    "compute_advantages",
    "distribution_matching_penalty",
    "get_estimator",
    "group_ids_from_prompt_rows",
    "mmpo_advantages",
    "moment_diagnostics",
    "moment_objective",
    "register_estimator",
]
