"""``scripts/pytest_then_exit.py`` skips only the interpreter's teardown: a failing test, and a
crash while a test runs, still fail the NeMo-RL suite; a crash after pytest has reported does
not change pytest's status."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import patience
import pytest

from tests.conftest import ROOT

WRAPPER = ROOT / "scripts" / "pytest_then_exit.py"

TESTS = {
    "passes": "def test_passes():\n    pass\n",
    "fails": "def test_fails():\n    assert False\n",
    "crashes_in_a_test": "import ctypes\n\ndef test_crashes():\n    ctypes.string_at(0)\n",
    "crashes_at_exit": (
        "import atexit, ctypes\n\natexit.register(lambda: ctypes.string_at(0))\n\n"
        "def test_passes():\n    pass\n"
    ),
}


def run(tmp_path: Path, body: str, wrapper: bool) -> subprocess.CompletedProcess:
    (tmp_path / "test_case.py").write_text(body)
    runner = [str(WRAPPER)] if wrapper else ["-m", "pytest"]
    return patience.run(
        [sys.executable, "-X", "faulthandler", *runner, "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=patience.COMMAND_S,
    )


@pytest.mark.parametrize(
    ("case", "status"),
    [("passes", 0), ("fails", 1), ("crashes_in_a_test", -11), ("crashes_at_exit", 0)],
)
def test_the_status_is_pytests_own(tmp_path, case, status):
    result = run(tmp_path, TESTS[case], wrapper=True)
    assert result.returncode == status, result.stdout + result.stderr
    if case == "crashes_in_a_test":  # the traceback names where
        assert "Fatal Python error: Segmentation fault" in result.stderr
        assert "test_crashes" in result.stderr


def test_plain_pytest_turns_the_exit_crash_red(tmp_path):
    """The case the wrapper exists for, without it: every test passed, the process crashed."""
    result = run(tmp_path, TESTS["crashes_at_exit"], wrapper=False)
    assert " passed" in result.stdout
    assert result.returncode == -11
