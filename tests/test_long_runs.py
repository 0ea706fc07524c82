"""CI's turns of the long end-to-end runs (``tests/long_runs.py``): every test marked
``long_run`` is in exactly one turn, every name in a turn is such a test, consecutive commits
take every turn, and a bad ``NEMO_MMPO_LONG_RUNS`` is refused by name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import long_runs
import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def test_every_long_run_is_in_exactly_one_turn_and_every_turn_names_long_runs():
    tests = long_runs.marked_tests()
    in_turns = [name for turn in long_runs.TURNS for name in turn]
    assert len(in_turns) == len(set(in_turns)), "a test in two turns"
    for name in in_turns:
        assert name in tests, f"{name}: no such test function"
        assert "long_run" in tests[name], f"{name} is in a turn but not marked long_run"
        assert "beyond_ci" not in tests[name], f"{name} is beyond_ci: it runs on request only"
    for name, marks in tests.items():
        if "long_run" in marks and "beyond_ci" not in marks:
            assert name in in_turns, f"{name} is marked long_run but takes no turn"
    # the real ones are there: at least the learning check and each of main's newer trainers
    assert any("test_megatron_recipe_is_on_policy_and_learns" in name for name in in_turns)
    assert any("test_tiny_run_single_controller.py" in name for name in in_turns)
    assert any("test_tiny_run_sync.py" in name for name in in_turns)


def test_consecutive_commits_take_every_turn_in_order():
    count = len(long_runs.TURNS)
    assert [long_runs.turn_of_commit(commits) for commits in range(100, 100 + 2 * count)] == [
        (100 + offset) % count for offset in range(2 * count)
    ]
    assert {long_runs.turn_of_commit(commits) for commits in range(count)} == set(range(count))


@pytest.mark.parametrize(
    ("setting", "expected"),
    [(None, "all"), ("all", "all"), ("ALL", "all"), ("none", set()), ("0", {0}), ("1", {1})],
)
def test_the_setting_chooses_all_none_or_one_turn(setting, expected):
    if expected == "all":
        expected = set(range(len(long_runs.TURNS)))
    assert long_runs.chosen_turns(setting) == expected


@pytest.mark.parametrize("setting", ["-1", "1.5", "some", str(len(long_runs.TURNS))])
def test_a_bad_setting_is_refused_naming_the_value_and_the_choices(setting):
    with pytest.raises(ValueError) as refused:
        long_runs.chosen_turns(setting)
    assert repr(setting) in str(refused.value)
    assert f"0 to {len(long_runs.TURNS) - 1}" in str(refused.value)


class _Item:
    """What ``long_runs.deselected`` reads of a pytest item."""

    def __init__(self, nodeid: str, *marks: str):
        self.nodeid, self.marks = nodeid, marks

    def get_closest_marker(self, name):
        return name if name in self.marks else None


def test_only_the_long_runs_of_other_turns_are_deselected():
    first, second = long_runs.TURNS[0][0], long_runs.TURNS[1][0]
    items = [
        _Item(first, "long_run"),
        _Item(second + "[a-parameter]", "long_run"),
        _Item("tests/cpu/test_other.py::test_short", "nemo_rl"),
        _Item("tests/cpu/test_other.py::test_on_request", "long_run", "beyond_ci"),
    ]
    assert long_runs.deselected(items, "0") == [items[1]]
    assert long_runs.deselected(items, "1") == [items[0]]
    assert long_runs.deselected(items, "all") == []
    assert long_runs.deselected(items, "none") == items[:2]
    with pytest.raises(ValueError, match="in none of"):
        long_runs.deselected([_Item("tests/cpu/test_new.py::test_long", "long_run")], "all")


def test_the_ci_script_prints_the_turn_and_refuses_a_bad_setting():
    script = [sys.executable, str(TESTS / "long_runs.py")]
    turn = subprocess.run([*script, "turn", "1234"], capture_output=True, text=True, check=True)
    assert turn.stdout.strip() == str(1234 % len(long_runs.TURNS))
    said = subprocess.run([*script, "describe", "1"], capture_output=True, text=True, check=True)
    assert said.stdout.startswith(f"turn 1 of {len(long_runs.TURNS)} (tests/long_runs.py): ")
    assert long_runs.TURNS[1][0].rsplit("::", 1)[1] in said.stdout
    bad = subprocess.run([*script, "describe", "sometimes"], capture_output=True, text=True)
    assert bad.returncode != 0
    assert "NEMO_MMPO_LONG_RUNS='sometimes'" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_each_snapshot_gets_the_modules_of_the_long_runs_it_trains(tmp_path, monkeypatch):
    """A turn's module goes to the snapshot its long run trains on (``one_snapshot``: v0.7.0,
    ``main_snapshot``: main, neither: both), once, in turn order; the other snapshot's session
    keeps it. Read from a tree of test files, not the real one."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_a.py").write_text(
        "import pytest\npytestmark = pytest.mark.nemo_rl\n"
        "@pytest.mark.long_run\n@pytest.mark.one_snapshot\ndef test_release(): pass\n"
        "@pytest.mark.long_run\n@pytest.mark.main_snapshot\ndef test_main(): pass\n"
        "def test_short(): pass\n"
    )
    (tests / "test_b.py").write_text(
        "import pytest\npytestmark = pytest.mark.nemo_rl\n"
        "@pytest.mark.long_run\ndef test_both(): pass\n"
    )
    monkeypatch.setattr(
        long_runs,
        "TURNS",
        (
            ("tests/test_a.py::test_release",),
            ("tests/test_a.py::test_main", "tests/test_b.py::test_both"),
        ),
    )
    assert long_runs.modules_of("0", "v0.7.0", tmp_path) == ["tests/test_a.py"]
    assert long_runs.modules_of("0", "main-7ea279ab", tmp_path) == []
    assert long_runs.modules_of("1", "v0.7.0", tmp_path) == ["tests/test_b.py"]
    assert long_runs.modules_of("1", "main", tmp_path) == ["tests/test_a.py", "tests/test_b.py"]
    assert long_runs.modules_of("all", "main", tmp_path) == ["tests/test_a.py", "tests/test_b.py"]
    assert long_runs.modules_of("none", "v0.7.0", tmp_path) == []


def test_every_turn_has_modules_on_some_snapshot_and_the_script_lists_them():
    script = [sys.executable, str(TESTS / "long_runs.py")]
    for turn in range(len(long_runs.TURNS)):
        listed = [
            subprocess.run(
                [*script, "modules", str(turn), ref], capture_output=True, text=True, check=True
            ).stdout.split()
            for ref in ("v0.7.0", "main")
        ]
        assert listed[0] + listed[1], f"turn {turn} trains on no snapshot"
        for module in listed[0] + listed[1]:
            assert (ROOT / module).is_file()


def test_each_turn_runs_the_alternating_tests_on_one_snapshot_and_both_take_turns():
    """Every turn names one snapshot for the tests marked ``alternating``, each snapshot gets
    them within the turns (so within as many commits), and they are tests both snapshots
    hold: marked for one snapshot or a long run, a test would skip turns of its own."""
    assert len(long_runs.ALTERNATING_ON) == len(long_runs.TURNS)
    assert set(long_runs.ALTERNATING_ON) == {"v0.7.0", "main"}
    script = [sys.executable, str(TESTS / "long_runs.py")]
    for turn, snapshot in enumerate(long_runs.ALTERNATING_ON):
        said = subprocess.run(
            [*script, "alternating", str(turn)], capture_output=True, text=True, check=True
        )
        assert said.stdout.strip() == snapshot
    assert long_runs.alternating_on("all") == long_runs.alternating_on("none") == "both"
    alternating = {
        name: marks for name, marks in long_runs.marked_tests().items() if "alternating" in marks
    }
    assert any("test_async_grpo_train_runs_dmpo" in name for name in alternating)
    assert any("test_vllm_generation.py" in name for name in alternating)
    for name, marks in alternating.items():
        assert "nemo_rl" in marks, f"{name}: alternating, but not in the NeMo-RL suite"
        for other in ("one_snapshot", "main_snapshot", "long_run", "beyond_ci"):
            assert other not in marks, f"{name} is alternating and {other}"


def selected(expression: str, marks: set[str]) -> bool:
    from _pytest.mark.expression import Expression

    return Expression.compile(expression).evaluate(lambda mark: mark in marks)


@pytest.mark.parametrize("turn", range(len(long_runs.TURNS)))
def test_the_sessions_selection_runs_every_test_where_the_turn_says(turn):
    """The ``-m`` expressions the NeMo-RL suite runs its sessions with (``selection``, which
    ``scripts/test_nemo_rl.sh`` prints through the CLI): an alternating test on exactly the
    turn's snapshot, a ``one_snapshot``/``main_snapshot`` test on its own, any other
    ``nemo_rl`` test on both; a checkout runs everything but ``beyond_ci``."""
    refs = ("v0.7.0", "main-7ea279ab")
    expressions = {ref: long_runs.selection(str(turn), ref) for ref in refs}
    script = [sys.executable, str(TESTS / "long_runs.py"), "selection", str(turn)]
    for ref in refs:
        printed = subprocess.run([*script, ref], capture_output=True, text=True, check=True)
        assert printed.stdout.strip() == expressions[ref]
    for name, marks in long_runs.marked_tests().items():
        if "nemo_rl" not in marks or "beyond_ci" in marks:
            assert not any(selected(expression, marks) for expression in expressions.values())
            continue
        on = {ref for ref in refs if selected(expressions[ref], marks)}
        assert on == {ref for ref in refs if long_runs.trains_on(marks, ref)} - (
            {ref for ref in refs if ref.split("-")[0] != long_runs.ALTERNATING_ON[turn]}
            if "alternating" in marks
            else set()
        ), name
        if "alternating" in marks:
            assert len(on) == 1, name
        elif not {"one_snapshot", "main_snapshot"} & marks:
            assert on == set(refs), name
        assert selected(long_runs.selection(str(turn), "checkout", checkout=True), marks), name
    assert "beyond_ci" not in long_runs.selection("all", "v0.7.0", beyond_ci=True)
    assert long_runs.selection("all", "v0.7.0") == long_runs.snapshot_selection("v0.7.0") + (
        " and not beyond_ci"
    )
