"""NeMo-RL integration: advantage estimator, loss and the install hook.

Nothing here imports ``nemo_rl`` at import time; :func:`install` and :mod:`.loss` do, lazily,
so ``import nemo_mmpo.nemo_rl`` works on a machine without NeMo-RL.
"""

from nemo_mmpo.nemo_rl.estimator import (
    ESTIMATOR_NAMES,
    EstimatorSettings,
    MMPOAdvantageEstimator,
    read_estimator_settings,
)
from nemo_mmpo.nemo_rl.install import install, is_installed

__all__ = [
    "ESTIMATOR_NAMES",
    "EstimatorSettings",
    "MMPOAdvantageEstimator",
    "install",
    "is_installed",
    "read_estimator_settings",
]
