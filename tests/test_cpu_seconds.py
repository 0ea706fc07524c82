"""``tests/cpu_seconds.py`` gives each test the CPU its process tree spent while it ran: a
child process's CPU goes to the test that started it, an idle test gets none, and the plugin
stays silent unless ``NEMO_MMPO_CPU_SECONDS`` asks for it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import patience
import pytest

from tests.conftest import TESTS

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads /proc")

#: the child burns 1.5 CPU-seconds (its own clock, whatever the machine's load), then lives 1.5 s
#: more, so a reading (once a second) sees all of it
CASES = """
import subprocess, sys, time

BURN = (
    "import time\\n"
    "while time.process_time() < 1.5:\\n"
    "    pass\\n"
    "time.sleep(1.5)\\n"
)


def test_a_child_burns():
    subprocess.run([sys.executable, "-c", BURN], check=True)


def test_idle():
    time.sleep(1.5)
"""


def run(tmp_path: Path, setting: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "test_cases.py").write_text(CASES)
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), str(tmp_path)]))
    environment.pop("NEMO_MMPO_CPU_SECONDS", None)
    if setting is not None:
        environment["NEMO_MMPO_CPU_SECONDS"] = setting
    return patience.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "cpu_seconds"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=patience.COMMAND_S,
    )


def test_the_child_processes_cpu_goes_to_the_test_that_started_it(tmp_path):
    result = run(tmp_path, "5")
    assert result.returncode == 0, result.stdout + result.stderr
    spent = {
        test: float(seconds)
        for seconds, test in re.findall(
            r"^\s*([\d.]+) cpu-s\s+[\d.]+ s\s+(\S+)$", result.stdout, re.M
        )
    }
    assert spent["test_cases.py::test_a_child_burns"] >= 1.4, result.stdout
    assert spent["test_cases.py::test_idle"] < 0.5, result.stdout
    assert re.search(r"^cpu-seconds: \d+ in all over \d+ s of wall clock", result.stdout, re.M)


def test_silent_unless_asked(tmp_path):
    result = run(tmp_path, None)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "cpu-s" not in result.stdout and "CPU-seconds" not in result.stdout
