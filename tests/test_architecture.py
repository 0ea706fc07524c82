"""The package's layers, read from its source: no import goes up a layer, none closes a cycle.

Every ``import`` is read with :mod:`ast`, those inside functions included, so an import moved
into a function cannot hide a cycle. The layers, lowest first (each imports only its own layer
and those below)::

    core      nemo_mmpo/*.py (estimators, objectives, settings, errors, io, data, checkout,
              recipes, ...): the math, typed settings, files, the recipe loader
    eval      the paper's evaluation protocol, metrics and report, in-loop evaluation
    nemo_rl   the NeMo-RL adapter (its validation hook runs eval's in-loop evaluation)
    cpu       the CPU rig (drives NeMo-RL's trainers through the adapter)
    launch    checks, plans and starts a run (on NeMo-RL or the CPU rig)
    top       cli, study, lab: commands and studies built on the rest

An import inside a function of another layer's module is allowed only for the modules that
import an optional dependency (NeMo-RL, Ray) at import time, listed in :data:`OPTIONAL`.

Inside ``cpu`` the rooms are ordered the same way, lowest first (``nemo_mmpo.cpu.__main__``,
the command, above them all)::

    answers   the engines' CPU answers (each names the upstream line it answers)
    engines   NeMo-RL's Megatron policy and vLLM generation on the CPU, the transformers policy
    rig       the tiny task and model, warm start, measures, the driver
    spread    many runs over seeds and numerics, their curves
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "nemo_mmpo"
LAYERS = ["core", "eval", "nemo_rl", "cpu", "launch", "top"]
SUBPACKAGE_LAYER = {
    "eval": "eval",
    "nemo_rl": "nemo_rl",
    "cpu": "cpu",
    "launch": "launch",
    "cli": "top",
    "study": "top",
    "lab": "top",
}
#: Modules that import NeMo-RL at import time: imported inside the functions that need
#: them, so that the rest imports on a machine without them (a login node's ``--dry-run``).
OPTIONAL = {
    "nemo_mmpo.nemo_rl.loss": "nemo_rl",
    "nemo_mmpo.cpu.engines.policy": "nemo_rl",
    "nemo_mmpo.cpu.engines.megatron_policy": "nemo_rl",
    "nemo_mmpo.cpu.engines.generation": "nemo_rl",
    "nemo_mmpo.cpu.engines.vllm_generation": "nemo_rl",
    "nemo_mmpo.cpu.answers.vllm_refit": "ray",
}


#: the rooms of ``nemo_mmpo/cpu/``, lowest first
CPU_ROOMS = ["answers", "engines", "rig", "spread"]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def part(module: str) -> str:
    """``eval``, ``cpu``, ... or ``core`` for the top-level modules (``cli`` is its own)."""
    name = module.split(".")[1] if "." in module else ""
    return name if name in SUBPACKAGE_LAYER else "core"


def layer(module: str) -> int:
    return LAYERS.index(SUBPACKAGE_LAYER.get(part(module), "core"))


def imports(module: str) -> list[tuple[str, int, bool]]:
    """``(imported nemo_mmpo module, line, inside a function)`` for every import in ``module``."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(anchor + ([child.module] if child.module else []))
                names = [f"{base}.{alias.name}" for alias in child.names] + [base]
            for name in names:
                target = name if name in MODULES else None
                if target and target != module and not module.startswith(f"{target}."):
                    found.append((target, child.lineno, in_function))
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            visit(child, inner)

    visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return found


EDGES = {module: imports(module) for module in MODULES}


def test_every_module_belongs_to_a_layer():
    assert PACKAGE.is_dir() and len(MODULES) > 20
    subpackages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert subpackages <= set(SUBPACKAGE_LAYER), subpackages - set(SUBPACKAGE_LAYER)


def cpu_room(module: str) -> int:
    """The room's place in :data:`CPU_ROOMS`; the ``cpu`` package and its command above them."""
    parts = module.split(".")
    return CPU_ROOMS.index(parts[2]) if parts[2:3] and parts[2] in CPU_ROOMS else len(CPU_ROOMS)


def test_every_cpu_module_is_in_a_room():
    cpu = [module for module in MODULES if part(module) == "cpu"]
    outside = {"nemo_mmpo.cpu", "nemo_mmpo.cpu.__main__"}
    loose = [m for m in cpu if m not in outside and m.split(".")[2] not in CPU_ROOMS]
    assert not loose, f"modules of nemo_mmpo/cpu/ outside the rooms {CPU_ROOMS}: {loose}"
    assert {m.split(".")[2] for m in cpu if m not in outside} == set(CPU_ROOMS)


def test_no_import_goes_up_a_cpu_room():
    upward = [
        f"{module}:{line} imports {target}"
        for module, edges in EDGES.items()
        for target, line, _ in edges
        if part(module) == part(target) == "cpu" and cpu_room(target) > cpu_room(module)
    ]
    assert not upward, "\n".join(upward)


def test_no_import_goes_up_a_layer():
    upward = [
        f"{module}:{line} imports {target} ({LAYERS[layer(module)]} -> {LAYERS[layer(target)]})"
        for module, edges in EDGES.items()
        for target, line, _ in edges
        if layer(target) > layer(module)
    ]
    assert not upward, "\n".join(upward)


def test_no_cycle_between_parts_of_a_layer():
    """Within the top layer (and any shared one) the parts do not import each other."""
    sideways = [
        f"{module}:{line} imports {target}"
        for module, edges in EDGES.items()
        for target, line, _ in edges
        if layer(target) == layer(module) and part(target) != part(module)
    ]
    assert not sideways, "\n".join(sideways)


def test_no_module_cycle_even_through_imports_inside_functions():
    graph = {module: {target for target, _, _ in edges} for module, edges in EDGES.items()}
    state: dict[str, str] = {}

    def cycle_from(module: str, path: list[str]) -> list[str] | None:
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                return [*path[path.index(target) :], target] if target in path else [target]
            if target not in state:
                found = cycle_from(target, [*path, target])
                if found:
                    return found
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state:
            found = cycle_from(module, [module])
            assert found is None, " -> ".join(found)


def test_imports_inside_functions_cross_no_layer_but_for_optional_dependencies():
    hidden = [
        f"{module}:{line} imports {target} inside a function"
        for module, edges in EDGES.items()
        for target, line, in_function in edges
        if in_function and part(target) != part(module) and target not in OPTIONAL
    ]
    assert not hidden, "\n".join(hidden)


@pytest.mark.parametrize("module", sorted(OPTIONAL))
def test_optional_modules_are_imported_only_inside_functions(module):
    """Each :data:`OPTIONAL` module imports its dependency at import time (else it belongs with
    the rest), and no module imports it at import time."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    top_level = {
        alias.name.split(".")[0]
        for node in tree.body
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0] for node in tree.body if isinstance(node, ast.ImportFrom)
    }
    assert OPTIONAL[module] in top_level
    eager = [
        f"{importer}:{line}"
        for importer, edges in EDGES.items()
        for target, line, in_function in edges
        if target == module and not in_function and importer not in OPTIONAL
    ]
    assert not eager, f"{module} imported at import time by {eager}"
