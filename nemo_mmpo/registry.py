"""What every registration (estimators, losses) shares: names, plug-in modules, the freeze.

A name is refused at registration when it is NeMo-RL's own (:data:`NEMO_RL_ESTIMATORS`,
:data:`NEMO_RL_LOSSES`), already taken by another object, or a near miss of a taken name
(``MMPO``, ``mmpo_``, ``grpo2``: a recipe's typo would select the wrong objective without a
word). Once :func:`freeze` ran (``nemo_mmpo.nemo_rl.install()``), registering is refused: the
dry run, the hooks and every Ray worker must see the same registry, which only holds when the
registrations come from modules imported everywhere: the built-ins, the recipe's
``nemo_mmpo.plugins`` and the ``nemo_mmpo.plugins`` entry points (:mod:`nemo_mmpo.plugins`).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Iterable
from typing import Any

from nemo_mmpo.errors import MMPOInputError

#: ``grpo.adv_estimator.name`` values NeMo-RL builds itself (v0.7.0 and main)
NEMO_RL_ESTIMATORS = ("grpo", "gdpo", "opd", "reinforce_plus_plus")
#: ``loss_fn.name`` values NeMo-RL's own ``ClippedPGLossFn`` answers to
NEMO_RL_LOSSES = ("clipped_pg",)

_frozen_by: list[str] = []


def near_miss(value: Any, names: Iterable[str]) -> str | None:
    """The one of ``names`` that ``value`` misspells (case, surrounding spaces, a typo), or None
    (an exact name, or nothing close). Names are matched exactly: a near miss is refused with
    this spelling, never read as the name."""
    names = list(names)
    if not isinstance(value, str) or value in names:
        return None
    folded = value.strip().lower()
    for name in names:
        if folded == name.lower():
            return name
    close = difflib.get_close_matches(folded, names, n=1, cutoff=0.8)
    return close[0] if close else None


def registered_by(obj: Any) -> str:
    """Where ``obj`` was defined, for messages: ``module.qualname``, or its module path."""
    if isinstance(obj, str):
        return obj
    module = getattr(obj, "__module__", None) or "?"
    return f"{module}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def caller_module() -> str:
    """The module that called the registration: the first frame outside the registries'
    functions (a registry module's own top level counts: the built-ins register there)."""
    frame = inspect.currentframe()
    while (
        frame is not None
        and frame.f_globals.get("__name__") in _REGISTRY_MODULES
        and frame.f_code.co_name != "<module>"  # the built-ins register at module level
    ):
        frame = frame.f_back
    return frame.f_globals.get("__name__", "?") if frame is not None else "?"


#: the modules whose frames :func:`caller_module` skips
_REGISTRY_MODULES = {"nemo_mmpo.registry", "nemo_mmpo.estimators", "nemo_mmpo.losses"}


def check_name(kind: str, name: Any, taken: dict[str, str], reserved: Iterable[str]) -> None:
    """Refuse ``name`` for a new ``kind`` (``estimator``, ``loss``) in one line: not a string
    identifier, NeMo-RL's own, or a near miss of a taken or reserved name. ``taken`` maps the
    names already registered to who registered them (an exact duplicate is the caller's
    business: re-registering the same object is allowed)."""
    register = f"register_{kind}({name!r})"
    if not isinstance(name, str) or not name.isidentifier():
        raise MMPOInputError(
            f"{register}: a {kind} name is a lowercase identifier (letters, digits, _), as a "
            f"recipe spells it; got {name!r}"
        )
    reserved = tuple(reserved)
    if name in reserved:
        raise MMPOInputError(
            f"{register} from {caller_module()}: {name!r} is NeMo-RL's own {kind}, which "
            "nemo-mmpo's hooks would shadow for every recipe: choose another name"
        )
    spelling = near_miss(name, [*taken, *reserved])
    if spelling is not None:
        owner = taken.get(spelling, "NeMo-RL")
        raise MMPOInputError(
            f"{register} from {caller_module()}: {name!r} is too close to {spelling!r} "
            f"({owner}): a recipe's typo would select the other {kind} without a word; choose "
            "a name that differs more"
        )


def refuse_if_frozen(kind: str, name: str) -> None:
    """Registering after :func:`freeze` (``install()``) is refused: NeMo-RL's workers and the
    single controller's actor would not see the late entry."""
    if _frozen_by:
        raise MMPOInputError(
            f"register_{kind}({name!r}) from {caller_module()} after {_frozen_by[0]}: the "
            "hooks, the dry run and NeMo-RL's Ray workers read one registry, fixed when the "
            "run starts. Register in a module the recipe names (nemo_mmpo.plugins: [module]) "
            "or an installed package's 'nemo_mmpo.plugins' entry point"
        )


def freeze(by: str) -> None:
    """No registration after this (``by`` names who froze it, for the refusal)."""
    if not _frozen_by:
        _frozen_by.append(by)


def thaw() -> None:
    """Registering is allowed again (tests that register after an ``install()``)."""
    _frozen_by.clear()
