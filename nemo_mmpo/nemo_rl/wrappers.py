"""The replacements :func:`~nemo_mmpo.nemo_rl.hooks.install` puts in place of NeMo-RL's names
(which gets which: :data:`~nemo_mmpo.nemo_rl.hooks.HOOKS`): each takes NeMo-RL's original and
returns its wrapper, which reads the arguments it needs by name (:func:`bound_arguments`)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import weakref
from collections.abc import Iterator
from typing import Any

from nemo_mmpo import sections
from nemo_mmpo.contracts import checked
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.estimators import estimator_class, estimator_registered_by
from nemo_mmpo.eval.in_loop import in_loop_settings, validate_in_loop
from nemo_mmpo.nemo_rl import run_state as state
from nemo_mmpo.nemo_rl.advantage_estimator import MMPOAdvantageEstimator
from nemo_mmpo.nemo_rl.estimator_settings import (
    ESTIMATOR_SECTION,
    advantage_clip_keys,
    advantage_clip_warning,
    estimator_names,
    is_function_estimator,
    is_our_estimator,
    read_estimator_settings,
)
from nemo_mmpo.nemo_rl.names import near_miss
from nemo_mmpo.nemo_rl.outcomes import (
    FirstStepLogger,
    FirstStepPolicy,
    allowed_changes,
)
from nemo_mmpo.nemo_rl.refusals import (
    Problem,
    batch_terms_entry,
    factory_names,
    ppo_estimator_problem,
    ppo_loss_problem,
    refuse,
    single_controller_problem,
    trainer_problem,
)


def bound_arguments(original: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by parameter name, as ``original`` would receive them."""
    bound = inspect.signature(original).bind(*args, **kwargs)
    return dict(bound.arguments)


def built_estimator() -> Any:
    """The estimator NeMo-RL's factory built last, when it was ours (and is still alive): an
    :class:`MMPOAdvantageEstimator`, or a plug-in class's checked instance."""
    return state.RUN.estimator()


def estimator_factory(
    original: Any, problem: Problem | None = None, streaming_chunks: bool = False
) -> Any:
    @functools.wraps(original)
    def create_advantage_estimator(*args: Any, **kwargs: Any) -> Any:
        master_config = bound_arguments(original, args, kwargs)["master_config"]
        terms = state.builder_terms.get()
        chunks = streaming_chunks if terms is None else terms[1]
        refuse(problem if terms is None else terms[0], master_config)
        estimator_config = sections.value(master_config, "grpo.adv_estimator")
        state.RUN.built_estimator = None
        name = sections.value(estimator_config, "name")
        if not is_our_estimator(name):
            return nemo_rl_estimator(original, name, args, kwargs)
        settings = read_estimator_settings(estimator_config)
        plugin_class = estimator_class(settings.estimator)
        if plugin_class is not None:  # a class with NeMo-RL's protocol: built as NeMo-RL would
            if chunks:
                raise MMPOInputError(
                    f"{ESTIMATOR_SECTION}: estimator {settings.estimator!r} (registered by "
                    f"{estimator_registered_by(settings.estimator)}) is a class; NeMo-RL's "
                    "single controller calls its estimator once per streaming chunk, which "
                    "nemo-mmpo supports for estimators registered as functions of reward groups "
                    "only: register a function, or train with run_grpo.py"
                )
            built = plugin_class(estimator_config, sections.value(master_config, "loss_fn"))
            print(f"  ✓ Using nemo-mmpo plug-in estimator: {settings.describe()}")
            built = checked(built, "estimator", settings.estimator)
            state.RUN.built_estimator = weakref.ref(built)
            return built
        estimator = MMPOAdvantageEstimator(
            estimator_config,
            sections.value(master_config, "loss_fn"),
            streaming_chunks=chunks,
        )
        print(f"  ✓ Using nemo-mmpo advantage estimator: {estimator.settings.describe()}")
        grpo_model = getattr(sys.modules.get("nemo_rl.algorithms.grpo"), "GRPOConfig", None)
        clipping = advantage_clip_warning(
            estimator.settings,
            sections.value(master_config, "grpo"),
            advantage_clip_keys(grpo_model),
        )
        if clipping is not None:
            print(f"[nemo-mmpo] warning: {clipping}")
        state.RUN.built_estimator = weakref.ref(estimator)
        return estimator

    return create_advantage_estimator


def nemo_rl_estimator(original: Any, name: Any, args: tuple, kwargs: dict) -> Any:
    """NeMo-RL's factory for a name that is not ours; its unknown-name error becomes one line
    with the right spelling when ``name`` misspells one of ours (``MMPO``, ``"mmpo "``)."""
    try:
        return original(*args, **kwargs)
    except Exception as error:
        spelling = near_miss(name, estimator_names())
        if spelling is None:
            raise
        from nemo_mmpo.nemo_rl.contract import nemo_rl_version

        raise MMPOInputError(
            f"grpo.adv_estimator.name={name!r} is neither NeMo-RL {nemo_rl_version()}'s "
            f"({type(error).__name__}: {error}) nor nemo-mmpo's: names are matched exactly; "
            f"did you mean {spelling!r}?"
        ) from None


def loss_factory(original: type, problem: Problem | None = None) -> Any:
    from nemo_mmpo.nemo_rl.loss import build_loss  # imports nemo_rl: only once NeMo-RL is hooked

    @functools.wraps(original, updated=())
    def clipped_pg_loss(*args: Any, **kwargs: Any) -> Any:
        refuse(problem, bound_arguments(original, args, kwargs)["cfg"])
        return build_loss(original, *args, **kwargs)

    return clipped_pg_loss


def refusing(original: Any, parameter: str, problem: Problem) -> Any:
    """NeMo-RL's ``original``, unless ``problem`` refuses its argument ``parameter``."""

    @functools.wraps(original, updated=())
    def refuse_or_call(*args: Any, **kwargs: Any) -> Any:
        refuse(problem, bound_arguments(original, args, kwargs)[parameter])
        return original(*args, **kwargs)

    return refuse_or_call


def metrics_logger(original: Any) -> Any:
    @functools.wraps(original)
    def log_rewards_and_advantages(*args: Any, **kwargs: Any) -> Any:
        metrics = bound_arguments(original, args, kwargs)["metrics"]
        result = original(*args, **kwargs)
        estimator = built_estimator()
        step_metrics = {}
        if isinstance(estimator, MMPOAdvantageEstimator):
            step_metrics = estimator.take_step_metrics()
        elif estimator is not None:  # a plug-in class: NeMo-RL's informal last_metrics
            step_metrics = dict(getattr(estimator, "last_metrics", None) or {})
        if step_metrics:
            # NeMo-RL sums each list-valued step metric over micro-batches and prints
            # "Skipping aggregation" for scalars: a one-element list aggregates to the value.
            metrics.update({key: [value] for key, value in step_metrics.items()})
        return result

    return log_rewards_and_advantages


@contextlib.contextmanager
def training_with(loss: Any) -> Iterator[None]:
    """``loss`` is the loss that trains while the block runs (a hooked trainer's call)."""
    state.RUN.training_losses.append(loss)
    try:
        yield
    finally:
        state.RUN.training_losses.pop()


def grpo_trainer(original: Any) -> Any:
    """``grpo_train`` and ``async_grpo_train``: NeMo-RL's, after :func:`~nemo_mmpo.nemo_rl.
    refusals.trainer_problem` (before step 1), with the loss they train with remembered for the
    penalties hook."""

    @functools.wraps(original)
    def train(*args: Any, **kwargs: Any) -> Any:
        arguments = bound_arguments(original, args, kwargs)
        module = sys.modules[original.__module__]
        loss = arguments["loss_fn"]
        problem = trainer_problem(original.__name__, module, loss, "validate")
        refuse(problem, arguments["master_config"])
        with training_with(loss):
            return checking_first_step(original, args, kwargs)

    return train


def checking_first_step(original: Any, args: tuple, kwargs: dict) -> Any:
    """NeMo-RL's trainer ``original`` called with its ``logger`` wrapped in
    :class:`~nemo_mmpo.nemo_rl.outcomes.FirstStepLogger` and, when it trains one of our
    estimators, its ``policy`` in :class:`~nemo_mmpo.nemo_rl.outcomes.FirstStepPolicy` (the
    first step's outcome checked)."""
    bound = inspect.signature(original).bind(*args, **kwargs)
    if bound.arguments.get("logger") is None:  # no logger to check (install() reads it by name)
        return original(*args, **kwargs)
    master_config = bound.arguments["master_config"]
    logger = FirstStepLogger(bound.arguments["logger"], original.__name__, master_config)
    if not logger.checks_anything:  # NeMo-RL's own estimator and loss: its logger untouched
        return original(*args, **kwargs)
    bound.arguments["logger"] = logger
    if is_function_estimator(master_config) and bound.arguments.get("policy") is not None:
        grpo_model = getattr(sys.modules.get("nemo_rl.algorithms.grpo"), "GRPOConfig", None)
        logger.policy = FirstStepPolicy(
            bound.arguments["policy"],
            original.__name__,
            built_estimator,
            allowed_changes(master_config, grpo_model),
        )
        bound.arguments["policy"] = logger.policy
    result = original(*bound.args, **bound.kwargs)
    logger.check()  # a run whose first step was its last
    # a trainer that caught a check's error and returned (v0.7.0's async loop prints it)
    for error in (logger.error, logger.policy.error if logger.policy else None):
        if error is not None:
            raise error
    return result


def batch_penalties(original: Any) -> Any:
    """The penalties hook: NeMo-RL's, then the per-batch terms of a registered loss that has
    them (DMPO's), into the batch and the step's metrics."""

    @functools.wraps(original)
    def apply_penalties(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        arguments = bound_arguments(original, args, kwargs)
        loss_config = sections.value(arguments["master_config"], "loss_fn")
        entry = batch_terms_entry(loss_config)
        if entry is None:
            return result
        losses = state.RUN.training_losses
        loss = losses[-1] if losses else None
        loss_class = entry.resolve_class()
        if not isinstance(loss, loss_class):
            from nemo_mmpo.nemo_rl.contract import nemo_rl_version

            where = (
                "outside a hooked grpo_train or async_grpo_train"
                if loss is None
                else f"for a trainer whose loss is {type(loss).__qualname__}"
            )
            raise MMPOInputError(
                f"loss_fn.name={entry.name}: NeMo-RL {nemo_rl_version()}'s "
                f"{original.__name__} ran {where}, so the loss's per-batch terms would not "
                "reach it: call nemo_mmpo.nemo_rl.install() before importing NeMo-RL's "
                f"trainers, and train with {loss_class.__qualname__}"
            )
        metrics = entry.resolve_batch_terms()(arguments["train_data"], loss_config) or {}
        # NeMo-RL merges these into the step metrics and sums list values (see above).
        return {**(result or {}), **{key: [value] for key, value in metrics.items()}}

    return apply_penalties


def validation(original: Any) -> Any:
    @functools.wraps(original)
    def validate(*args: Any, **kwargs: Any) -> Any:
        arguments = bound_arguments(original, args, kwargs)
        settings = in_loop_settings(arguments["master_config"])
        if settings is None:
            return original(*args, **kwargs)
        state.RUN.in_loop_steps.append(arguments["step"])
        return validate_in_loop(
            arguments["policy_generation"],
            arguments["step"],
            settings,
            arguments["master_config"],
            arguments.get("tokenizer"),
        )

    return validate


def sync_trainer(original: Any) -> Any:
    """``grpo_train_sync``: NeMo-RL's, its engine remembered for :func:`sync_validation`."""

    @functools.wraps(original)
    def grpo_train_sync(*args: Any, **kwargs: Any) -> Any:
        arguments = bound_arguments(original, args, kwargs)
        module = sys.modules[original.__module__]
        problem = trainer_problem(original.__name__, module, None, "validate_sync")
        refuse(problem, arguments["master_config"])
        state.RUN.sync_generation = arguments["policy_generation"]
        try:
            return checking_first_step(original, args, kwargs)
        finally:
            state.RUN.sync_generation = None

    return grpo_train_sync


def sync_validation(original: Any) -> Any:
    """``validate_sync``: as :func:`validation` (its callers unpack ``(metrics, timings)``)."""

    @functools.wraps(original)
    def validate_sync(*args: Any, **kwargs: Any) -> Any:
        arguments = bound_arguments(original, args, kwargs)
        settings = in_loop_settings(arguments["master_config"])
        if settings is None:
            return original(*args, **kwargs)
        if state.RUN.sync_generation is None:
            raise MMPOInputError(
                "evaluation.in_loop=true: NeMo-RL's validate_sync was called outside the hooked "
                "grpo_train_sync, so the generation engine to evaluate is unknown: call "
                "nemo_mmpo.nemo_rl.install() before importing grpo_train_sync, or set "
                "evaluation.in_loop=false"
            )
        state.RUN.in_loop_steps.append(arguments["step"])
        return validate_in_loop(
            state.RUN.sync_generation, arguments["step"], settings, arguments["master_config"]
        )

    return validate_sync


# --- per trainer ------------------------------------------------------------------------------
#: how the refusals name the trainers whose terms differ from grpo_train's
SYNC_TRAINER = "grpo_train_sync (data_plane.enabled=true)"
SINGLE_CONTROLLER_TRAINER = "single controller (run_grpo_single_controller.py)"


def single_controller_builder(original: Any) -> Any:
    """A function of the single controller's setup that imports a factory inside its body
    (``_build_advantage_estimator``): the factory hook it reaches builds on the single
    controller's terms; our name coming back as anything else stops the run in one line."""
    trainer = SINGLE_CONTROLLER_TRAINER
    terms = (single_controller_problem(trainer), True)

    @functools.wraps(original)
    def build_advantage_estimator(*args: Any, **kwargs: Any) -> Any:
        master_config = bound_arguments(original, args, kwargs)["master_config"]
        token = state.builder_terms.set(terms)
        try:
            built = original(*args, **kwargs)
        finally:
            state.builder_terms.reset(token)
        name = sections.value(master_config, "grpo.adv_estimator.name")
        if is_our_estimator(name) and not (
            isinstance(built, MMPOAdvantageEstimator) and built.streaming_chunks
        ):
            from nemo_mmpo.nemo_rl.contract import nemo_rl_version

            raise MMPOInputError(
                f"grpo.adv_estimator.name={name}: NeMo-RL {nemo_rl_version()}'s {trainer} built "
                f"{type(built).__module__}.{type(built).__qualname__} through "
                f"{original.__module__}.{original.__name__}, not nemo-mmpo's streaming estimator: "
                "its factory is not one nemo-mmpo hooks; please report the NeMo-RL version"
            )
        if isinstance(built, MMPOAdvantageEstimator):
            where = f"{original.__module__}.{original.__name__}"
            print(f"  ✓ nemo-mmpo: the {trainer}'s estimator, built through {where}")
        return built

    return build_advantage_estimator


def advantage_actor_pool(original: Any) -> Any:
    """``create_advantage_actors``: refused for our estimators, whose ``mmpo/`` metrics would
    stay in the pool's actors."""

    @functools.wraps(original)
    def create_advantage_actors(*args: Any, **kwargs: Any) -> Any:
        estimator = bound_arguments(original, args, kwargs)["advantage_estimator"]
        if isinstance(estimator, MMPOAdvantageEstimator):
            from nemo_mmpo.nemo_rl.contract import nemo_rl_version

            raise MMPOInputError(
                f"async_rl.num_advantage_workers > 0: NeMo-RL {nemo_rl_version()}'s single "
                "controller would compute advantages in a pool of AdvantageActors "
                f"({original.__module__}.create_advantage_actors), whose mmpo/ metrics never "
                "reach the step's log: set async_rl.num_advantage_workers=0 (the advantage "
                f"stage in the controller) to train grpo.adv_estimator.name="
                f"{estimator.settings.name}"
            )
        return original(*args, **kwargs)

    return create_advantage_actors


def gpu_only_setup(original: Any) -> Any:
    """``setup_single_controller``: refused in one line on a Ray cluster without GPUs (before
    NeMo-RL's ``ResourceInsufficientError``), unless the CPU rig's answers are in place
    (:mod:`~nemo_mmpo.nemo_rl.run_state`)."""

    @functools.wraps(original)
    def setup_single_controller(*args: Any, **kwargs: Any) -> Any:
        import ray

        no_gpu = ray.is_initialized() and ray.cluster_resources().get("GPU", 0) < 1
        if no_gpu and not state.RUN.cpu_rig_answers_single_controller:
            raise MMPOInputError(
                "NeMo-RL's single controller (run_grpo_single_controller.py) cannot train on "
                "this Ray cluster, which has no GPU: it builds its clusters with use_gpus=True "
                "(single_controller_utils/setup.py:147, 184, 193), trains through "
                "MegatronPolicyWorker's CUDA-only split training API and generates with async "
                "vLLM only; on a CPU only nemo-mmpo's CPU rig answers those (a recipe with "
                "cpu_backend.enabled, e.g. examples/configs/mmpo_tiny_cpu_single_controller.yaml"
                "); train on GPUs, or use run_grpo.py (remove async_rl)"
            )
        return original(*args, **kwargs)

    return setup_single_controller


def ppo_estimator_factory(original: Any) -> Any:
    """PPO's factory: NeMo-RL's, our names refused."""
    return refusing(original, "master_config", ppo_estimator_problem(factory_names(original)))


def ppo_loss_factory(original: type) -> Any:
    """PPO's ``ClippedPGLossFn``: NeMo-RL's, our names refused."""
    return refusing(original, "cfg", ppo_loss_problem)
