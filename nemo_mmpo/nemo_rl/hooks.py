"""``install()``: make NeMo-RL's GRPO build our estimators and loss, without a fork.

NeMo-RL has no registry for advantage estimators or losses: ``_create_advantage_estimator``
in ``nemo_rl.algorithms.grpo`` is an if/elif that raises on unknown names, and ``setup()``
constructs ``ClippedPGLossFn`` directly. Both are module globals looked up at call time, and
the other trainers import them by name, so :func:`install` wraps the name in each module that
calls it (:data:`HOOKS`, per trainer; line numbers main / v0.7.0):

- ``grpo`` (``grpo_train``, ``async_grpo_train``):

  - ``_create_advantage_estimator`` (grpo.py:2249 / :1773): our
    :class:`MMPOAdvantageEstimator` when ``grpo.adv_estimator.name`` is one of ours, NeMo-RL's
    own otherwise;
  - ``ClippedPGLossFn`` (built in ``setup()``, grpo.py:695 / :426): our loss when
    ``loss_fn.name`` is ``mmpo`` or ``dmpo``, NeMo-RL's otherwise;
  - ``_log_mixed_rewards_and_advantages_information`` (grpo.py:2430 / :1972): also adds the step
    metrics of the estimator the factory hook built last (the synchronous trainers call it
    right after ``compute_advantage``, and ignore ``last_metrics``);
  - ``_apply_configured_message_level_advantage_penalties`` (grpo.py:2095 / :1626, called by
    ``grpo_train`` and ``async_grpo_train`` with the training batch, after advantages and
    ``prev_logprobs``): with ``loss_fn.name: dmpo``, also adds DMPO's per-response penalty terms
    to the batch and the ``dmpo/`` metrics to the step (:mod:`nemo_mmpo.nemo_rl.dmpo_batch_terms`);
  - ``validate`` (grpo.py:3822 / :3139): with ``evaluation.enabled`` and ``evaluation.in_loop``,
    the paper's evaluation protocol instead of NeMo-RL's validation
    (:mod:`nemo_mmpo.nemo_rl.evaluation`); NeMo-RL's otherwise.

- ``grpo_sync`` (``grpo_train_sync``, ``data_plane.enabled: true``): the factory and the metrics
  as above (the factory refuses ``loss_fn.name: dmpo``: this trainer never calls the penalties
  hook, grpo_sync.py:92 / :89); ``grpo_train_sync`` (:380 / :371) to know its generation engine,
  and ``validate_sync`` (:236 / :226, called at :510 and :1016) as ``validate`` above.
- ``single_controller_utils.setup`` (main only): the factory (setup.py:784) as above, building
  the estimator with ``streaming_chunks=True``, and ``ClippedPGLossFn`` (:787), which refuses
  ``dmpo`` (the single controller never calls the penalties hook).
- ``single_controller`` (main only): ``reduce_advantage_pump_metrics`` (single_controller.py:1074,
  once per step inside the ``SingleControllerActor``, after the step's chunks): also adds the
  step's ``mmpo/`` metrics, combined over its chunks. The estimator is built on the driver and
  pickled into the actor, whose process ``install()`` never ran: unpickling it there applies
  this one hook in that process (:mod:`~nemo_mmpo.nemo_rl.actor_hooks`), and it reads that
  estimator.
- ``single_controller_utils`` (main only): ``setup_single_controller``, as
  ``run_grpo_single_controller.py`` imports it: refused in one line on a Ray cluster without
  GPUs (what the single controller needs there is not answered on a CPU yet).
- ``ppo`` (``run_ppo.py``): ``ClippedPGLossFn`` (ppo.py:476 / :351) and
  ``_create_advantage_estimator`` (:1125 / :816) refuse our names: PPO's loop is not ours, and
  unhooked it would train NeMo-RL's loss under our name.

Before it wraps anything, :func:`install` checks NeMo-RL's side of the contract and refuses,
in one error naming NeMo-RL's version and the versions we support, when a module that exists
lacks a hook point, when a function lacks a parameter its wrapper reads by name
(``inspect.signature``), or when NeMo-RL's own estimator factory already compares
``name`` against one of our names (read from its source with :mod:`ast`). Refused, not renamed:
our factory answers first, so such a name would silently stop meaning NeMo-RL's estimator, and
renaming ours would silently change what existing recipes train; either way one name would
mean two estimators depending on the installed NeMo-RL.

Where NeMo-RL's ``MasterConfig`` lists its own estimator names as a ``Literal`` (pull request
#3773), our names are added to it (:mod:`nemo_mmpo.nemo_rl.literal_names`), and every
``MasterConfig`` holding it (``grpo``'s, the single controller's, whose ``grpo`` #3773 makes
optional beside ``ppo``) is rebuilt, so that ``run_grpo.py``'s and
``run_grpo_single_controller.py``'s ``MasterConfig(**config)`` keep accepting ``name: mmpo``;
where such a ``Literal`` sits where our names cannot be added, :func:`install` refuses.
It also puts this package on ``PYTHONPATH`` for NeMo-RL's Ray workers, which unpickle our loss.
Idempotent. The wrappers read the arguments they need by name (bound to the original's
signature); the state they share is the estimator the factory hook built last (held weakly),
whose metrics the logging hook takes, and the generation engine of the ``grpo_train_sync`` call
in progress, which ``validate_sync`` does not receive.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import os
import sys
import textwrap
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_mmpo.checkout import REPO_ROOT
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.nemo_rl import dmpo_batch_terms as dmpo
from nemo_mmpo.nemo_rl import sections
from nemo_mmpo.nemo_rl.actor_hooks import (
    HOOKED_IN,
    MARK,
    SINGLE_CONTROLLER_ACTOR,
    chunked_metrics_reducer,
)
from nemo_mmpo.nemo_rl.advantage_estimator import MMPOAdvantageEstimator
from nemo_mmpo.nemo_rl.estimator_settings import estimator_names, is_our_estimator
from nemo_mmpo.nemo_rl.evaluation import in_loop_settings, validate_in_loop
from nemo_mmpo.nemo_rl.literal_names import accept_our_estimator_names, unreachable_literal
from nemo_mmpo.nemo_rl.names import DMPO_LOSS, MMPO_LOSS

SUPPORTED = "NeMo-RL v0.6.0 or newer (tested: v0.7.0 and main)"
GRPO = "nemo_rl.algorithms.grpo"
GRPO_SYNC = "nemo_rl.algorithms.grpo_sync"
SINGLE_CONTROLLER = "nemo_rl.algorithms.single_controller_utils.setup"
#: the package whose ``setup_single_controller`` ``run_grpo_single_controller.py`` imports
SINGLE_CONTROLLER_PACKAGE = "nemo_rl.algorithms.single_controller_utils"
PPO = "nemo_rl.algorithms.ppo"
#: The estimator the factory hook built last (None: NeMo-RL's own): where the logging hook
#: reads the step's metrics.
_built_estimator: weakref.ref[MMPOAdvantageEstimator] | None = None
#: The generation engine of the ``grpo_train_sync`` call in progress (``validate_sync`` samples
#: through NeMo-RL's rollout actor and is not given it).
_sync_generation: Any = None


def _nemo_rl_version() -> str:
    try:
        import nemo_rl

        return str(getattr(nemo_rl, "__version__", "unknown"))
    except Exception:
        return "not importable"


def _hook_error(detail: str) -> RuntimeError:
    return RuntimeError(
        f"nemo-mmpo cannot install into NeMo-RL {_nemo_rl_version()}: {detail}. "
        f"nemo-mmpo supports {SUPPORTED}; please report the NeMo-RL version in an issue"
    )


def _arguments(original: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by parameter name, as ``original`` would receive them."""
    bound = inspect.signature(original).bind(*args, **kwargs)
    return dict(bound.arguments)


def built_estimator() -> MMPOAdvantageEstimator | None:
    """The estimator NeMo-RL's factory built last, when it was ours (and is still alive)."""
    return None if _built_estimator is None else _built_estimator()


#: ``problem(config) -> message or None``: why our setting cannot run in a trainer
Problem = Callable[[Any], "str | None"]


def _refuse(problem: Problem | None, config: Any) -> None:
    message = None if problem is None else problem(config)
    if message is not None:
        raise MMPOInputError(message)


# --- the wrappers: each takes NeMo-RL's function and returns its replacement -----------------
def _estimator_factory(
    original: Any, problem: Problem | None = None, streaming_chunks: bool = False
) -> Any:
    @functools.wraps(original)
    def create_advantage_estimator(*args: Any, **kwargs: Any) -> Any:
        global _built_estimator
        master_config = _arguments(original, args, kwargs)["master_config"]
        _refuse(problem, master_config)
        estimator_config = sections.value(master_config, "grpo.adv_estimator")
        _built_estimator = None
        if is_our_estimator(sections.value(estimator_config, "name")):
            estimator = MMPOAdvantageEstimator(
                estimator_config,
                sections.value(master_config, "loss_fn"),
                streaming_chunks=streaming_chunks,
            )
            print(f"  ✓ Using nemo-mmpo advantage estimator: {estimator.settings.describe()}")
            _built_estimator = weakref.ref(estimator)
            return estimator
        return original(*args, **kwargs)

    return create_advantage_estimator


def _loss_factory(original: type, problem: Problem | None = None) -> Any:
    from nemo_mmpo.nemo_rl.loss import build_loss  # imports nemo_rl: only once NeMo-RL is hooked

    @functools.wraps(original, updated=())
    def clipped_pg_loss(*args: Any, **kwargs: Any) -> Any:
        _refuse(problem, _arguments(original, args, kwargs)["cfg"])
        return build_loss(original, *args, **kwargs)

    return clipped_pg_loss


def _refusing(original: Any, parameter: str, problem: Problem) -> Any:
    """NeMo-RL's ``original``, unless ``problem`` refuses its argument ``parameter``."""

    @functools.wraps(original, updated=())
    def refuse_or_call(*args: Any, **kwargs: Any) -> Any:
        _refuse(problem, _arguments(original, args, kwargs)[parameter])
        return original(*args, **kwargs)

    return refuse_or_call


def _metrics_logger(original: Any) -> Any:
    @functools.wraps(original)
    def log_rewards_and_advantages(*args: Any, **kwargs: Any) -> Any:
        metrics = _arguments(original, args, kwargs)["metrics"]
        result = original(*args, **kwargs)
        estimator = built_estimator()
        step_metrics = estimator.take_step_metrics() if estimator is not None else {}
        if step_metrics:
            # NeMo-RL sums each list-valued step metric over micro-batches and prints
            # "Skipping aggregation" for scalars: a one-element list aggregates to the value.
            metrics.update({key: [value] for key, value in step_metrics.items()})
        return result

    return log_rewards_and_advantages


def _batch_penalties(original: Any) -> Any:
    @functools.wraps(original)
    def apply_penalties(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        arguments = _arguments(original, args, kwargs)
        loss_config = sections.value(arguments["master_config"], "loss_fn")
        if not dmpo.is_dmpo_loss(loss_config):
            return result
        metrics = dmpo.attach_penalty_terms(
            arguments["train_data"], dmpo.read_dmpo_settings(loss_config)
        )
        # NeMo-RL merges these into the step metrics and sums list values (see above).
        return {**(result or {}), **{key: [value] for key, value in metrics.items()}}

    return apply_penalties


def _validation(original: Any) -> Any:
    @functools.wraps(original)
    def validate(*args: Any, **kwargs: Any) -> Any:
        arguments = _arguments(original, args, kwargs)
        settings = in_loop_settings(arguments["master_config"])
        if settings is None:
            return original(*args, **kwargs)
        return validate_in_loop(arguments["policy_generation"], arguments["step"], settings)

    return validate


def _sync_trainer(original: Any) -> Any:
    """``grpo_train_sync`` (grpo_sync.py:380 / :371): NeMo-RL's, its generation engine
    remembered for the call (for :func:`_sync_validation`)."""

    @functools.wraps(original)
    def grpo_train_sync(*args: Any, **kwargs: Any) -> Any:
        global _sync_generation
        _sync_generation = _arguments(original, args, kwargs)["policy_generation"]
        try:
            return original(*args, **kwargs)
        finally:
            _sync_generation = None

    return grpo_train_sync


def _sync_validation(original: Any) -> Any:
    """``validate_sync`` (grpo_sync.py:236 / :226; called at :510 and :1016 / :506 and :979,
    which unpack ``(metrics, timings)``): the paper's evaluation with ``evaluation.in_loop``,
    as :func:`_validation`; NeMo-RL's otherwise."""

    @functools.wraps(original)
    def validate_sync(*args: Any, **kwargs: Any) -> Any:
        arguments = _arguments(original, args, kwargs)
        settings = in_loop_settings(arguments["master_config"])
        if settings is None:
            return original(*args, **kwargs)
        if _sync_generation is None:
            raise MMPOInputError(
                "evaluation.in_loop=true: NeMo-RL's validate_sync was called outside the hooked "
                "grpo_train_sync, so the generation engine to evaluate is unknown: call "
                "nemo_mmpo.nemo_rl.install() before importing grpo_train_sync, or set "
                "evaluation.in_loop=false"
            )
        return validate_in_loop(_sync_generation, arguments["step"], settings)

    return validate_sync


# --- what our settings cannot train, per trainer -----------------------------------------------
def _dmpo_refused(trainer: str) -> Problem:
    """``loss_fn.name: dmpo`` in a trainer that never calls the penalties hook."""

    def problem(loss_config: Any) -> str | None:
        if not dmpo.is_dmpo_loss(loss_config):
            return None
        return (
            f"loss_fn.name={DMPO_LOSS} cannot train in NeMo-RL's {trainer}: it never calls "
            "_apply_configured_message_level_advantage_penalties, where nemo-mmpo adds DMPO's "
            "batch terms. Use run_grpo.py with data_plane.enabled=false (grpo_train or "
            "async_grpo_train), or loss_fn.name=mmpo"
        )

    return problem


def _in_master_config(problem: Problem) -> Problem:
    return lambda master_config: problem(sections.value(master_config, "loss_fn"))


def _ppo_loss_problem(loss_config: Any) -> str | None:
    name = sections.value(loss_config, "name")
    if name not in (MMPO_LOSS, DMPO_LOSS):
        return None
    return (
        f"loss_fn.name={name}: NeMo-RL's PPO (nemo_rl.algorithms.ppo, run_ppo.py) builds its "
        f"own ClippedPGLossFn and trains with a value model, which nemo-mmpo does not hook: it "
        f"would train NeMo-RL's loss under the name {name}. Train {name} with GRPO "
        "(nemo-mmpo train, or run_grpo.py after nemo_mmpo.nemo_rl.install()), or remove "
        "loss_fn.name from the PPO recipe"
    )


def _ppo_estimator_problem(nemo_rl_names: set[str]) -> Problem:
    def problem(master_config: Any) -> str | None:
        name = sections.value(master_config, "ppo.adv_estimator.name")
        if not is_our_estimator(name) or name in nemo_rl_names:
            return None
        return (
            f"ppo.adv_estimator.name={name}: nemo-mmpo's estimators are group-relative and "
            "hook GRPO's factory; NeMo-RL's PPO (nemo_rl.algorithms.ppo) builds "
            f"{', '.join(sorted(nemo_rl_names)) or 'its own estimators'} only. Train {name} "
            "with GRPO (grpo.adv_estimator.name in a GRPO recipe), or choose a PPO estimator"
        )

    return problem


def factory_names(factory: Any) -> set[str]:
    """The estimator names NeMo-RL's ``factory`` handles itself: the string constants its source
    compares with ``==``/``in`` (or matches in a ``case``); empty when its source is unreadable."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(factory)))
    except (OSError, TypeError, SyntaxError):
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and all(
            isinstance(op, ast.Eq | ast.In) for op in node.ops
        ):
            for side in (node.left, *node.comparators):
                items = side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
                names.update(
                    item.value
                    for item in items
                    if isinstance(item, ast.Constant) and isinstance(item.value, str)
                )
        elif isinstance(node, ast.MatchValue) and isinstance(node.value, ast.Constant):
            names.add(node.value.value)
    return names


# --- the hook points -------------------------------------------------------------------------
@dataclass(frozen=True)
class Hook:
    """One name :func:`install` replaces in one NeMo-RL module.

    ``wrap(original)`` returns the replacement, which reads the parameters ``reads`` of
    NeMo-RL's ``original`` by name; ``answers_ours``: it answers our estimator names before
    NeMo-RL's factory does, which must not know them; ``required``: a module without the name
    is refused (otherwise it is hooked where present).
    """

    wrap: Callable[[Any], Any]
    reads: tuple[str, ...]
    answers_ours: bool = False
    required: bool = True


def _sync_estimator_factory(original: Any) -> Any:
    """``grpo_sync``'s factory: ours, and DMPO refused (``grpo_train_sync`` never calls the
    penalties hook; NeMo-RL refuses message-level penalties there, grpo_sync.py:92 / :89)."""
    trainer = "grpo_train_sync (data_plane.enabled=true)"
    return _estimator_factory(original, _in_master_config(_dmpo_refused(trainer)))


def _single_controller_estimator_factory(original: Any) -> Any:
    """The single controller's factory (setup.py:784): ours, called once per streaming chunk
    in its actor (single_controller.py:1778), so its metrics combine over a step's chunks."""
    return _estimator_factory(original, streaming_chunks=True)


def _gpu_only_setup(original: Any) -> Any:
    """``setup_single_controller`` (run_grpo_single_controller.py:138): refused in one line on a
    Ray cluster without GPUs, where NeMo-RL's single controller cannot run (docs/integration.md:
    ``use_gpus=True`` at setup.py:147, 184, 193; the split training API's CUDA calls; async
    vLLM), before NeMo-RL's own ``ResourceInsufficientError``; NeMo-RL's otherwise."""

    @functools.wraps(original)
    def setup_single_controller(*args: Any, **kwargs: Any) -> Any:
        import ray

        if ray.is_initialized() and ray.cluster_resources().get("GPU", 0) < 1:
            raise MMPOInputError(
                "NeMo-RL's single controller (run_grpo_single_controller.py) cannot train on "
                "this Ray cluster, which has no GPU: it builds its clusters with use_gpus=True "
                "(single_controller_utils/setup.py:147, 184, 193), trains through "
                "MegatronPolicyWorker's CUDA-only split training API and generates with async "
                "vLLM only, which nemo-mmpo's CPU rig does not answer (docs/integration.md); "
                "train on GPUs, or use run_grpo.py (remove async_rl)"
            )
        return original(*args, **kwargs)

    return setup_single_controller


def _single_controller_loss_factory(original: type) -> Any:
    """The single controller's loss (setup.py:787): ours, and DMPO refused (it never calls the
    penalties hook)."""
    trainer = "single controller (run_grpo_single_controller.py)"
    return _loss_factory(original, _dmpo_refused(trainer))


def _ppo_estimator_factory(original: Any) -> Any:
    """PPO's factory (ppo.py:1125 / :816): NeMo-RL's, our names refused."""
    return _refusing(original, "master_config", _ppo_estimator_problem(factory_names(original)))


def _ppo_loss_factory(original: type) -> Any:
    """PPO's ``ClippedPGLossFn`` (ppo.py:476 / :351): NeMo-RL's, our names refused."""
    return _refusing(original, "cfg", _ppo_loss_problem)


_ESTIMATOR = Hook(_estimator_factory, ("master_config",), answers_ours=True)
_METRICS = Hook(_metrics_logger, ("metrics",))
#: ``{module: {name: hook}}``; only the ``grpo`` module must exist.
HOOKS: dict[str, dict[str, Hook]] = {
    GRPO: {
        "_create_advantage_estimator": _ESTIMATOR,
        "ClippedPGLossFn": Hook(_loss_factory, ("cfg",)),
        "_log_mixed_rewards_and_advantages_information": _METRICS,
        # DMPO needs this one and says so when it is missing (DMPOLossFn finds no terms)
        "_apply_configured_message_level_advantage_penalties": Hook(
            _batch_penalties, ("train_data", "master_config"), required=False
        ),
        "validate": Hook(
            _validation, ("policy_generation", "step", "master_config"), required=False
        ),
    },
    GRPO_SYNC: {
        "_create_advantage_estimator": Hook(
            _sync_estimator_factory, ("master_config",), answers_ours=True
        ),
        "_log_mixed_rewards_and_advantages_information": _METRICS,
        "grpo_train_sync": Hook(_sync_trainer, ("policy_generation",)),
        "validate_sync": Hook(_sync_validation, ("step", "master_config")),
    },
    SINGLE_CONTROLLER: {
        "_create_advantage_estimator": Hook(
            _single_controller_estimator_factory, ("master_config",), answers_ours=True
        ),
        "ClippedPGLossFn": Hook(_single_controller_loss_factory, ("cfg",)),
    },
    SINGLE_CONTROLLER_ACTOR: {
        "reduce_advantage_pump_metrics": Hook(chunked_metrics_reducer, ()),
    },
    SINGLE_CONTROLLER_PACKAGE: {
        "setup_single_controller": Hook(_gpu_only_setup, ()),
    },
    PPO: {
        "_create_advantage_estimator": Hook(_ppo_estimator_factory, ("master_config",)),
        "ClippedPGLossFn": Hook(_ppo_loss_factory, ("cfg",)),
    },
}


def _import(name: str, required: bool) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if not required and (name.startswith(missing) or missing.startswith("nemo_rl.")):
            return None  # this NeMo-RL version has no such module (or none it imports)
        raise _hook_error(f"importing {name} failed ({error!r})") from error
    except Exception as error:  # a broken dependency (e.g. antlr4 4.13 breaking hydra)
        raise _hook_error(
            f"importing {name} failed ({error!r}); check that NeMo-RL's own environment is "
            "intact (for example `uv run --project $NEMO_RL_PATH python -c 'import nemo_rl."
            "algorithms.grpo'`)"
        ) from error


def _contract_problems(module_name: str, name: str, original: Any, hook: Hook) -> list[str]:
    """What in NeMo-RL's ``original`` breaks what ``hook`` relies on."""
    where = f"{module_name}.{name}"
    try:
        parameters = inspect.signature(original).parameters
    except (TypeError, ValueError):
        return [f"{where} has no readable signature"]
    problems = [
        f"{where}({', '.join(parameters)}) has no parameter {parameter!r}, which nemo-mmpo's "
        "hook reads"
        for parameter in hook.reads
        if parameter not in parameters
    ]
    if hook.answers_ours:
        shadowed = sorted(factory_names(original) & set(estimator_names()))
        problems += [
            f"{where} builds its own estimator {estimator!r}, a name nemo-mmpo's factory hook "
            "answers first (it would shadow NeMo-RL's without a word)"
            for estimator in shadowed
        ]
    return problems


def _hook_points(loss: bool) -> list[tuple[Any, str, Any, Hook]]:
    """``(module, name, NeMo-RL's original, hook)`` for every name to hook; raises one error
    listing every break of the contract, before anything is wrapped."""
    points, problems = [], []
    for module_name, hooks in HOOKS.items():
        module = _import(module_name, required=module_name == GRPO)
        if module is None:
            continue
        for name, hook in hooks.items():
            if name == "ClippedPGLossFn" and not loss and module_name != PPO:
                continue
            current = getattr(module, name, None)
            if current is None:
                if hook.required:
                    problems.append(f"{module_name} has no attribute {name!r}")
                continue
            original = getattr(current, MARK, current)
            problems += _contract_problems(module_name, name, original, hook)
            points.append((module, name, original, hook))
    if problems:
        raise _hook_error("; ".join(problems))
    return points


def worker_pythonpath() -> str:
    """The directory that makes ``import nemo_mmpo`` work in NeMo-RL's Ray workers."""
    if REPO_ROOT.name not in ("site-packages", "dist-packages"):
        return str(REPO_ROOT)  # a source checkout: its root holds nemo_mmpo/ and nothing else
    # Installed into an environment: expose only our package, not the driver's site-packages.
    link_dir = Path(os.environ.get("NEMO_MMPO_WORKER_PATH", Path.home() / ".cache/nemo-mmpo/path"))
    link_dir.mkdir(parents=True, exist_ok=True)
    link = link_dir / "nemo_mmpo"
    target = REPO_ROOT / "nemo_mmpo"
    if not (link.is_symlink() and link.resolve() == target):
        if link.is_symlink():
            link.unlink()
        link.symlink_to(target, target_is_directory=True)
    return str(link_dir)


def _reach_ray_workers() -> str:
    """Put :func:`worker_pythonpath` on ``PYTHONPATH`` before NeMo-RL starts Ray.

    NeMo-RL's ``init_ray`` hands the driver's environment to every worker, so this is enough
    when :func:`install` runs first; if Ray is already up, the workers cannot be reached.
    """
    path = worker_pythonpath()
    entries = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    if path in entries:
        return path
    try:
        import ray

        ray_started = ray.is_initialized()
    except ImportError:
        ray_started = False
    if ray_started:
        raise RuntimeError(
            "nemo-mmpo: install() was called after Ray started, so NeMo-RL's workers cannot "
            "import nemo_mmpo to unpickle its loss. Call nemo_mmpo.nemo_rl.install() before "
            f"init_ray()/setup(), or export PYTHONPATH={path}{os.pathsep}$PYTHONPATH before "
            "starting the driver (and the Ray cluster)"
        )
    os.environ["PYTHONPATH"] = os.pathsep.join([path, *entries])
    return path


def install(loss: bool = True) -> list[str]:
    """Hook our estimators and loss into NeMo-RL's trainers (see the module's docstring).

    Safe to call many times. Call it in the driver before NeMo-RL starts Ray.

    Args:
        loss: also hook ``ClippedPGLossFn`` in the GRPO trainers (needed when NeMo-RL's
            ``setup()`` builds the loss, as in its ``run_grpo.py``). A driver that passes
            ``MMPOClippedPGLossFn(master_config.loss_fn)`` to ``grpo_train`` itself can use
            ``install(loss=False)``. PPO's is hooked either way (it refuses our names).

    Returns:
        Every ``module.attribute`` of NeMo-RL that is hooked after the call (those hooked by an
        earlier call included).

    Raises:
        RuntimeError: NeMo-RL fails to import; a trainer's module lacks a hook point or a
            parameter a hook reads; NeMo-RL's estimator factory knows one of our names; or Ray
            is already running without nemo_mmpo on the workers' ``PYTHONPATH``. Nothing is
            hooked then.
    """
    points = _hook_points(loss)
    _accept_names_in_every_master_config({module for module, *_ in points})
    _reach_ray_workers()
    return _wrap(points)


def _wrap(points: list[tuple[Any, str, Any, Hook]]) -> list[str]:
    hooked = []
    for module, name, original, hook in points:
        if getattr(getattr(module, name), HOOKED_IN, None) != module.__name__:
            wrapper = hook.wrap(original)
            setattr(wrapper, MARK, original)
            setattr(wrapper, HOOKED_IN, module.__name__)
            setattr(module, name, wrapper)
        hooked.append(f"{module.__name__}.{name}")
    return hooked


def _accept_names_in_every_master_config(modules: set[Any]) -> None:
    """Our names in each ``MasterConfig`` that holds ``grpo.adv_estimator`` (``grpo``'s, and the
    single controller's, which holds the same ``GRPOConfig``: each is rebuilt,
    :mod:`~nemo_mmpo.nemo_rl.literal_names`); raises one error where a ``Literal`` ``name``
    sits where our names cannot be added."""
    masters = {
        id(master): master
        for module in modules
        if isinstance(master := getattr(module, "MasterConfig", None), type)
    }
    config_module = sys.modules.get("nemo_rl.algorithms.single_controller_utils.config")
    if isinstance(master := getattr(config_module, "MasterConfig", None), type):
        masters.setdefault(id(master), master)
    problems = []
    for master in masters.values():
        accept_our_estimator_names(master)
        problem = unreachable_literal(master)
        if problem is not None:
            problems.append(f"{master.__module__}.{master.__qualname__}: {problem}")
    if problems:
        raise _hook_error("; ".join(problems))


def is_installed() -> bool:
    """Whether NeMo-RL's GRPO currently builds our estimators."""
    try:
        grpo = importlib.import_module(GRPO)
    except Exception:
        return False
    return hasattr(getattr(grpo, "_create_advantage_estimator", None), MARK)
