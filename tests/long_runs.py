"""The long end-to-end runs, and which of them one CI run trains (its turn).

Each test here trains one of NeMo-RL's paths for real on the CPU rig (a trainer, its vLLM and
Megatron engines, a kill -9 and the resume, the watcher, a user's wheel): every one starts a
Ray cluster, vLLM and Megatron workers, and each such start costs ~250 CPU-seconds of imports
before its first step. Together they cost ~3900 CPU-seconds (docs/testing.md, "What CI costs
in CPU-seconds"); the rest of CI (both snapshots' adapter and launcher tests, NeMo-RL's unit
tests, the 3.11 suite, the Slurm suite) already fills most of the 35 minutes of 2 cores, so one
CI run cannot train them all. CI trains them in turns: ``scripts/test_nemo_rl.sh`` under
``CI=true`` picks turn ``(number of commits in HEAD's history) % len(TURNS)``, so consecutive
commits take the turns in order, every path is trained in CI again within ``len(TURNS)``
commits, and the log says which turn ran. ``NEMO_MMPO_LONG_RUNS`` chooses instead: ``all``
(the default outside CI: ``bash scripts/test.sh`` on a workstation runs everything), ``none``,
or a turn's number.

The turns are about equally costly (CPU-seconds measured 2026-11-28 on the 2-core machine, both
sessions side by side), and a test's snapshot is its ``one_snapshot``/``main_snapshot`` mark.
A test marked ``long_run`` must be in exactly one turn (``tests/test_long_runs.py``).

Side by side, ``scripts/test_nemo_rl.sh`` runs the modules holding the turn's long runs in a
pytest process of their own for the snapshot they train on (``modules_of``), beside both
snapshots' sessions of the other tests: one session holding a long run was the long pole.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

#: the turns, each a tuple of ``path::test`` names (the test's id without parameters)
TURNS: tuple[tuple[str, ...], ...] = (
    # v0.7.0: the Megatron recipe's 50 steps, the learning check, the watcher killed and
    # resumed on its step-50 checkpoint (972)
    ("tests/cpu/test_tiny_run_megatron.py::test_megatron_recipe_is_on_policy_and_learns",),
    # main: the single controller killed and resumed, the watcher on its checkpoint (996)
    (
        "tests/cpu/test_tiny_run_single_controller.py::"
        "test_single_controller_trains_mmpo_resumes_after_kill_9_and_is_evaluated_by_the_watcher",
    ),
    # main: grpo_train_sync killed and resumed through `uv run` (770); v0.7.0: the study (151)
    # and the README's CPU recipe from a user's wheel, killed, resumed and evaluated (~290, its
    # own warm start ~250: the container-layout part trains the README's recipe every CI)
    (
        "tests/cpu/test_tiny_run_sync.py::test_sync_recipe_trains_mmpo_evaluates_and_resumes_after_kill_9",
        "tests/cpu/test_study.py::test_a_two_method_study_reports_the_evaluation_reports_numbers",
        "tests/cpu/test_readme_recipe.py::"
        "test_the_readme_recipe_trains_resumes_and_is_evaluated_from_a_users_folder",
    ),
    # main: grpo_train's resumed Megatron run takes the uninterrupted run's step 3 bit for bit
    # (514); v0.7.0: the user's wheel run in a folder of their own, killed and resumed (289),
    # and the async recipe's run refitting a separate engine, resumed (244)
    (
        "tests/cpu/test_tiny_run_megatron.py::test_a_resumed_run_takes_the_uninterrupted_runs_next_step",
        "tests/cpu/test_tiny_run.py::test_short_tiny_run_trains_on_the_core_advantages_and_resumes",
        "tests/cpu/test_tiny_run.py::test_short_async_tiny_run_refits_a_separate_engine_and_resumes",
    ),
)

#: in each turn, the snapshot whose session runs the tests marked ``alternating`` (end-to-end
#: runs of NeMo-RL's trainers and engines that both snapshots hold, ~500 CPU-seconds a session);
#: the other snapshot's session leaves them out, so each runs on each snapshot every other
#: commit, on the session with less of the turn's long runs (docs/testing.md, "CI")
ALTERNATING_ON: tuple[str, ...] = ("main", "v0.7.0", "v0.7.0", "main")

ENVIRONMENT = "NEMO_MMPO_LONG_RUNS"
ROOT = Path(__file__).resolve().parents[1]


def chosen_turns(setting: str | None) -> set[int]:
    """The turns ``NEMO_MMPO_LONG_RUNS=setting`` asks for: every turn for ``all`` or no
    setting, none for ``none``, else the one numbered. Raises ``ValueError`` naming the value
    and the choices for anything else."""
    value = (setting or "all").strip().lower()
    if value == "all":
        return set(range(len(TURNS)))
    if value == "none":
        return set()
    if value.isdigit() and int(value) < len(TURNS):
        return {int(value)}
    raise ValueError(
        f"{ENVIRONMENT}={setting!r}: expected all, none or a turn from 0 to {len(TURNS) - 1} "
        f"(tests/long_runs.py lists them)"
    )


def turn_of_commit(commit_count: int) -> int:
    """The turn CI takes for a commit with ``commit_count`` commits in its history."""
    return commit_count % len(TURNS)


def turn_of(test_name: str) -> int | None:
    """The turn of ``path::test`` (a test id without parameters), or None."""
    for number, turn in enumerate(TURNS):
        if test_name in turn:
            return number
    return None


def deselected(items, setting: str | None = None) -> list:
    """Of pytest ``items``, those marked ``long_run`` whose turn is not chosen
    (``NEMO_MMPO_LONG_RUNS``, read when ``setting`` is None). A ``long_run`` test in no turn
    is an error (a new long run must take a turn, or it would never train in CI), unless it
    is also ``beyond_ci`` (run on request only)."""
    if setting is None:
        setting = os.environ.get(ENVIRONMENT)
    turns = chosen_turns(setting)
    left_out = []
    for item in items:
        if item.get_closest_marker("long_run") is None or item.get_closest_marker("beyond_ci"):
            continue  # (beyond_ci: on request only, NEMO_MMPO_BEYOND_CI=1, whatever the turn)
        name = item.nodeid.split("[", 1)[0]
        turn = turn_of(name)
        if turn is None:
            raise ValueError(
                f"{name} is marked long_run but is in none of tests/long_runs.py's TURNS: "
                "add it to the turn whose cost it fits"
            )
        if turn not in turns:
            left_out.append(item)
    return left_out


def alternating_on(setting: str | None) -> str:
    """Which snapshot's session runs the tests marked ``alternating`` under
    ``NEMO_MMPO_LONG_RUNS=setting``: the turn's (``v0.7.0`` or ``main``), or ``both`` for
    ``all`` and ``none`` (a workstation's run, or one without long runs)."""
    turns = chosen_turns(setting)
    if len(turns) != 1:
        return "both"
    (turn,) = turns
    return ALTERNATING_ON[turn]


def describe(setting: str | None) -> str:
    """One line for the CI log: which long runs this run trains, and how to run the others."""
    turns = chosen_turns(setting)
    if len(turns) == len(TURNS):
        return f"every turn of tests/long_runs.py ({sum(map(len, TURNS))} long runs)"
    if not turns:
        return "none (NEMO_MMPO_LONG_RUNS=none; =all runs every turn)"
    (turn,) = turns
    names = ", ".join(name.rsplit("::", 1)[1] for name in TURNS[turn])
    return (
        f"turn {turn} of {len(TURNS)} (tests/long_runs.py): {names}; the other turns train in "
        "CI on the next commits, NEMO_MMPO_LONG_RUNS=all runs every turn here"
    )


def marked_tests(root: Path = ROOT, modules: list[str] | None = None) -> dict[str, set[str]]:
    """``path::test`` -> its marks (the module's ``pytestmark`` and its decorators, read from
    the source without importing it), for every test function under ``root``/tests, or in the
    ``modules`` (``tests/...py``) named."""
    found = {}
    paths = (
        sorted((root / "tests").rglob("test_*.py"))
        if modules is None
        else [root / module for module in modules]
    )
    for path in paths:
        tree = ast.parse(path.read_text())
        module_marks = set()
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id == "pytestmark"
                for target in node.targets
            ):
                module_marks |= _marks(node.value)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                marks = module_marks | set().union(*map(_marks, node.decorator_list))
                found[f"{path.relative_to(root).as_posix()}::{node.name}"] = marks
    return found


def _marks(node: ast.AST) -> set[str]:
    """The ``pytest.mark.X`` names in a decorator list or a ``pytestmark`` value."""
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Attribute):
            if sub.value.attr == "mark":
                names.add(sub.attr)
    return names


def snapshot_selection(ref: str) -> str:
    """The pytest ``-m`` expression of NeMo-RL ``ref``'s session among the snapshots:
    ``one_snapshot`` tests on v0.7.0 only, ``main_snapshot`` tests on every other snapshot."""
    return "nemo_rl and not main_snapshot" if ref == "v0.7.0" else "nemo_rl and not one_snapshot"


def selection(
    setting: str | None, ref: str, *, checkout: bool = False, beyond_ci: bool = False
) -> str:
    """The ``-m`` expression ``scripts/test_nemo_rl.sh`` runs NeMo-RL ``ref``'s session with:
    :func:`snapshot_selection` (a ``checkout``, ``NEMO_RL_PATH``: every ``nemo_rl`` test), the
    ``alternating`` tests only where :func:`alternating_on` names ``ref``'s snapshot (a
    checkout: always), and ``beyond_ci`` tests only on request."""
    expression = "nemo_rl" if checkout else snapshot_selection(ref)
    on = alternating_on(setting)
    if not checkout and on not in ("both", ref.split("-", 1)[0]):
        expression += " and not alternating"
    if not beyond_ci:
        expression += " and not beyond_ci"
    return expression


def trains_on(marks: set[str], ref: str) -> bool:
    """Whether a test with ``marks`` runs on NeMo-RL ``ref``'s session, by the snapshots' rule
    (:func:`snapshot_selection`)."""
    from _pytest.mark.expression import Expression  # pytest's own reading of -m

    return Expression.compile(snapshot_selection(ref)).evaluate(lambda mark: mark in marks)


def modules_of(setting: str | None, ref: str, root: Path = ROOT) -> list[str]:
    """The test modules (``tests/...py``, each once, in turn order) holding the long runs that
    ``NEMO_MMPO_LONG_RUNS=setting`` trains on NeMo-RL ``ref``: run whole in a process of their
    own, the session of ``ref``'s other tests leaves them out."""
    turns = sorted(chosen_turns(setting))
    named = {name.split("::", 1)[0] for turn in turns for name in TURNS[turn]}
    marks = marked_tests(root, sorted(named))
    modules: list[str] = []
    for turn in turns:
        for name in TURNS[turn]:
            module = name.split("::", 1)[0]
            if trains_on(marks.get(name, set()), ref) and module not in modules:
                modules.append(module)
    return modules


if __name__ == "__main__":  # scripts/test_nemo_rl.sh: `python tests/long_runs.py COMMAND ARG...`
    # turn COMMITS | describe SETTING | modules SETTING REF (one module a line) |
    # alternating SETTING | selection SETTING REF [checkout] [beyond_ci]
    import sys

    command, argument = sys.argv[1], sys.argv[2]
    try:
        if command == "turn":
            print(turn_of_commit(int(argument)))
        elif command == "selection":
            flags = sys.argv[4:]
            unknown = set(flags) - {"checkout", "beyond_ci"}
            if unknown:
                raise ValueError(f"selection: unknown flags {sorted(unknown)}")
            print(
                selection(
                    argument,
                    sys.argv[3],
                    checkout="checkout" in flags,
                    beyond_ci="beyond_ci" in flags,
                )
            )
        elif command == "alternating":
            print(alternating_on(argument))
        elif command == "modules":
            print("\n".join(modules_of(argument, sys.argv[3])))
        else:
            print(describe(argument))
    except ValueError as error:
        sys.exit(f"error: {error}")
