"""``install()``: make NeMo-RL's GRPO build our estimators and loss, without a fork.

NeMo-RL has no registry for advantage estimators or losses: ``_create_advantage_estimator``
in ``nemo_rl.algorithms.grpo`` is an if/elif that raises on unknown names, and ``setup()``
constructs ``ClippedPGLossFn`` directly. Both are module globals looked up at call time, and
``grpo_sync`` / ``single_controller_utils.setup`` import them by name, so :func:`install`
wraps the name in each of those modules (:data:`HOOKED_MODULES`):

- ``_create_advantage_estimator``: our :class:`MMPOAdvantageEstimator` when
  ``grpo.adv_estimator.name`` is one of ours, NeMo-RL's own otherwise;
- ``ClippedPGLossFn``: our loss when ``loss_fn.name`` is ``mmpo`` or ``dmpo``, NeMo-RL's
  otherwise;
- ``_log_mixed_rewards_and_advantages_information``: also adds the step metrics of the
  estimator the factory hook built last (the synchronous trainers call it right after
  ``compute_advantage``, and ignore ``last_metrics``);
- ``_apply_configured_message_level_advantage_penalties`` (called by ``grpo_train`` and
  ``async_grpo_train`` with the training batch, after advantages and ``prev_logprobs``): with
  ``loss_fn.name: dmpo``, also adds DMPO's per-response penalty terms to the batch and the
  ``dmpo/`` metrics to the step (:mod:`nemo_mmpo.nemo_rl.dmpo_batch_terms`);
- ``validate``: with ``evaluation.enabled`` and ``evaluation.in_loop``, the paper's evaluation
  protocol instead of NeMo-RL's validation (:mod:`nemo_mmpo.nemo_rl.evaluation`); NeMo-RL's
  otherwise.

Where NeMo-RL's ``MasterConfig`` lists its own estimator names as a ``Literal`` (pull request
#3773), our names are added to it (:mod:`nemo_mmpo.nemo_rl.literal_names`), so that
``run_grpo.py``'s ``MasterConfig(**config)`` keeps accepting ``name: mmpo``.
It also puts this package on ``PYTHONPATH`` for NeMo-RL's Ray workers, which unpickle our loss.
Idempotent; raises with the installed NeMo-RL version if a hook point has moved. The wrappers
read the arguments they need by name (bound to the original's signature); the one state they
share is the estimator the factory hook built last (held weakly), whose metrics the logging
hook takes.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import weakref
from pathlib import Path
from typing import Any

from nemo_mmpo.checkout import REPO_ROOT
from nemo_mmpo.nemo_rl import dmpo_batch_terms as dmpo
from nemo_mmpo.nemo_rl import sections
from nemo_mmpo.nemo_rl.advantage_estimator import MMPOAdvantageEstimator
from nemo_mmpo.nemo_rl.estimator_settings import is_our_estimator
from nemo_mmpo.nemo_rl.evaluation import in_loop_settings, validate_in_loop
from nemo_mmpo.nemo_rl.literal_names import accept_our_estimator_names

SUPPORTED = "NeMo-RL v0.6.0 or newer (tested: v0.7.0 and main)"
HOOKED_MODULES = (
    "nemo_rl.algorithms.grpo",
    "nemo_rl.algorithms.grpo_sync",
    "nemo_rl.algorithms.single_controller_utils.setup",
)
MARK = "_nemo_mmpo_original"
#: The estimator the factory hook built last (None: NeMo-RL's own): where the logging hook
#: reads the step's metrics.
_built_estimator: weakref.ref[MMPOAdvantageEstimator] | None = None


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


def _estimator_factory(original: Any) -> Any:
    @functools.wraps(original)
    def create_advantage_estimator(*args: Any, **kwargs: Any) -> Any:
        global _built_estimator
        master_config = _arguments(original, args, kwargs)["master_config"]
        estimator_config = sections.value(master_config, "grpo.adv_estimator")
        _built_estimator = None
        if is_our_estimator(sections.value(estimator_config, "name")):
            estimator = MMPOAdvantageEstimator(
                estimator_config, sections.value(master_config, "loss_fn")
            )
            print(f"  ✓ Using nemo-mmpo advantage estimator: {estimator.settings.describe()}")
            _built_estimator = weakref.ref(estimator)
            return estimator
        return original(*args, **kwargs)

    setattr(create_advantage_estimator, MARK, original)
    return create_advantage_estimator


def _loss_factory(original: type) -> Any:
    from nemo_mmpo.nemo_rl.loss import build_loss  # imports nemo_rl: only once NeMo-RL is hooked

    @functools.wraps(original, updated=())
    def clipped_pg_loss(cfg: Any, *args: Any, **kwargs: Any) -> Any:
        return build_loss(original, cfg, *args, **kwargs)

    setattr(clipped_pg_loss, MARK, original)
    return clipped_pg_loss


def _metrics_logger(original: Any) -> Any:
    @functools.wraps(original)
    def log_rewards_and_advantages(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        estimator = built_estimator()
        step_metrics = estimator.take_step_metrics() if estimator is not None else {}
        metrics = _arguments(original, args, kwargs).get("metrics")
        if isinstance(metrics, dict) and step_metrics:
            # NeMo-RL sums each list-valued step metric over micro-batches and prints
            # "Skipping aggregation" for scalars: a one-element list aggregates to the value.
            metrics.update({key: [value] for key, value in step_metrics.items()})
        return result

    setattr(log_rewards_and_advantages, MARK, original)
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

    setattr(apply_penalties, MARK, original)
    return apply_penalties


def _validation(original: Any) -> Any:
    @functools.wraps(original)
    def validate(*args: Any, **kwargs: Any) -> Any:
        arguments = _arguments(original, args, kwargs)
        settings = in_loop_settings(arguments["master_config"])
        if settings is None:
            return original(*args, **kwargs)
        return validate_in_loop(arguments["policy_generation"], arguments["step"], settings)

    setattr(validate, MARK, original)
    return validate


HOOKS = {
    "_create_advantage_estimator": _estimator_factory,
    "ClippedPGLossFn": _loss_factory,
    "_log_mixed_rewards_and_advantages_information": _metrics_logger,
    "_apply_configured_message_level_advantage_penalties": _batch_penalties,
    "validate": _validation,
}
#: Hook points every supported NeMo-RL has; the others are hooked where present (DMPO needs
#: the last one and says so when it is missing).
REQUIRED_HOOKS = (
    "_create_advantage_estimator",
    "ClippedPGLossFn",
    "_log_mixed_rewards_and_advantages_information",
)


def _import(name: str, required: bool) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if not required and error.name is not None and name.startswith(error.name):
            return None  # this NeMo-RL version has no such module
        raise _hook_error(f"importing {name} failed ({error!r})") from error
    except Exception as error:  # a broken dependency (e.g. antlr4 4.13 breaking hydra)
        raise _hook_error(
            f"importing {name} failed ({error!r}); check that NeMo-RL's own environment is "
            "intact (for example `uv run --project $NEMO_RL_PATH python -c 'import nemo_rl."
            "algorithms.grpo'`)"
        ) from error


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
    """Hook our estimators and loss into NeMo-RL's GRPO.

    Safe to call many times. Call it in the driver before NeMo-RL starts Ray.

    Args:
        loss: also hook ``ClippedPGLossFn`` (needed when NeMo-RL's ``setup()`` builds the
            loss, as in its ``run_grpo.py``). A driver that passes
            ``MMPOClippedPGLossFn(master_config.loss_fn)`` to ``grpo_train`` itself can use
            ``install(loss=False)``.

    Returns:
        Every ``module.attribute`` of NeMo-RL that is hooked after the call (those hooked by an
        earlier call included).

    Raises:
        RuntimeError: NeMo-RL fails to import, its GRPO module lacks a hook point, or Ray is
            already running without nemo_mmpo on the workers' ``PYTHONPATH``.
    """
    grpo = _import("nemo_rl.algorithms.grpo", required=True)
    for attribute in REQUIRED_HOOKS:
        if not hasattr(grpo, attribute):
            raise _hook_error(f"nemo_rl.algorithms.grpo has no attribute {attribute!r}")
    _reach_ray_workers()
    hooked = []
    for module_name in HOOKED_MODULES:
        module = grpo if module_name == grpo.__name__ else _import(module_name, required=False)
        if module is None:
            continue
        if isinstance(getattr(module, "MasterConfig", None), type):
            accept_our_estimator_names(module.MasterConfig)
        for attribute, make_wrapper in HOOKS.items():
            current = getattr(module, attribute, None)
            if current is None or (attribute == "ClippedPGLossFn" and not loss):
                continue
            if not hasattr(current, MARK):
                setattr(module, attribute, make_wrapper(current))
            hooked.append(f"{module_name}.{attribute}")
    return hooked


def is_installed() -> bool:
    """Whether NeMo-RL's GRPO currently builds our estimators."""
    try:
        grpo = importlib.import_module("nemo_rl.algorithms.grpo")
    except Exception:
        return False
    return hasattr(getattr(grpo, "_create_advantage_estimator", None), MARK)
