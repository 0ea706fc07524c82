"""The hook that reaches inside NeMo-RL's ``SingleControllerActor``, whose process ``install()``
never ran.

The actor calls the estimator pickled into it once per streaming chunk and reduces each step's
scalars with ``reduce_advantage_pump_metrics``, reading no estimator metrics. Unpickled there,
the estimator calls :func:`install_in_actor`, which wraps that function to add the step's
``mmpo/`` metrics, combined over its chunks, and the first-step checks' names
(:mod:`~nemo_mmpo.nemo_rl.actor_outcomes`), in the stage's own module where NeMo-RL has one
(:data:`ADVANTAGE_STAGE`). ``install()`` applies them in the driver only to check NeMo-RL's
side. No ``nemo_rl`` import, nor of this package's modules that import the estimator. Ray
unpickles the actor's arguments before it imports the actor's module: the hook then waits for
that import (a ``sys.meta_path`` finder).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import weakref
from typing import Any

from nemo_mmpo.nemo_rl import actor_outcomes
from nemo_mmpo.nemo_rl import run_state as state
from nemo_mmpo.on_import import ShimOnImport

#: the original NeMo-RL function, on each wrapper
MARK = "_nemo_mmpo_original"
#: the module whose name a wrapper replaces (each module gets its own wrapper)
HOOKED_IN = "_nemo_mmpo_hooked_in"
#: the module of the ``SingleControllerActor`` (its step metrics are reduced there)
SINGLE_CONTROLLER_ACTOR = "nemo_rl.algorithms.single_controller"
REDUCER = "reduce_advantage_pump_metrics"
#: the names of the actor's module the first-step checks wrap there: the method of the actor
#: that must call each and the parameters the wrapper reads (``install()`` checks both)
FIRST_STEP_CHECKED = {
    "Logger": ("SingleControllerActor.__init__", ()),
    "fields_for_put": ("SingleControllerActor._advantage_stage", ("meta", "fields")),
}
#: the stage's own module in NeMo-RL versions that have one: its ``AdvantageComputer.run`` puts
#: the advantages, so the put is checked there, not in the controller
ADVANTAGE_STAGE = "nemo_rl.algorithms.single_controller_utils.advantage_stage"
STAGE_CHECKED = {"fields_for_put": ("AdvantageComputer.run", ("meta", "fields"))}
#: the stage's clip (after the estimator, before the put), wrapped to record its config
STAGE_CLIP = "_clip_grpo_advantages"


def has_advantage_stage() -> bool:
    """Whether this NeMo-RL has the stage's own module (:data:`ADVANTAGE_STAGE`)."""
    if sys.modules.get(ADVANTAGE_STAGE) is not None:
        return True
    try:
        return importlib.util.find_spec(ADVANTAGE_STAGE) is not None
    except (ImportError, ValueError):
        return False


def first_step_checks() -> dict[str, dict[str, tuple[str, tuple[str, ...]]]]:
    """``{module: {name: (the method that must call it, the parameters its wrapper reads)}}``:
    :data:`FIRST_STEP_CHECKED` in the controller's module; where NeMo-RL has the stage's own
    module, the put (:data:`STAGE_CHECKED`) there instead."""
    if not has_advantage_stage():
        return {SINGLE_CONTROLLER_ACTOR: dict(FIRST_STEP_CHECKED)}
    in_controller = {
        name: check for name, check in FIRST_STEP_CHECKED.items() if name not in STAGE_CHECKED
    }
    return {SINGLE_CONTROLLER_ACTOR: in_controller, ADVANTAGE_STAGE: dict(STAGE_CHECKED)}


def actor_estimator() -> Any:
    """The estimator unpickled into this actor's process (None where there is none)."""
    held = state.RUN.actor_estimator
    return None if held is None else held()


def chunked_metrics_reducer(original: Any) -> Any:
    """``reduce_advantage_pump_metrics``: NeMo-RL's
    step scalars, and the ``mmpo/`` metrics of the step's chunks, combined, from the estimator of
    this process."""

    @functools.wraps(original)
    def reduce_advantage_pump_metrics(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        estimator = actor_estimator()
        step_metrics = estimator.take_step_metrics() if estimator is not None else {}
        if step_metrics:  # already step scalars here: the controller logs them as they are
            result = {**(result or {}), **step_metrics}
        # the first step is over: later puts go unchecked
        state.RUN.first_step.update(checking=False, compared=None, clip_config=None)
        return result

    return reduce_advantage_pump_metrics


def install_in_actor(estimator: Any) -> list[str]:
    """Make ``estimator`` the one this process's ``reduce_advantage_pump_metrics`` reads, and
    hook that function: now where the actor's module is imported, else when it is (Ray
    unpickles an actor's arguments before it imports the actor's module: seen in the CPU rig's
    single-controller run, where the hook applied only at unpickling lost every ``mmpo/``
    metric). Returns the ``module.name`` hooked now (empty where the hook waits for the
    import)."""
    state.RUN.actor_estimator = weakref.ref(estimator)
    state.RUN.first_step.update(checking=True, compared=None, clip_config=None)
    module = sys.modules.get(SINGLE_CONTROLLER_ACTOR)
    if module is None:
        if not any(getattr(finder, HOOKED_IN, None) for finder in sys.meta_path):
            finder = ShimOnImport({SINGLE_CONTROLLER_ACTOR: hook_actor})
            setattr(finder, HOOKED_IN, SINGLE_CONTROLLER_ACTOR)
            sys.meta_path.insert(0, finder)
        return []
    return hook_actor(module)


def first_step_logger(original: Any) -> Any:
    """``Logger`` in the actor's module: NeMo-RL's logger, checked
    at the end of the first step (:func:`~nemo_mmpo.nemo_rl.actor_outcomes.checked_logger`)
    where this process has our estimator."""

    @functools.wraps(original, updated=())
    def logger_checking_the_first_step(*args: Any, **kwargs: Any) -> Any:
        logger = original(*args, **kwargs)
        estimator = actor_estimator()
        return logger if estimator is None else actor_outcomes.checked_logger(logger, estimator)

    return logger_checking_the_first_step


def first_step_put(original: Any, where: str = SINGLE_CONTROLLER_ACTOR) -> Any:
    """``fields_for_put`` in the actor's module, or the stage's (``where``): until the first
    step's metrics are reduced, the fields put are compared with the estimator's output for the
    chunk (:func:`~nemo_mmpo.nemo_rl.actor_outcomes.check_put`), allowing the stage's clip; a
    chunk the estimator was not called for (no training tokens: NeMo-RL puts zeros) is not."""

    @functools.wraps(original)
    def fields_for_put(*args: Any, **kwargs: Any) -> Any:
        estimator = actor_estimator() if state.RUN.first_step["checking"] else None
        output = getattr(estimator, "last_output", None)
        if output is not None and output is not state.RUN.first_step["compared"]:
            state.RUN.first_step["compared"] = output
            fields = kwargs["fields"] if "fields" in kwargs else args[1]  # (meta, fields)
            actor_outcomes.check_put(
                fields, output, f"{where}.fields_for_put", state.RUN.first_step.get("clip_config")
            )
        return original(*args, **kwargs)

    return fields_for_put


def stage_clip(original: Any) -> Any:
    """``_clip_grpo_advantages(advantages, grpo_config)`` in the stage's module: during the first
    step, records the GRPO config it clips by (the recipe's ``grpo.advantage_clip_*``), which
    the put check then allows."""

    @functools.wraps(original)
    def clip_grpo_advantages(*args: Any, **kwargs: Any) -> Any:
        if state.RUN.first_step["checking"]:
            config = kwargs.get("grpo_config", args[1] if len(args) > 1 else None)
            state.RUN.first_step["clip_config"] = config
        return original(*args, **kwargs)

    return clip_grpo_advantages


#: what the actor's module gets wrapped with, by name (the reducer's also on the driver)
ACTOR_WRAPPERS = {
    REDUCER: chunked_metrics_reducer,
    "Logger": first_step_logger,
    "fields_for_put": first_step_put,
}
#: what the stage's module gets wrapped with (NeMo-RL after our snapshot); the clip where present
STAGE_WRAPPERS = {
    "fields_for_put": functools.partial(first_step_put, where=ADVANTAGE_STAGE),
    STAGE_CLIP: stage_clip,
}


def hook_actor(module: Any) -> list[str]:
    """Wrap (once) the controller's names in ``module`` (the reducer and
    :func:`first_step_checks`'), and the stage's in its module where NeMo-RL has one; returns
    the hooked ``module.name``s."""
    checks = first_step_checks()
    hooked = _wrap_names(module, [REDUCER, *checks[SINGLE_CONTROLLER_ACTOR]], ACTOR_WRAPPERS)
    if ADVANTAGE_STAGE in checks:
        stage = sys.modules.get(ADVANTAGE_STAGE) or importlib.import_module(ADVANTAGE_STAGE)
        hooked += _wrap_names(stage, list(checks[ADVANTAGE_STAGE]), STAGE_WRAPPERS)
        if getattr(stage, STAGE_CLIP, None) is not None:
            hooked += _wrap_names(stage, [STAGE_CLIP], STAGE_WRAPPERS)
    return hooked


def _wrap_names(module: Any, names: list[str], wrappers: dict[str, Any]) -> list[str]:
    hooked = []
    for name in names:
        current = getattr(module, name, None)
        if current is None:
            raise RuntimeError(
                f"nemo-mmpo cannot report its mmpo/ metrics and check its first step in "
                f"NeMo-RL's single controller: {module.__name__} has no {name!r}; please "
                "report the NeMo-RL version"
            )
        if getattr(current, HOOKED_IN, None) != module.__name__:
            wrapper = wrappers[name](getattr(current, MARK, current))
            setattr(wrapper, MARK, getattr(current, MARK, current))
            setattr(wrapper, HOOKED_IN, module.__name__)
            setattr(module, name, wrapper)
        hooked.append(f"{module.__name__}.{name}")
    return hooked
