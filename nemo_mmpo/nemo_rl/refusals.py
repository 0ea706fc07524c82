"""What our settings cannot train, per NeMo-RL trainer: each check reads a config and returns the
one-line reason (or ``None``), which the hooks (:mod:`nemo_mmpo.nemo_rl.wrappers`) raise as
:class:`~nemo_mmpo.errors.MMPOInputError` before NeMo-RL builds anything. Also
:func:`factory_names`, the estimator names NeMo-RL's own factory handles, read from its source
(``install()`` refuses a NeMo-RL whose factory knows one of ours; PPO's refusal names them)."""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable
from typing import Any

from nemo_mmpo import sections
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.eval.in_loop import in_loop_settings
from nemo_mmpo.losses import loss_entry, loss_names
from nemo_mmpo.nemo_rl.actor_hooks import HOOKED_IN
from nemo_mmpo.nemo_rl.estimator_settings import is_our_estimator

#: ``problem(config) -> message or None``: why our setting cannot run in a trainer
Problem = Callable[[Any], "str | None"]


def refuse(problem: Problem | None, config: Any) -> None:
    message = None if problem is None else problem(config)
    if message is not None:
        raise MMPOInputError(message)


def batch_terms_entry(loss_config: Any) -> Any:
    """The registered loss of ``loss_fn`` when it has per-batch terms, else None."""
    entry = loss_entry(sections.value(loss_config, "name"))
    return entry if entry is not None and entry.batch_terms is not None else None


def batch_terms_refused(trainer: str) -> Problem:
    """A loss with per-batch terms (DMPO's) in a trainer that never calls the penalties hook."""

    def problem(loss_config: Any) -> str | None:
        entry = batch_terms_entry(loss_config)
        if entry is None:
            return None
        plain = [name for name in loss_names() if loss_entry(name).batch_terms is None]
        return (
            f"loss_fn.name={entry.name} cannot train in NeMo-RL's {trainer}: it never calls "
            f"{PENALTIES}, where nemo-mmpo adds that loss's per-batch terms. Use run_grpo.py "
            "with data_plane.enabled=false (grpo_train or async_grpo_train), or loss_fn.name="
            f"{' or '.join(plain)}"
        )

    return problem


#: the hook point that adds DMPO's batch terms in ``grpo_train`` and ``async_grpo_train``
PENALTIES = "_apply_configured_message_level_advantage_penalties"


def _hooked(module: Any, name: str) -> bool:
    return getattr(getattr(module, name, None), HOOKED_IN, None) == module.__name__


def _version() -> str:
    from nemo_mmpo.nemo_rl.contract import nemo_rl_version

    return nemo_rl_version()


#: NeMo-RL's setting (after our main snapshot) that runs validation on a background thread
OVERLAP_VALIDATION = "grpo.async_grpo.overlap_validation"


def trainer_problem(trainer: str, module: Any, loss: Any, validation: str) -> Problem:
    """What the recipe needs that NeMo-RL's ``trainer`` (in ``module``) cannot give it, checked
    before its first step: DMPO needs DMPO's loss to reach the trainer and the hooked penalties
    hook (``loss=None``: a trainer that never calls it, refused elsewhere); ``evaluation.in_loop``
    needs the hooked ``validation`` function, called in the loop (:data:`OVERLAP_VALIDATION`)."""

    def problem(master_config: Any) -> str | None:
        loss_config = sections.value(master_config, "loss_fn")
        version = _version()
        entry = batch_terms_entry(loss_config)
        if loss is not None and entry is not None:
            if not _hooked(module, PENALTIES):
                return (
                    f"loss_fn.name={entry.name}: NeMo-RL {version}'s {module.__name__} has no "
                    f"{PENALTIES}, where nemo-mmpo adds that loss's per-batch terms, so "
                    f"{trainer} would fail in its workers at step 1: use a NeMo-RL with it "
                    "(v0.7.0, main), or another loss_fn.name"
                )
            loss_class = entry.resolve_class()
            if not isinstance(loss, loss_class):
                return (
                    f"loss_fn.name={entry.name}, but the loss reaching NeMo-RL {version}'s "
                    f"{trainer} is {type(loss).__module__}.{type(loss).__qualname__}, not "
                    f"{loss_class.__qualname__}: it would train that loss while logging "
                    f"{entry.name}. Call nemo_mmpo.nemo_rl.install() (loss=True) before "
                    f"setup(), or pass {loss_class.__qualname__}(master_config.loss_fn) to the "
                    "trainer"
                )
        in_loop = in_loop_settings(master_config) is not None
        if in_loop and sections.value(master_config, OVERLAP_VALIDATION):
            return (
                f"evaluation.in_loop=true with {OVERLAP_VALIDATION}=true: NeMo-RL {version}'s "
                f"{trainer} would run the hooked {validation}, the paper's evaluation, on a "
                "background thread while the policy trains and its engine refits, so the "
                f"evaluated weights would not be the step's: set {OVERLAP_VALIDATION}=false, or "
                "evaluation.in_loop=false and evaluate checkpoints with `nemo-mmpo eval watch`"
            )
        if in_loop and not _hooked(module, validation):
            return (
                f"evaluation.in_loop=true: NeMo-RL {version}'s {module.__name__} has no "
                f"{validation} that nemo-mmpo could hook, so {trainer} would run NeMo-RL's own "
                "validation instead of the paper's evaluation: set evaluation.in_loop=false and "
                "evaluate checkpoints with `nemo-mmpo eval watch`"
            )
        return None

    return problem


def in_master_config(problem: Problem) -> Problem:
    return lambda master_config: problem(sections.value(master_config, "loss_fn"))


#: where NeMo-RL's single controller refuses validation (main 7ea279ab)
SINGLE_CONTROLLER_VALIDATION = "single_controller_utils/setup.py:533-537"


def single_controller_problem(trainer: str) -> Problem:
    """What NeMo-RL's single controller cannot train, read from the master config when it
    builds its estimator (before the actor starts): DMPO (:func:`batch_terms_refused`), and
    ``evaluation.in_loop``: the controller has no validation (it refuses ``grpo.val_period``,
    ``val_at_start`` and ``val_at_end``), so the paper's evaluation would never run."""
    dmpo_problem = in_master_config(batch_terms_refused(trainer))

    def problem(master_config: Any) -> str | None:
        if in_loop_settings(master_config) is not None:
            return (
                f"evaluation.in_loop=true: NeMo-RL {_version()}'s {trainer} has no validation "
                f"(it refuses grpo.val_period, val_at_start and val_at_end, "
                f"{SINGLE_CONTROLLER_VALIDATION}), so the paper's evaluation would never run: "
                "set evaluation.in_loop=false and evaluate its checkpoints with `nemo-mmpo eval "
                "watch`"
            )
        return dmpo_problem(master_config)

    return problem


def ppo_loss_problem(loss_config: Any) -> str | None:
    name = sections.value(loss_config, "name")
    if name not in loss_names():
        return None
    return (
        f"loss_fn.name={name}: NeMo-RL's PPO (nemo_rl.algorithms.ppo, run_ppo.py) builds its "
        f"own ClippedPGLossFn and trains with a value model, which nemo-mmpo does not hook: it "
        f"would train NeMo-RL's loss under the name {name}. Train {name} with GRPO "
        "(nemo-mmpo train, or run_grpo.py after nemo_mmpo.nemo_rl.install()), or remove "
        "loss_fn.name from the PPO recipe"
    )


def ppo_estimator_problem(nemo_rl_names: set[str]) -> Problem:
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
