"""The hook that reaches inside NeMo-RL's ``SingleControllerActor``, whose process ``install()``
never ran.

The single controller builds our estimator on the driver and Ray pickles it into the actor,
which calls it once per streaming chunk (single_controller.py:1778) and reduces each step's
scalars with ``reduce_advantage_pump_metrics`` (:1074), reading no estimator metrics. Unpickled
there (``MMPOAdvantageEstimator.__setstate__``), the estimator calls :func:`install_in_actor`,
which wraps that function in the actor's module so that it also returns the step's ``mmpo/``
metrics, combined over its chunks (``MMPOAdvantageEstimator.take_step_metrics``).
:func:`~nemo_mmpo.nemo_rl.install` applies the same wrapper in the driver (to check NeMo-RL's
side of it; nothing calls it there). No ``nemo_rl`` import, and none of this package's modules
that import the estimator. Ray unpickles the actor's arguments before it imports the actor's
module: the hook then waits for that import (a ``sys.meta_path`` finder).
"""

from __future__ import annotations

import functools
import sys
import weakref
from typing import Any

from nemo_mmpo.on_import import ShimOnImport

#: the original NeMo-RL function, on each wrapper
MARK = "_nemo_mmpo_original"
#: the module whose name a wrapper replaces (each module gets its own wrapper)
HOOKED_IN = "_nemo_mmpo_hooked_in"
#: the module of the ``SingleControllerActor`` (its step metrics are reduced there)
SINGLE_CONTROLLER_ACTOR = "nemo_rl.algorithms.single_controller"
REDUCER = "reduce_advantage_pump_metrics"
#: the estimator unpickled into this process (held weakly)
_estimator: weakref.ref[Any] | None = None


def actor_estimator() -> Any:
    """The estimator unpickled into this actor's process (None where there is none)."""
    return None if _estimator is None else _estimator()


def chunked_metrics_reducer(original: Any) -> Any:
    """``reduce_advantage_pump_metrics`` (single_controller.py:1074; utils.py:101): NeMo-RL's
    step scalars, and the ``mmpo/`` metrics of the step's chunks, combined, from the estimator of
    this process."""

    @functools.wraps(original)
    def reduce_advantage_pump_metrics(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        estimator = actor_estimator()
        step_metrics = estimator.take_step_metrics() if estimator is not None else {}
        if step_metrics:  # already step scalars here: the controller logs them as they are
            result = {**(result or {}), **step_metrics}
        return result

    return reduce_advantage_pump_metrics


def install_in_actor(estimator: Any) -> list[str]:
    """Make ``estimator`` the one this process's ``reduce_advantage_pump_metrics`` reads, and
    hook that function: now where the actor's module is imported, else when it is (Ray
    unpickles an actor's arguments before it imports the actor's module: seen in the CPU rig's
    single-controller run, where the hook applied only at unpickling lost every ``mmpo/``
    metric). Returns the ``module.name`` hooked now (empty where the hook waits for the
    import)."""
    global _estimator
    _estimator = weakref.ref(estimator)
    module = sys.modules.get(SINGLE_CONTROLLER_ACTOR)
    if module is None:
        if not any(getattr(finder, HOOKED_IN, None) for finder in sys.meta_path):
            finder = ShimOnImport({SINGLE_CONTROLLER_ACTOR: hook_reducer})
            setattr(finder, HOOKED_IN, SINGLE_CONTROLLER_ACTOR)
            sys.meta_path.insert(0, finder)
        return []
    return hook_reducer(module)


def hook_reducer(module: Any) -> list[str]:
    """Wrap ``module``'s ``reduce_advantage_pump_metrics`` (once) with
    :func:`chunked_metrics_reducer`; returns the hooked ``module.name``."""
    current = getattr(module, REDUCER, None)
    if current is None:
        raise RuntimeError(
            f"nemo-mmpo cannot report its mmpo/ metrics from NeMo-RL's single controller: "
            f"{module.__name__} has no {REDUCER!r}; please report the NeMo-RL version"
        )
    if getattr(current, HOOKED_IN, None) != module.__name__:
        wrapper = chunked_metrics_reducer(getattr(current, MARK, current))
        setattr(wrapper, MARK, getattr(current, MARK, current))
        setattr(wrapper, HOOKED_IN, module.__name__)
        setattr(module, REDUCER, wrapper)
    return [f"{module.__name__}.{REDUCER}"]
