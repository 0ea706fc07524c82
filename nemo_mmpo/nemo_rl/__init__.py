"""The NeMo-RL adapter: what ships inside a GPU run (estimator, losses, DMPO terms, hooks).

Nothing here imports ``nemo_rl`` at import time; :func:`install` and :mod:`.loss` do, lazily,
so ``import nemo_mmpo.nemo_rl`` works on a machine without NeMo-RL.

- :mod:`.advantage_estimator`: :class:`MMPOAdvantageEstimator`;
- :mod:`.estimator_settings`: ``grpo.adv_estimator``, typed; the names we answer to;
- :mod:`.loss`: the registered losses (:mod:`nemo_mmpo.losses`) as NeMo-RL builds them;
- :mod:`.dmpo_batch_terms`: DMPO's per-batch penalty terms;
- :mod:`.hooks`: :func:`install`; :mod:`.wrappers`: what it puts in place;
- :mod:`.run_state`: what a run's hooks share;
- :mod:`.names`, :mod:`.paper_settings`: names and the paper's loss settings;
- :mod:`.versions`: what differs between NeMo-RL versions, read from a checkout's code.
"""

from nemo_mmpo.nemo_rl.advantage_estimator import MMPOAdvantageEstimator
from nemo_mmpo.nemo_rl.estimator_settings import (
    EstimatorSettings,
    estimator_names,
    is_our_estimator,
    read_estimator_settings,
)
from nemo_mmpo.nemo_rl.hooks import install, is_installed
from nemo_mmpo.nemo_rl.names import NEMO_RL_ESTIMATORS

__all__ = [
    "NEMO_RL_ESTIMATORS",
    "EstimatorSettings",
    "MMPOAdvantageEstimator",
    "estimator_names",
    "install",
    "is_installed",
    "is_our_estimator",
    "read_estimator_settings",
]
