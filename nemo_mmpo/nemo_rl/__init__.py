"""NeMo-RL integration: advantage estimator, loss and the install hook.

Nothing here imports ``nemo_rl`` at import time; :func:`install` and :mod:`.loss` do, lazily,
so ``import nemo_mmpo.nemo_rl`` works on a machine without NeMo-RL. The hooks live in
:mod:`nemo_mmpo.nemo_rl.hooks` (``install`` here is the function).
"""

from nemo_mmpo.nemo_rl.estimator import (
    NEMO_RL_BUILTIN_ESTIMATORS,
    EstimatorSettings,
    MMPOAdvantageEstimator,
    estimator_names,
    is_our_estimator,
    read_estimator_settings,
)
from nemo_mmpo.nemo_rl.hooks import install, is_installed

__all__ = [
    "NEMO_RL_BUILTIN_ESTIMATORS",
    "EstimatorSettings",
    "MMPOAdvantageEstimator",
    "estimator_names",
    "install",
    "is_installed",
    "is_our_estimator",
    "read_estimator_settings",
]
