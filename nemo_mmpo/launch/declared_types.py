"""Every key of a config checked against NeMo-RL's own declared types, before any other rule.

NeMo-RL's ``run_grpo.py`` builds ``MasterConfig(**config)`` (pydantic, lax mode) before it trains;
:func:`check` builds the same class, read by :mod:`nemo_mmpo.launch.declarations` from the
checkout the dry run reads (``NEMO_RL_PATH``, or the container's), so a login node without
``nemo_rl`` checks what the cluster will. What it refuses is one error naming each key, its value
and what NeMo-RL accepts there. What it accepts only by converting it (``"3"`` or ``true`` for an
integer: pydantic's lax mode) is a warning naming the value NeMo-RL will read, and the config the
other rules and the plan see holds that value, as NeMo-RL's does. Our estimator names are
accepted as :func:`~nemo_mmpo.nemo_rl.install` makes NeMo-RL accept them, where its
``grpo.adv_estimator.name`` is a ``Literal`` (:mod:`nemo_mmpo.nemo_rl.newer_nemo_rl`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_mmpo import sections
from nemo_mmpo.checkout import find_nemo_rl_root
from nemo_mmpo.launch import trainers
from nemo_mmpo.launch.declarations import declared_class, declared_objects
from nemo_mmpo.nemo_rl.newer_nemo_rl import accept_our_estimator_names

#: our own top-level sections, which NeMo-RL's MasterConfig keeps as extras and never reads
OUR_SECTIONS = ("cpu_backend", "evaluation", "nemo_mmpo")
GRPO_MODULE = "nemo_rl.algorithms.grpo"


@dataclass(frozen=True)
class Problem:
    """One pydantic error, located in the config: the keys to the value, and the union branches
    (``TypedDict`` or model names) taken on the way, as ``(keys so far, branch)``."""

    keys: tuple[str | int, ...]
    branches: tuple[tuple[tuple[str | int, ...], str], ...]
    kind: str
    message: str
    given: Any

    @property
    def key(self) -> str:
        return ".".join(str(part) for part in self.keys)


def locate(error: Mapping[str, Any], config: Any) -> Problem:
    """Split a pydantic error's ``loc`` into the config's keys and the union branches."""
    keys: list[str | int] = []
    branches = []
    node = config
    location = list(error["loc"])
    for position, part in enumerate(location):
        last = position == len(location) - 1
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif last and error["type"] in ("missing", "extra_forbidden"):
            node = None
        else:
            branches.append((tuple(keys), str(part)))
            continue
        keys.append(part)
    return Problem(tuple(keys), tuple(branches), error["type"], error["msg"], error.get("input"))


def closest_branches(problems: list[Problem]) -> list[Problem]:
    """At each union, the problems of the branch(es) the value came closest to: branches whose
    only complaint is a ``Literal`` switch (``enabled: Input should be False``) lose to a branch
    with a real complaint; then the fewest problems win."""
    sites = {site for problem in problems for site, _ in problem.branches}
    for site in sorted(sites, key=len):
        by_branch: dict[str, list[Problem]] = {}
        for problem in problems:
            branch = dict(problem.branches).get(site)
            if branch is not None:
                by_branch.setdefault(branch, []).append(problem)
        if len(by_branch) < 2:
            continue
        real = {
            branch: found
            for branch, found in by_branch.items()
            if any(problem.kind != "literal_error" for problem in found)
        }
        candidates = real or by_branch
        fewest = min(len(found) for found in candidates.values())
        dropped = {branch for branch, found in by_branch.items() if len(found) != fewest}
        dropped |= set(by_branch) - set(candidates)
        problems = [p for p in problems if dict(p.branches).get(site) not in dropped]
    return problems


def _accepted(message: str) -> str:
    """``Input should be a valid integer, unable to parse...`` -> ``a valid integer (unable to
    parse...)``."""
    text = message.removeprefix("Input should be ")
    head, _, detail = text.partition(", ")
    return f"{head} ({detail})" if detail else head


def describe_problems(problems: list[Problem], where: str) -> str:
    """One line: each key, its value and what NeMo-RL accepts there."""
    by_key: dict[str, list[Problem]] = {}
    for problem in problems:
        by_key.setdefault(problem.key, []).append(problem)
    parts = []
    for key, found in by_key.items():
        first = found[0]
        if first.kind == "missing":
            parts.append(f"{key} is missing: {where} requires it")
        else:
            accepted = " or ".join(dict.fromkeys(_accepted(problem.message) for problem in found))
            parts.append(f"{key}={first.given!r}: {where} accepts {accepted}")
        where = "it"  # named once, in the first part
    return "; ".join(parts)


def _same(given: Any, read: Any) -> bool:
    if isinstance(given, list) and isinstance(read, list | tuple):
        return len(given) == len(read) and all(map(_same, given, read))
    return type(given) is type(read) and given == read


def _read(node: Any, keys: tuple[str | int, ...]) -> Any:
    """The value at ``keys`` in ``node`` (mappings, pydantic models and lists)."""
    for part in keys:
        if isinstance(node, list | tuple) and isinstance(part, int):
            node = node[part]
        else:
            node = sections.value(node, str(part))
    return node


def _assign(config: dict[str, Any], keys: tuple[str | int, ...], item: Any) -> None:
    node: Any = config
    for part in keys[:-1]:
        node = node[part]
    node[keys[-1]] = item


@dataclass
class TypeCheck:
    """What :func:`check` found, and the config as NeMo-RL reads it (its conversions applied)."""

    config: dict[str, Any]
    error: str | None = None
    warnings: tuple[str, ...] = ()

    def with_config(self, config: dict[str, Any]) -> TypeCheck:
        return TypeCheck(config, self.error, self.warnings)


def single_controller_checks(validate: Any, read: Any, where: str) -> TypeCheck | None:
    """NeMo-RL's ``validate_single_controller_config`` (``validate``, read from the checkout's
    source with the ``MasterConfig`` it checks; ``setup_single_controller`` runs it first) on
    ``read``: what it
    raises is the error, what it warns are warnings; None when it passes silently. Where it needs
    what a login node lacks, a warning says it was not run."""
    import warnings

    if not callable(validate) or isinstance(validate, type):
        return None
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        try:
            validate(read)
        except ValueError as error:
            return TypeCheck({}, error=f"{where}: {' '.join(str(error).split())}")
        except Exception as error:  # it computes with what the login node lacks
            return TypeCheck(
                {},
                warnings=(
                    f"{where}: validate_single_controller_config could not check this config "
                    f"here ({type(error).__name__})",
                ),
            )
    said = tuple(f"{where}: {' '.join(str(item.message).split())}" for item in warned)
    return TypeCheck({}, warnings=said) if said else None


def check(config: dict[str, Any], nemo_rl_root: Path | None = None) -> TypeCheck:
    """``config`` through the ``MasterConfig`` of the NeMo-RL at ``nemo_rl_root`` (default: the
    checkout the dry run reads), lax as ``run_grpo.py`` builds it, then strict."""
    from pydantic import ValidationError

    root = nemo_rl_root or find_nemo_rl_root()
    single_controller = trainers.is_single_controller(config)
    module = trainers.SINGLE_CONTROLLER_CONFIG if single_controller else GRPO_MODULE
    validate = None
    try:
        if root is None:
            master_config = None
        elif single_controller:  # with its cross-section checks, read by the same reader
            master_config, validate = declared_objects(
                root, module, ("MasterConfig", "validate_single_controller_config")
            )
        else:
            master_config = declared_class(root, module)
    except (OSError, SyntaxError, UnicodeDecodeError) as error:
        return TypeCheck(
            config,
            warnings=(
                f"NeMo-RL's config types were not checked: its source at {root} does not "
                f"read ({type(error).__name__}: {error})",
            ),
        )
    if not isinstance(master_config, type):
        master_config = None
    if master_config is None and single_controller and root is not None:
        return TypeCheck(config, error=trainers.missing_single_controller(root))
    if master_config is None:
        return TypeCheck(
            config,
            warnings=(
                "NeMo-RL's config types were not checked: no NeMo-RL checkout with "
                "nemo_rl/algorithms/grpo.py was found (set NEMO_RL_PATH to the one the job uses)",
            ),
        )
    accept_our_estimator_names(master_config)  # as install() does before run_grpo.py's check
    where = f"NeMo-RL's {'single controller ' if single_controller else ''}MasterConfig ({root})"
    nemo_rl_sections = {key: item for key, item in config.items() if key not in OUR_SECTIONS}
    try:
        read = master_config(**nemo_rl_sections)
    except ValidationError as error:
        problems = [locate(item, nemo_rl_sections) for item in error.errors()]
        return TypeCheck(config, error=describe_problems(closest_branches(problems), where))
    except Exception as error:  # a validator needing what a login node lacks
        return TypeCheck(
            config,
            warnings=(f"{where} could not check this config here: {type(error).__name__}",),
        )
    if single_controller:  # its cross-section checks, as setup_single_controller runs them
        refused = single_controller_checks(validate, read, where)
        if refused is not None:
            return refused.with_config(config)
    try:
        master_config.model_validate(nemo_rl_sections, strict=True)
        return TypeCheck(config)
    except ValidationError as error:
        converted = [locate(item, nemo_rl_sections) for item in error.errors()]
    config = copy.deepcopy(config)
    warnings = []
    for problem in converted:
        reads = _read(read, problem.keys) if problem.keys else None
        if problem.kind == "missing" or _same(problem.given, reads):
            continue
        _assign(config, problem.keys, reads)
        warnings.append(
            f"{problem.key}={problem.given!r}: {where} accepts it by converting it to "
            f"{reads!r}, which the run trains with; write {reads!r} if that is meant"
        )
    return TypeCheck(config, warnings=tuple(dict.fromkeys(warnings)))
