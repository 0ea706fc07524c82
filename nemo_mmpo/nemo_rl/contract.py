"""NeMo-RL's side of ``install()``'s contract, checked by behaviour, not by one source shape.

:func:`~nemo_mmpo.nemo_rl.install` refuses, before it wraps anything, a NeMo-RL below
:data:`MINIMUM_VERSION` (:func:`version_problem`), one that builds something under one of our
names (:func:`estimator_clashes`, :func:`loss_clashes`), a hooked name off its trainer's path
(:func:`path_problems`), or an original still called past the hooks (:func:`stray_references`);
docs/integration.md lists each case. Nothing here imports ``nemo_rl`` except
:func:`nemo_rl_version`; the rest reads the objects and modules it is handed, and their source
files (:mod:`ast`).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import io
import re
import sys
import warnings
from collections.abc import Callable, Iterable
from typing import Any

#: the oldest NeMo-RL nemo-mmpo installs into
MINIMUM_VERSION = (0, 6, 0)
SUPPORTED = "NeMo-RL v0.6.0 or newer (tested: v0.7.0 and main)"
#: a name no estimator or loss will ever have: how NeMo-RL answers a name it does not know
UNKNOWN_NAME = "nemo_mmpo_probe_no_such_name"


def nemo_rl_version() -> str:
    """``nemo_rl.__version__`` of the importable NeMo-RL (``unknown``, ``not importable``)."""
    try:
        import nemo_rl

        return str(getattr(nemo_rl, "__version__", "unknown"))
    except Exception:
        return "not importable"


def version_problem(version: str) -> str | None:
    """Why NeMo-RL ``version`` is too old (or unreadable) for nemo-mmpo, else None."""
    floor = ".".join(map(str, MINIMUM_VERSION))
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    if match is None:
        return (
            f"its version {version!r} cannot be compared with the oldest nemo-mmpo supports "
            f"({floor}): install NeMo-RL from a release or a git checkout (nemo_rl/package_info.py)"
        )
    if tuple(map(int, match.groups())) < MINIMUM_VERSION:
        return f"NeMo-RL {version} is older than {floor}: upgrade NeMo-RL to {floor} or newer"
    return None


# --- does NeMo-RL build something under one of our names? -------------------------------------
class _Section(dict):
    """A minimal config section, read both ways NeMo-RL reads its sections (``a.b``, ``a["b"]``,
    ``a.get("b")``)."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None


def _quietly(build: Any, *args: Any) -> tuple[Any, BaseException | None]:
    """``build(*args)`` with its prints and warnings swallowed: ``(result, None)`` or
    ``(None, error)``."""
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return build(*args), None
        except Exception as error:
            return None, error


def _estimator_config(name: str) -> _Section:
    section = _Section(adv_estimator=_Section(name=name))
    return _Section(grpo=section, ppo=section, loss_fn=_Section())


def _answer(error: BaseException, name: str) -> tuple[type, str]:
    return type(error), str(error).replace(name, "<name>")


def section(values: Any) -> Any:
    """``values`` (plain dicts and lists, e.g. a loaded YAML) as config sections read both ways
    (:class:`_Section`)."""
    if isinstance(values, dict):
        return _Section({key: section(value) for key, value in values.items()})
    if isinstance(values, list):
        return [section(value) for value in values]
    return values


def estimator_clashes(
    factory: Any, names: Iterable[str], default_config: Callable[[], Any] | None = None
) -> dict[str, str]:
    """``{name: what NeMo-RL's factory did}`` for each of ``names`` it does not refuse as it
    refuses :data:`UNKNOWN_NAME` (same error, but for the name); every name when it answers
    that one without an error. Where its error on a minimal config does not name the unknown
    name (it failed before reading it: a clash would go unseen), it is asked again on
    ``default_config()`` (``(config for a name, where)`` or ``(None, "")``); ``{"": why}`` where
    that is blind too."""
    names = list(names)
    config_of, tried, blind = _estimator_config, ["a minimal config"], []
    while True:
        _, unknown = _quietly(factory, config_of(UNKNOWN_NAME))
        if unknown is None:
            return dict.fromkeys(
                names, f"answers an unknown name ({UNKNOWN_NAME!r}) without an error"
            )
        if UNKNOWN_NAME in str(unknown):
            break
        blind.append(f"{type(unknown).__name__}({str(unknown)[:80]!r})")
        fuller, source = default_config() if default_config and len(tried) == 1 else (None, "")
        if fuller is None:
            return {
                "": f"answers the probe's unknown estimator name {UNKNOWN_NAME!r} with "
                f"{' and '.join(blind)}, an error that does not name it, on "
                f"{' and on '.join(tried)}: it fails before it reads the name, so nemo-mmpo "
                f"cannot check that NeMo-RL builds nothing under {', '.join(names)}"
            }
        config_of = fuller
        tried.append(f"NeMo-RL's {source}")
    refusal = _answer(unknown, UNKNOWN_NAME)
    on = f"on {tried[-1]}, " if len(tried) > 1 else ""  # said where it is not the minimal one
    clashes = {}
    for name in names:
        built, error = _quietly(factory, config_of(name))
        if error is None:
            clashes[name] = f"{on}builds {type(built).__name__}"
        elif _answer(error, name) != refusal:
            clashes[name] = (
                f"{on}answers {type(error).__name__}({str(error)[:80]!r}), not its unknown-name "
                "error"
            )
    return clashes


def loss_clashes(loss_class: Any, config_type: Any, names: Iterable[str]) -> dict[str, str]:
    """``{name: what NeMo-RL built}`` for each ``loss_fn.name`` in ``names`` under which NeMo-RL's
    ``loss_class`` (``ClippedPGLossFn``, built from ``config_type``, its config model) builds
    something other than what it builds from a config without a name."""
    make = config_type if callable(config_type) else _Section
    plain, error = _quietly(loss_class, make())
    if error is not None:
        return {"": f"cannot be built from a default config ({type(error).__name__}: {error})"}
    clashes = {}
    for name in names:
        built, error = _quietly(loss_class, make(name=name))
        if error is not None:
            clashes[name] = f"answers {type(error).__name__}({str(error)[:80]!r})"
        elif type(built) is not type(plain):
            clashes[name] = f"builds {type(built).__name__}, not {type(plain).__name__}"
    return clashes


# --- is each hooked name on the trainer's path? -----------------------------------------------
@functools.cache
def _source_tree(path: str) -> ast.Module | None:
    try:
        with open(path, encoding="utf-8") as source:
            return ast.parse(source.read())
    except (OSError, SyntaxError, ValueError):
        return None


def _module_tree(module: Any) -> ast.Module | None:
    path = getattr(module, "__file__", None)
    return _source_tree(path) if path else None


def _function(tree: ast.AST, qualname: str) -> ast.AST | None:
    """The ``def`` at ``qualname`` (``f``, ``Class.method``) in ``tree``."""
    node: ast.AST = tree
    for part in qualname.split("."):
        node = next(
            (
                child
                for child in getattr(node, "body", [])
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                and child.name == part
            ),
            None,
        )
        if node is None:
            return None
    return node


def _calls(node: ast.AST, name: str) -> bool:
    """Whether ``node``'s code calls the global ``name`` (``name(...)``, not ``module.name(...)``;
    an annotation or a string naming it is no call)."""
    return any(
        isinstance(item, ast.Call) and isinstance(item.func, ast.Name) and item.func.id == name
        for item in ast.walk(node)
    )


def path_problems(module: Any, name: str, original: Any, callers: Iterable[str]) -> list[str]:
    """Why ``module.name`` (NeMo-RL's ``original``) is off the path of the trainers ``callers``
    (functions of ``module``, ``Class.method`` for methods) that should call it."""
    where = f"{module.__name__}.{name}"
    problems = []
    actual = getattr(original, "__name__", name)
    if actual != name:
        problems.append(
            f"{where} is {getattr(original, '__module__', '?')}.{actual}, a function of another "
            "name (an alias kept for the old name?): the trainers may call it under its new name, "
            "past nemo-mmpo's hook"
        )
    callers = list(callers)
    tree = _module_tree(module) if callers else None
    if callers and tree is None:
        return [
            *problems,
            f"{module.__name__}'s source is unreadable, so nemo-mmpo cannot check "
            "that its trainers call what it hooks",
        ]
    for caller in callers:
        node = _function(tree, caller)
        if node is None:
            problems.append(f"{module.__name__} has no {caller}, which nemo-mmpo hooks {name} for")
        elif not _calls(node, name):
            problems.append(
                f"{module.__name__}.{caller} no longer calls {name} by that name (renamed, "
                "called through a module, or not called): nemo-mmpo's hook would never run"
            )
    return problems


def local_importers(module: Any, name: str) -> dict[str, set[str]]:
    """``{function: modules}``: each top-level function of ``module`` that imports ``name``
    inside its body (``from M import name``, relative imports resolved), with the modules ``M``
    it imports it from; such a function reads the name from ``M`` when it runs, so it reaches
    whatever ``install()`` put there (as the single controller's ``_build_advantage_estimator``
    imports grpo's or ppo's ``_create_advantage_estimator`` in some NeMo-RL versions).
    Empty where the source is unreadable."""
    tree = _module_tree(module)
    found: dict[str, set[str]] = {}
    package = getattr(module, "__package__", None) or ""
    for function in getattr(tree, "body", []):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.ImportFrom) and any(alias.name == name for alias in node.names):
                source = "." * node.level + (node.module or "")
                if node.level:
                    source = importlib.util.resolve_name(source, package)
                found.setdefault(function.name, set()).add(source)
    return found


def called_in(module: Any, name: str) -> bool:
    """Whether a function of ``module`` calls the global ``name``."""
    tree = _module_tree(module)
    return tree is not None and any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _calls(node, name)
        for node in ast.walk(tree)
    )


def stray_references(
    hooked: Iterable[tuple[str, str, Any]], left: Iterable[tuple[str, str]] = ()
) -> list[str]:
    """For ``hooked`` ``(module name, name, NeMo-RL's original)``: each loaded NeMo-RL module
    that holds an original under a name that is not hooked there (nor ``left`` unhooked on
    purpose: ``install(loss=False)``) and calls it (a trainer would reach NeMo-RL's function
    past ours)."""
    hooked = list(hooked)
    wrapped = {(module_name, name) for module_name, name, _ in hooked} | set(left)
    originals: dict[int, str] = {}
    for module_name, name, original in hooked:
        originals.setdefault(id(original), f"{module_name}.{name}")
    problems = []
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == "nemo_rl" or module_name.startswith("nemo_rl.")):
            continue
        for attribute, item in list(vars(module).items()):
            if id(item) not in originals or (module_name, attribute) in wrapped:
                continue
            if called_in(module, attribute):
                problems.append(
                    f"{module_name}.{attribute} is NeMo-RL's {originals[id(item)]}, which "
                    f"{module_name} calls there, past nemo-mmpo's hook"
                )
    return problems
