"""``install()``: make NeMo-RL's GRPO build our estimators and loss, without a fork.

NeMo-RL has no registry for advantage estimators or losses: ``_create_advantage_estimator``
in ``nemo_rl.algorithms.grpo`` is an if/elif that raises on unknown names, and ``setup()``
constructs ``ClippedPGLossFn`` directly. Both are module globals looked up at call time, and
``grpo_sync`` / ``single_controller_utils.setup`` import them by name, so :func:`install`
wraps the name in each of those modules:

- ``_create_advantage_estimator``: our :class:`MMPOAdvantageEstimator` when
  ``grpo.adv_estimator.name`` is one of ours, NeMo-RL's own otherwise;
- ``ClippedPGLossFn``: our loss when ``loss_fn.name == "mmpo"``, NeMo-RL's otherwise;
- ``_log_mixed_rewards_and_advantages_information``: also merges our estimator's
  ``last_metrics`` into the step metrics (the synchronous trainer ignores ``last_metrics``).

Idempotent; raises with the installed NeMo-RL version if a hook point has moved.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from nemo_mmpo.nemo_rl.estimator import ESTIMATOR_NAMES, MMPOAdvantageEstimator, config_value

SUPPORTED = "NeMo-RL v0.6.0 or newer (tested: v0.7.0 and main)"
ESTIMATOR_MODULES = (
    "nemo_rl.algorithms.grpo",
    "nemo_rl.algorithms.grpo_sync",
    "nemo_rl.algorithms.single_controller_utils.setup",
)
MARK = "_nemo_mmpo_original"


class _State:
    active_estimator: MMPOAdvantageEstimator | None = None


def _nemo_rl_version() -> str:
    try:
        import nemo_rl

        return str(getattr(nemo_rl, "__version__", "unknown"))
    except ImportError:
        return "not installed"


def _hook_error(detail: str) -> RuntimeError:
    return RuntimeError(
        f"nemo-mmpo cannot install into NeMo-RL {_nemo_rl_version()}: {detail}. "
        f"nemo-mmpo supports {SUPPORTED}; please report the NeMo-RL version in an issue"
    )


def _estimator_factory(original: Any) -> Any:
    @functools.wraps(original)
    def create_advantage_estimator(master_config: Any, *args: Any, **kwargs: Any) -> Any:
        grpo_config = config_value(master_config, "grpo")
        estimator_config = config_value(grpo_config, "adv_estimator")
        if config_value(estimator_config, "name") in ESTIMATOR_NAMES:
            estimator = MMPOAdvantageEstimator(
                estimator_config, config_value(master_config, "loss_fn")
            )
            _State.active_estimator = estimator
            print(f"  ✓ Using nemo-mmpo advantage estimator: {estimator.settings}")
            return estimator
        _State.active_estimator = None
        return original(master_config, *args, **kwargs)

    setattr(create_advantage_estimator, MARK, original)
    return create_advantage_estimator


def _loss_factory(original: type) -> Any:
    from nemo_mmpo.nemo_rl.loss import build_loss

    @functools.wraps(original, updated=())
    def clipped_pg_loss(cfg: Any, *args: Any, **kwargs: Any) -> Any:
        return build_loss(original, cfg, *args, **kwargs)

    setattr(clipped_pg_loss, MARK, original)
    return clipped_pg_loss


def _metrics_logger(original: Any) -> Any:
    @functools.wraps(original)
    def log_rewards_and_advantages(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        metrics = kwargs.get("metrics", args[2] if len(args) > 2 else None)
        estimator = _State.active_estimator
        if isinstance(metrics, dict) and estimator is not None:
            metrics.update(estimator.last_metrics)
        return result

    setattr(log_rewards_and_advantages, MARK, original)
    return log_rewards_and_advantages


_HOOKS = {
    "_create_advantage_estimator": _estimator_factory,
    "ClippedPGLossFn": _loss_factory,
    "_log_mixed_rewards_and_advantages_information": _metrics_logger,
}


def _import_optional(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def install() -> list[str]:
    """Hook our estimators and loss into NeMo-RL's GRPO; returns the attributes wrapped.

    Safe to call many times and in every process (driver or Ray worker).

    Raises:
        RuntimeError: NeMo-RL is missing, or its GRPO module lacks a hook point.
    """
    try:
        grpo = importlib.import_module("nemo_rl.algorithms.grpo")
    except ImportError as error:
        raise _hook_error(f"importing nemo_rl.algorithms.grpo failed ({error})") from error
    for attribute in _HOOKS:
        if not hasattr(grpo, attribute):
            raise _hook_error(f"nemo_rl.algorithms.grpo has no attribute {attribute!r}")
    wrapped = []
    for module_name in ESTIMATOR_MODULES:
        module = grpo if module_name == grpo.__name__ else _import_optional(module_name)
        if module is None:
            continue
        for attribute, make_wrapper in _HOOKS.items():
            current = getattr(module, attribute, None)
            if current is None or hasattr(current, MARK):
                continue
            setattr(module, attribute, make_wrapper(current))
            wrapped.append(f"{module_name}.{attribute}")
    return wrapped


def is_installed() -> bool:
    """Whether NeMo-RL's GRPO currently builds our estimators."""
    grpo = _import_optional("nemo_rl.algorithms.grpo")
    return grpo is not None and hasattr(getattr(grpo, "_create_advantage_estimator", None), MARK)
