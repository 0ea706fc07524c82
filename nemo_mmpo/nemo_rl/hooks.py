"""``install()``: make NeMo-RL's GRPO trainers build our estimators and loss, without a fork.

NeMo-RL has no registry for estimators or losses (its factory is an if/elif, ``setup()`` builds
``ClippedPGLossFn`` itself), and each trainer imports those names, so :func:`install` wraps each
name in each module that calls it: :data:`HOOKS` is that table, per trainer (the replacements:
:mod:`~nemo_mmpo.nemo_rl.wrappers`). Before wrapping anything it checks NeMo-RL's side of the
contract (:mod:`~nemo_mmpo.nemo_rl.contract`) and refuses in one error; it adds our names where
NeMo-RL's config lists its own as a ``Literal`` (:mod:`~nemo_mmpo.nemo_rl.newer_nemo_rl`) and
puts this package on the Ray workers' ``PYTHONPATH``. Idempotent. What each hook does and why,
and what is refused: docs/integration.md.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from nemo_mmpo.checkout import find_nemo_rl_root, worker_pythonpath
from nemo_mmpo.losses import loss_names
from nemo_mmpo.nemo_rl import wrappers
from nemo_mmpo.nemo_rl.actor_hooks import (
    ACTOR_WRAPPERS,
    HOOKED_IN,
    MARK,
    SINGLE_CONTROLLER_ACTOR,
    STAGE_WRAPPERS,
    chunked_metrics_reducer,
    first_step_checks,
)
from nemo_mmpo.nemo_rl.contract import (
    SUPPORTED,
    called_in,
    estimator_clashes,
    local_importers,
    loss_clashes,
    nemo_rl_version,
    path_problems,
    section,
    stray_references,
    version_problem,
)
from nemo_mmpo.nemo_rl.estimator_settings import estimator_names
from nemo_mmpo.nemo_rl.newer_nemo_rl import accept_our_estimator_names, unreachable_literal
from nemo_mmpo.nemo_rl.refusals import (
    batch_terms_refused,
    in_master_config,
    single_controller_problem,
)
from nemo_mmpo.plugins import load_from_environment
from nemo_mmpo.registry import freeze

GRPO = "nemo_rl.algorithms.grpo"
GRPO_SYNC = "nemo_rl.algorithms.grpo_sync"
SINGLE_CONTROLLER = "nemo_rl.algorithms.single_controller_utils.setup"
#: the package whose ``setup_single_controller`` ``run_grpo_single_controller.py`` imports
SINGLE_CONTROLLER_PACKAGE = "nemo_rl.algorithms.single_controller_utils"
PPO = "nemo_rl.algorithms.ppo"
#: NeMo-RL's pool of advantage actors (after our snapshot: ``async_rl.num_advantage_workers``)
ADVANTAGE_ACTORS = "nemo_rl.algorithms.advantage_actor"
#: the loss config model NeMo-RL's ``ClippedPGLossFn`` is built from
LOSS_CONFIG = ("nemo_rl.algorithms.loss", "ClippedPGLossConfig")


def _hook_error(detail: str) -> RuntimeError:
    return RuntimeError(
        f"nemo-mmpo cannot install into NeMo-RL {nemo_rl_version()}: {detail}. "
        f"nemo-mmpo supports {SUPPORTED}; please report the NeMo-RL version in an issue"
    )


# --- the hook points -------------------------------------------------------------------------
@dataclass(frozen=True)
class Hook:
    """One name :func:`install` replaces in one NeMo-RL module.

    ``wrap(original)`` returns the replacement, which reads the parameters ``reads`` by name;
    ``callers``: the trainers (functions, or ``Class.method``) that must call it by that name;
    ``answers_ours``: it answers our ``"estimator"`` or ``"loss"`` names before NeMo-RL, which
    must not build anything under them; ``required``: a module without the name is refused
    (otherwise a recipe that needs it is refused before the first step).

    ``follow``: the modules where the name is hooked too; a function of this module that imports
    the name from one of them inside its body (as the single controller's
    ``_build_advantage_estimator`` does in some NeMo-RL versions) is hooked with ``follow_wrap``,
    which gives the call this module's terms; one importing it from elsewhere is refused.
    """

    wrap: Callable[[Any], Any]
    reads: tuple[str, ...]
    callers: tuple[str, ...] = ()
    answers_ours: str = ""
    required: bool = True
    follow: tuple[str, ...] = ()
    follow_wrap: Callable[[Any], Any] | None = None


_TRAINERS = ("grpo_train", "async_grpo_train")
SYNC, SINGLE = wrappers.SYNC_TRAINER, wrappers.SINGLE_CONTROLLER_TRAINER
#: ``{module: {name: hook}}``; only the ``grpo`` module must exist.
HOOKS: dict[str, dict[str, Hook]] = {
    GRPO: {
        "_create_advantage_estimator": Hook(
            wrappers.estimator_factory, ("master_config",), _TRAINERS, "estimator"
        ),
        "ClippedPGLossFn": Hook(wrappers.loss_factory, ("cfg",), ("setup",), "loss"),
        "_log_mixed_rewards_and_advantages_information": Hook(
            wrappers.metrics_logger, ("metrics",), ("grpo_train",)
        ),
        # DMPO needs this one: grpo_train and async_grpo_train refuse DMPO where it is missing
        "_apply_configured_message_level_advantage_penalties": Hook(
            wrappers.batch_penalties, ("train_data", "master_config"), _TRAINERS, required=False
        ),
        # evaluation.in_loop needs this one (refused likewise where it is missing)
        "validate": Hook(
            wrappers.validation,
            ("policy_generation", "step", "master_config"),
            _TRAINERS,
            required=False,
        ),
        "grpo_train": Hook(wrappers.grpo_trainer, ("policy", "loss_fn", "logger", "master_config")),
        "async_grpo_train": Hook(
            wrappers.grpo_trainer, ("policy", "loss_fn", "logger", "master_config")
        ),
    },
    GRPO_SYNC: {
        # grpo_train_sync never calls the penalties hook: a loss with per-batch terms refused
        "_create_advantage_estimator": Hook(
            partial(
                wrappers.estimator_factory, problem=in_master_config(batch_terms_refused(SYNC))
            ),
            ("master_config",),
            ("grpo_train_sync",),
            "estimator",
        ),
        "_log_mixed_rewards_and_advantages_information": Hook(
            wrappers.metrics_logger, ("metrics",), ("grpo_train_sync",)
        ),
        "grpo_train_sync": Hook(
            wrappers.sync_trainer, ("policy", "policy_generation", "logger", "master_config")
        ),
        "validate_sync": Hook(
            wrappers.sync_validation, ("step", "master_config"), ("grpo_train_sync",), "", False
        ),
    },
    SINGLE_CONTROLLER: {
        # imported from grpo and called by setup_single_controller; where NeMo-RL imports it
        # from grpo or ppo inside _build_advantage_estimator, that function is hooked instead
        # called once per streaming chunk in the controller's actor; no penalties hook, no
        # validation: per-batch terms and evaluation.in_loop refused (with install(loss=False) too)
        "_create_advantage_estimator": Hook(
            partial(
                wrappers.estimator_factory,
                problem=single_controller_problem(SINGLE),
                streaming_chunks=True,
            ),
            ("master_config",),
            ("setup_single_controller",),
            "estimator",
            follow=(GRPO, PPO, GRPO_SYNC),
            follow_wrap=wrappers.single_controller_builder,
        ),
        "ClippedPGLossFn": Hook(
            partial(wrappers.loss_factory, problem=batch_terms_refused(SINGLE)),
            ("cfg",),
            ("setup_single_controller",),
            "loss",
        ),
        # where NeMo-RL has a pool of advantage actors: refused for our estimators
        "create_advantage_actors": Hook(
            wrappers.advantage_actor_pool, ("advantage_estimator",), required=False
        ),
    },
    ADVANTAGE_ACTORS: {
        "create_advantage_actors": Hook(
            wrappers.advantage_actor_pool, ("advantage_estimator",), required=False
        ),
    },
    SINGLE_CONTROLLER_ACTOR: {
        "reduce_advantage_pump_metrics": Hook(
            chunked_metrics_reducer, (), ("SingleControllerActor._train_pump",)
        ),
    },
    SINGLE_CONTROLLER_PACKAGE: {
        "setup_single_controller": Hook(wrappers.gpu_only_setup, ()),
    },
    PPO: {
        "_create_advantage_estimator": Hook(
            wrappers.ppo_estimator_factory, ("master_config",), ("ppo_train",)
        ),
        "ClippedPGLossFn": Hook(wrappers.ppo_loss_factory, ("cfg",), ("setup",)),
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


#: NeMo-RL's full default GRPO config in its checkout (the clash probe's second config)
DEFAULT_CONFIG = Path("examples") / "configs" / "grpo_math_1B.yaml"


def _nemo_rl_default_config() -> tuple[Callable[[str], Any] | None, str]:
    """``(config for an estimator name, where it was read)``: NeMo-RL's own full default GRPO
    config (:data:`DEFAULT_CONFIG`, loaded with its own loader and resolvers) with
    ``grpo.adv_estimator.name`` set; ``(None, "")`` where there is no checkout or it fails to
    load (the probe then refuses a factory that fails on the minimal config)."""
    root = find_nemo_rl_root()
    if root is None or not (root / DEFAULT_CONFIG).is_file():
        return None, ""
    try:
        from nemo_rl.utils import config as nemo_rl_config
        from omegaconf import OmegaConf

        nemo_rl_config.register_omegaconf_resolvers()
        loaded = nemo_rl_config.load_config(str(root / DEFAULT_CONFIG))
        values = OmegaConf.to_container(loaded, resolve=True)
    except Exception:
        return None, ""

    def config_for(name: str) -> Any:
        config = section(values)
        for algorithm in ("grpo", "ppo"):
            if isinstance(config.get(algorithm), dict):
                config[algorithm].setdefault("adv_estimator", section({}))["name"] = name
        return config

    return config_for, str(DEFAULT_CONFIG)


def _clashes(where: str, original: Any, answers_ours: str) -> list[str]:
    """NeMo-RL building something under one of our names, found by calling ``original``."""
    if answers_ours == "estimator":
        found = estimator_clashes(original, estimator_names(), _nemo_rl_default_config)
        kind = "estimator"
    else:
        config_type = getattr(sys.modules.get(LOSS_CONFIG[0]), LOSS_CONFIG[1], None)
        found = loss_clashes(original, config_type, loss_names())
        kind = "loss_fn.name"
    return [
        f"{where} {what}"
        if not name
        else f"{where}, asked for {kind} {name!r} "
        f"{'' if what.startswith('on ') else 'on a minimal config, '}{what}: NeMo-RL knows "
        f"{name!r} itself, and nemo-mmpo's hook, answering it first, would shadow NeMo-RL's "
        "without a word"
        for name, what in found.items()
    ]


def _contract_problems(module: Any, name: str, original: Any, hook: Hook) -> list[str]:
    """What in NeMo-RL's ``original`` breaks what ``hook`` relies on."""
    where = f"{module.__name__}.{name}"
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
    problems += path_problems(module, name, original, hook.callers)
    if hook.answers_ours:
        problems += _clashes(where, original, hook.answers_ours)
    return problems


def _followed(module: Any, name: str, hook: Hook) -> tuple[list, list[str]]:
    """The functions of ``module`` that import ``name`` inside their body (:data:`Hook.follow`),
    as hook points, and what breaks the contract there: an import from a module where ``name``
    is not hooked (the function would reach NeMo-RL's original), a function of another name
    under its name, or one no function of the module calls by its name."""
    points, problems = [], []
    for function, sources in sorted(local_importers(module, name).items()):
        where = f"{module.__name__}.{function}"
        unhooked = sorted(set(sources) - set(hook.follow))
        if unhooked:
            problems.append(
                f"{where} imports {name} from {', '.join(unhooked)}, where nemo-mmpo does not "
                f"hook it (only in {', '.join(hook.follow)}): it would build NeMo-RL's "
                "estimator past nemo-mmpo's hook"
            )
        current = getattr(module, function, None)
        if current is None or hook.follow_wrap is None:
            continue
        original = getattr(current, MARK, current)
        follower = Hook(hook.follow_wrap, ("master_config",))
        problems += _contract_problems(module, function, original, follower)
        if not called_in(module, function):
            problems.append(
                f"no function of {module.__name__} calls {function} by that name (renamed, "
                "called through a module, or not called): nemo-mmpo's hook would never run"
            )
        points.append((module, function, original, follower))
    return points, problems


def _first_step_problems(module: Any) -> list[str]:
    """What keeps the single controller's actor from its first-step checks, which are wrapped in
    that process only (:func:`~nemo_mmpo.nemo_rl.actor_hooks.first_step_checks`: in the
    controller's ``module``, and in the stage's own module where NeMo-RL has one): a name
    missing, not called by its method, or without a parameter its wrapper reads."""
    problems = []
    for module_name, checks in first_step_checks().items():
        checked = module if module_name == module.__name__ else _import(module_name, True)
        wrappers_here = ACTOR_WRAPPERS if checked is module else STAGE_WRAPPERS
        for name, (caller, reads) in checks.items():
            current = getattr(checked, name, None)
            if current is None:
                problems.append(
                    f"{checked.__name__} has no attribute {name!r}, which nemo-mmpo wraps in "
                    "the SingleControllerActor's process to check its first step"
                )
                continue
            check = Hook(wrappers_here[name], reads, (caller,))
            original = getattr(current, MARK, current)
            problems += _contract_problems(checked, name, original, check)
    return problems


def _hook_points(loss: bool) -> list[tuple[Any, str, Any, Hook]]:
    """``(module, name, NeMo-RL's original, hook)`` for every name to hook; raises one error
    listing every break of the contract, before anything is wrapped."""
    problem = version_problem(nemo_rl_version())
    if problem is not None:
        raise _hook_error(problem)
    points, problems, left = [], [], []
    for module_name, hooks in HOOKS.items():
        module = _import(module_name, required=module_name == GRPO)
        if module is None:
            continue
        for name, hook in hooks.items():
            if name == "ClippedPGLossFn" and not loss and module_name != PPO:
                left.append((module_name, name))
                continue
            current = getattr(module, name, None)
            followed, trouble = _followed(module, name, hook) if hook.follow else ([], [])
            points += followed
            problems += trouble
            if current is None:
                if hook.required and not followed:
                    problems.append(
                        f"{module_name} has no attribute {name!r}"
                        + (", and none of its functions imports it" if hook.follow else "")
                    )
                continue
            original = getattr(current, MARK, current)
            problems += _contract_problems(module, name, original, hook)
            points.append((module, name, original, hook))
        if module_name == SINGLE_CONTROLLER_ACTOR:
            problems += _first_step_problems(module)
    problems += stray_references(
        ((module.__name__, name, original) for module, name, original, _ in points), left
    )
    if problems:
        raise _hook_error("; ".join(problems))
    return points


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
    """Hook our estimators and loss into NeMo-RL's trainers (docs/integration.md).

    Safe to call many times. Call it in the driver before NeMo-RL starts Ray.

    Args:
        loss: also hook ``ClippedPGLossFn`` in the GRPO trainers (needed when NeMo-RL's
            ``setup()`` builds the loss, as in its ``run_grpo.py``). A driver that passes
            ``MMPOClippedPGLossFn(master_config.loss_fn)`` to ``grpo_train`` itself can use
            ``install(loss=False)``. PPO's is hooked either way (it refuses our names).

    Returns:
        Every ``module.attribute`` of NeMo-RL hooked after the call (earlier calls included).

    Raises:
        RuntimeError: NeMo-RL fails to import or breaks the contract (docs/integration.md), or
            Ray runs without nemo_mmpo on the workers' ``PYTHONPATH``. Nothing is hooked then.
    """
    load_from_environment()  # the run's plug-ins (nemo_mmpo.plugins) and entry points
    points = _hook_points(loss)
    _accept_names_in_every_master_config({module for module, *_ in points})
    _reach_ray_workers()
    hooked = _wrap(points)
    freeze("nemo_mmpo.nemo_rl.install()")  # the workers see what the driver registered
    return hooked


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
    :mod:`~nemo_mmpo.nemo_rl.newer_nemo_rl`); raises one error where a ``Literal`` ``name``
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
