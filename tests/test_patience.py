"""tests/patience.py's run: subprocess.run whose deadline counts the seconds a command could run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import patience
import pytest


def readings(*values: dict[int, float]):
    """A reader that returns ``values`` one after the other."""
    queue = list(values)
    return lambda: queue.pop(0)


def test_a_poll_counts_its_seconds_less_the_longest_wait_for_a_core():
    counted = patience.Patience(readings({1: 0.0}, {1: 0.25, 2: 0.5}, {1: 0.25}, {1: 9.0}))
    assert counted.poll(1.0) == pytest.approx(0.5)  # a new process's whole wait counts
    assert counted.poll(1.0) == pytest.approx(1.5)  # asleep (or hung): every second counts
    assert counted.poll(1.0) == pytest.approx(1.5)  # starved the whole poll: none
    assert counted.waited_s == pytest.approx(1.5)


def test_without_schedstat_it_is_the_wall_clock():
    counted = patience.Patience(lambda: {})
    assert counted.poll(1.0) + counted.poll(2.0) == pytest.approx(1.0 + 3.0)


def test_it_returns_what_subprocess_run_returns():
    result = patience.run(
        [sys.executable, "-c", "import sys; print(sys.stdin.read().upper()); sys.exit(3)"],
        input="dry run",
        capture_output=True,
        text=True,
    )
    assert (result.returncode, result.stdout, result.stderr) == (3, "DRY RUN\n", "")
    with pytest.raises(subprocess.CalledProcessError):
        patience.run([sys.executable, "-c", "raise SystemExit(1)"], check=True)


def test_a_command_that_sleeps_past_its_deadline_is_killed_and_said():
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired, match=r"ran \d+ s, and waited \d+ s for a core"):
        patience.run(["sleep", "60"], timeout=2)
    assert time.monotonic() - started < 30


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")
def test_a_starved_process_is_seen_waiting_for_a_core():
    """At nice 19 beside a busy process at nice 0 on the same core, Linux's scheduler gives it
    about 1.5 % of the core (weights 15 and 1024): it waits nearly all the time."""
    if shutil.which("taskset") is None or not os.path.exists(f"/proc/{os.getpid()}/schedstat"):
        pytest.skip("needs taskset and /proc/PID/schedstat")
    core = str(min(os.sched_getaffinity(0)))
    spin = [sys.executable, "-c", "while True: pass"]
    busy = subprocess.Popen(["taskset", "-c", core, *spin])
    starved = subprocess.Popen(["nice", "-n", "19", "taskset", "-c", core, *spin])
    try:
        time.sleep(1.0)  # both started and spinning
        before = patience.waits_for_a_core(starved.pid)[(starved.pid, starved.pid)]
        time.sleep(2.0)
        waited = patience.waits_for_a_core(starved.pid)[(starved.pid, starved.pid)] - before
    finally:
        busy.kill()
        starved.kill()
        busy.wait()
        starved.wait()
    assert waited > 1.0  # of 2 s
