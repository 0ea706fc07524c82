"""CI's own machinery: an infrastructure failure is never read as a behaviour change, and the
log ends with each part's seconds and outcome.

``tests/nemo_rl_upstream/compare_outcomes.py`` compares NeMo-RL's unit-test outcomes with and
without ``install()``; a session whose every changed test errored in its set-up with one and
the same message (Ray's dashboard timing out on a loaded machine) "could not run" (exit 3, which
``scripts/test_nemo_rl.sh`` answers by running it once more and saying so), while a real change
stays a change (exit 1). The JUnit reports here are written by pytest itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "nemo_rl_upstream"))

import compare_outcomes  # noqa: E402

#: three tests sharing a session fixture, as NeMo-RL's unit tests share init_ray_cluster
TESTS = """
import os
import pytest

@pytest.fixture(scope="session")
def cluster():
    if os.environ.get("START_FAILS"):
        raise RuntimeError("Module MetricsHead failed to start. Timeout after 30.0 seconds")

def test_a(cluster):
    pass

def test_b(cluster):
    assert not os.environ.get("B_FAILS"), "b changed"

def test_c():
    pass
"""


def junit_report(tmp_path: Path, name: str, *tests: str, **environment: str) -> str:
    """pytest's own JUnit report of :data:`TESTS` (or of the ``tests`` ids named), run with
    ``environment`` set."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "test_units.py").write_text(textwrap.dedent(TESTS))
    report = folder / "report.xml"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={report}",
            *tests,
        ],
        cwd=folder,
        env={"PATH": "/usr/bin:/bin", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", **environment},
        capture_output=True,
        check=False,
    )
    return str(report)


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, str]:
    tmp_path = tmp_path_factory.mktemp("junit")
    return {
        "base": junit_report(tmp_path, "base"),
        "start_fails": junit_report(tmp_path, "start_fails", START_FAILS="1"),
        "b_fails": junit_report(tmp_path, "b_fails", B_FAILS="1"),
        "b_again": junit_report(tmp_path, "b_again", "test_units.py::test_b"),
        "b_fails_again": junit_report(
            tmp_path, "b_fails_again", "test_units.py::test_b", B_FAILS="1"
        ),
    }


def test_the_same_outcomes_agree(reports, capsys):
    assert compare_outcomes.compare(reports["base"], reports["base"]) == 0
    assert "same outcomes with and without install()" in capsys.readouterr().out


def test_one_set_up_error_shared_by_every_changed_test_could_not_run(reports, capsys):
    assert compare_outcomes.compare(reports["base"], reports["start_fails"]) == 3
    out = capsys.readouterr().out
    assert out.startswith("could not run: 2 test(s) errored with one and the same error")
    assert "not a change made by install()" in out
    assert "MetricsHead failed to start" in out
    assert "CHANGED" not in out


def test_a_failed_test_is_a_change(reports, capsys):
    assert compare_outcomes.compare(reports["base"], reports["b_fails"]) == 1
    out = capsys.readouterr().out
    assert "outcomes CHANGED by install() for 1 test(s)" in out
    assert "test_b: passed -> failure" in out


def test_errors_that_differ_or_are_not_set_up_errors_are_changes():
    changed = ["t::a", "t::b"]
    same = 'failed on setup with "RuntimeError: boom"'
    assert compare_outcomes.shared_start_up_error(changed, {"t::a": same, "t::b": same})
    assert compare_outcomes.shared_start_up_error(changed, {"t::a": same}) is None
    other = 'failed on setup with "RuntimeError: other"'
    assert compare_outcomes.shared_start_up_error(changed, {"t::a": same, "t::b": other}) is None
    teardown = 'failed on teardown with "RuntimeError: boom"'
    assert (
        compare_outcomes.shared_start_up_error(changed, {"t::a": teardown, "t::b": teardown})
        is None
    )
    assert compare_outcomes.shared_start_up_error([], {}) is None


def test_the_parts_table_lists_each_part_then_the_whole_run(tmp_path):
    parts = tmp_path / "parts"
    script = f"""
        source {ROOT / "scripts" / "parts.sh"}
        NEMO_MMPO_PARTS={parts}
        part_line "the 3.11 suite (2 workers)" 412 ok 801
        part_line "our tests on NeMo-RL main (Python 3.13)" 1290 "FAILED: 1 failed, 250 passed"
        parts_table {parts} 1800 "FAILED (exit 1)" 3400
    """
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    lines = out.strip().splitlines()
    assert lines[0].split() == ["part", "seconds", "CPU-s", "outcome"]
    assert lines[2].split() == ["the", "3.11", "suite", "(2", "workers)", "412", "801", "ok"]
    assert "1290        -  FAILED: 1 failed, 250 passed" in lines[3]  # no CPU-seconds given
    assert lines[-1].startswith("the whole run (wall clock)")
    assert lines[-1].endswith("1800     3400  FAILED (exit 1)")
    # without NEMO_MMPO_PARTS nothing is written anywhere
    quiet = f"source {ROOT / 'scripts' / 'parts.sh'}; unset NEMO_MMPO_PARTS; part_line a 1 ok"
    assert subprocess.run(["bash", "-c", quiet], capture_output=True, text=True).stdout == ""


class FakeRay:
    """``ray.init`` that fails like Ray's raylet start-up timeout ``failures`` times."""

    def __init__(self, failures: int, message: str) -> None:
        self.failures, self.message, self.calls, self.shutdowns = failures, message, [], 0

    def init(self, **kwargs):
        self.calls.append(kwargs)
        if len(self.calls) <= self.failures:
            raise Exception(self.message)  # Ray raises a bare Exception

    def shutdown(self):
        self.shutdowns += 1


def test_a_local_cluster_that_missed_rays_start_up_time_is_started_again_and_said(
    monkeypatch, capsys
):
    from nemo_mmpo.cpu.engines import ray_cluster

    pauses = []
    monkeypatch.setattr("time.sleep", pauses.append)
    timeout = "The current node timed out during startup. This could happen because ..."
    fake = FakeRay(2, timeout)
    monkeypatch.setitem(sys.modules, "ray", fake)
    ray_cluster.start_local_cluster(2, {"include_dashboard": False})
    assert [call["address"] for call in fake.calls] == ["local"] * 3
    assert fake.shutdowns == 2 and pauses == [10.0, 20.0]
    said = capsys.readouterr().err
    assert "again in 10 s (try 2 of 3)" in said and "again in 20 s (try 3 of 3)" in said

    thrice = FakeRay(3, timeout)  # the last try's timeout is Ray's error
    monkeypatch.setitem(sys.modules, "ray", thrice)
    with pytest.raises(Exception, match="timed out during startup"):
        ray_cluster.start_local_cluster(2, {})
    assert len(thrice.calls) == ray_cluster.RAYLET_START_TRIES == 3

    other = FakeRay(1, "some other error")  # any other error is not retried
    monkeypatch.setitem(sys.modules, "ray", other)
    with pytest.raises(Exception, match="some other error"):
        ray_cluster.start_local_cluster(2, {})
    assert len(other.calls) == 1


def test_a_changed_test_runs_again_and_only_a_change_that_repeats_fails(reports, capsys):
    """``--changed`` names the changed tests as pytest ids (``scripts/test_nemo_rl.sh`` runs
    them once more with ``install()``); ``--rerun`` takes their second outcomes and says so."""
    checkout = str(Path(reports["b_fails"]).parent)
    assert compare_outcomes.main(["--changed", reports["base"], reports["b_fails"], checkout]) == 0
    assert capsys.readouterr().out == "test_units.py::test_b\n"
    arguments = [reports["base"], reports["b_fails"]]
    assert compare_outcomes.main([*arguments, f"--rerun={reports['b_again']}"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("same outcomes with and without install() (3 passed")
    assert "1 test(s) whose outcome differed on the first run ran again" in out
    assert compare_outcomes.main([*arguments, f"--rerun={reports['b_fails_again']}"]) == 1
    out = capsys.readouterr().out
    assert "outcomes CHANGED by install() for 1 test(s), also when run once more" in out
    assert "test_b: passed -> failure" in out


def slurm_cpu_group(script: str, **environment: str) -> subprocess.CompletedProcess:
    """``script`` run by bash after ``scripts/slurm_test_lib.sh`` (its ``enter_cpu_group`` and
    ``leave_cpu_group``), with ``environment`` added."""
    return subprocess.run(
        ["bash", "-c", f"source {ROOT / 'scripts' / 'slurm_test_lib.sh'}; {script}"],
        capture_output=True,
        text=True,
        env={**os.environ, "NEMO_MMPO_PARTS": "", **environment},
        timeout=60,
    )


def test_the_slurm_suites_cpu_group_is_entered_weighted_and_left_or_its_absence_said():
    """The Slurm suite's CPU cgroup (Ray's raylet aborts when its agent misses a fixed 15 s on
    a busy machine): its shell moves in with the weight asked for and back out, the group gone;
    where this machine cannot make one (not root, no writable CPU controller) one line says
    why; ``SLURM_TEST_CPU_WEIGHT=0`` asks for none, and a weight that is not a number is
    refused in one line naming it."""
    inside = slurm_cpu_group(
        "enter_cpu_group; grep -E ':cpu(,[a-z]*)?:|^0::' /proc/$$/cgroup; "
        "cat /sys/fs/cgroup/cpu/nemo-mmpo-slurm/cpu.shares "
        "/sys/fs/cgroup/nemo-mmpo-slurm/cpu.weight 2>/dev/null; leave_cpu_group; "
        "ls -d /sys/fs/cgroup/cpu/nemo-mmpo-slurm /sys/fs/cgroup/nemo-mmpo-slurm 2>/dev/null; "
        "grep -c nemo-mmpo-slurm /proc/$$/cgroup; true",
        SLURM_TEST_CPU_WEIGHT="3",
    )
    assert inside.returncode == 0, inside.stderr
    said, *rest = inside.stdout.splitlines()
    if said.startswith("slurm CPU group: ok"):
        assert "3 times a session's weight" in said
        assert any(line.endswith("/nemo-mmpo-slurm") for line in rest)  # moved in
        assert str(3 * 1024) in rest or str(3 * 100) in rest  # v1 shares, or v2 weight
        assert rest[-1] == "0"  # back out, and no folder listed: the group is gone
        assert not any(line.startswith("/sys/fs/cgroup") for line in rest)
    else:
        assert said.startswith("slurm CPU group: none (") and "share the CPU" in said

    none = slurm_cpu_group(
        "enter_cpu_group; grep -c nemo-mmpo-slurm /proc/$$/cgroup", SLURM_TEST_CPU_WEIGHT="0"
    )
    assert none.stdout.splitlines() == [
        "slurm CPU group: none (SLURM_TEST_CPU_WEIGHT=0): the jobs share the CPU as any "
        "process does",
        "0",
    ]
    refused = slurm_cpu_group("enter_cpu_group; echo went on", SLURM_TEST_CPU_WEIGHT="lots")
    assert refused.returncode == 2
    assert refused.stdout.strip() == (
        "slurm CPU group: SLURM_TEST_CPU_WEIGHT=lots is not a whole number: unset it (4) or "
        "give one (0: no group)"
    )


def test_a_parts_cpu_seconds_count_what_it_starts_or_say_they_are_not_counted(tmp_path):
    """``part_cpu_begin KEY`` puts the shell, and what it starts, in a cpuacct group under
    ``NEMO_MMPO_CPU_GROUPS`` (scripts/test.sh makes one where it can: root, cgroup v1);
    ``part_cpu_seconds KEY`` reads the CPU-seconds it counted, a nested key's too, or "-"
    where nothing is counted."""
    parts = ROOT / "scripts" / "parts.sh"
    spin = "import time; end = time.process_time() + 1.2\nwhile time.process_time() < end: pass"
    burn = f"{sys.executable} -c '{spin}'"  # 1.2 CPU-seconds
    # under set -e, as the suites' scripts run, with no groups or a folder that is not a cgroup:
    # nothing counted is no error (a session's shell that stopped there never wrote its exit
    # status, and read as failed)
    for groups in ("", str(tmp_path / "not-a-cgroup")):
        uncounted = subprocess.run(
            [
                "bash",
                "-c",
                f"set -euo pipefail; source {parts}; part_cpu_begin a; {burn}; "
                "part_cpu_seconds a; echo went on",
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "NEMO_MMPO_CPU_GROUPS": groups},
            timeout=60,
        )
        assert uncounted.stdout.split() == ["-", "went", "on"], (groups, uncounted.stderr)
        assert uncounted.returncode == 0
    cpuacct = Path("/sys/fs/cgroup/cpuacct")
    if os.geteuid() != 0 or not (cpuacct / "cpuacct.usage").is_file():
        pytest.skip("no cgroup v1 cpuacct to write here (root only): the column says -")
    groups = cpuacct / f"nemo-mmpo-test-{os.getpid()}"
    script = f"""
        source {parts}
        (part_cpu_begin outer && {burn} && (part_cpu_begin outer/inner && exec {burn}))
        echo "$(part_cpu_seconds outer) $(part_cpu_seconds outer/inner) $(part_cpu_seconds none)"
    """
    try:
        counted = subprocess.run(
            ["bash", "-c", script],
            capture_output=True,
            text=True,
            env={**os.environ, "NEMO_MMPO_CPU_GROUPS": str(groups)},
            timeout=120,
        )
        outer, inner, none = counted.stdout.split()
        assert int(outer) >= 2 and int(inner) >= 1  # whole seconds: 2.4 and 1.2 burnt, at least
        assert none == "-"
    finally:
        for folder in [*sorted(groups.rglob("*"), reverse=True), groups]:
            if folder.is_dir():
                folder.rmdir()
