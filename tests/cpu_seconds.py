"""A pytest plugin: each test's CPU-seconds, its own process and every process under it.

CI on 2 cores is CPU-bound (docs/testing.md, "CI"): a test's wall-clock seconds there say how
long it waited for a core as much as how much it costs, and the two NeMo-RL sessions run side
by side. What a test costs is the CPU its process tree spends: pytest's process, its
subprocesses, the Ray cluster a run starts (``ray.init`` starts its daemons as children, they
start the workers) and vLLM's engine processes. A thread reads ``/proc`` every second and adds
each process's CPU-seconds since the last reading to the test running at that moment; a process
seen once in the tree stays counted after its parent exits (it is reparented). Not counted: a
process that starts and ends between two readings (under a second of CPU), and a module- or
session-scoped fixture's work lands on the first test that asks for it, as in ``--durations``.

On where ``NEMO_MMPO_CPU_SECONDS`` is set (to how many tests to show; ``tests/conftest.py``
loads the plugin; Linux only, and not under pytest-xdist, whose workers run the tests): prints
that many costliest tests at the end of the session, with the tree's total and the session's
wall-clock seconds. ``scripts/test_nemo_rl.sh`` sets it for the NeMo-RL sessions.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

PROC = Path("/proc")
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
INTERVAL_S = 1.0
OUTSIDE_TESTS = "(between tests: collection, session fixtures' teardown)"


def read_processes() -> dict[tuple[int, int], tuple[int, float]]:
    """``{(pid, start time in ticks): (parent pid, CPU-seconds so far)}`` of every process."""
    processes = {}
    for entry in os.scandir(PROC):
        if not entry.name.isdigit():
            continue
        try:
            text = (PROC / entry.name / "stat").read_text()
        except OSError:  # it ended meanwhile
            continue
        # the name (field 2) may hold spaces and parentheses: fields after the last ")"
        fields = text[text.rindex(")") + 2 :].split()
        parent, start = int(fields[1]), int(fields[19])
        processes[(int(entry.name), start)] = (parent, (int(fields[11]) + int(fields[12])) / TICKS)
    return processes


class CPUSeconds:
    """Attributes the CPU of pytest's process tree to the running test, once a second."""

    def __init__(self) -> None:
        self.root = os.getpid()
        self.ours: set[tuple[int, int]] = set()  # (pid, start) seen in the tree, still running
        self.last: dict[tuple[int, int], float] = {}  # their CPU-seconds at the last reading
        self.spent: Counter[str] = Counter()  # test id -> CPU-seconds
        self.wall: Counter[str] = Counter()
        self.current = OUTSIDE_TESTS
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.started = time.monotonic()
        self.reading()  # pytest's own CPU so far (interpreter start, imports) is not a test's
        self.spent.clear()
        self.thread = threading.Thread(target=self.run, name="cpu_seconds", daemon=True)
        self.thread.start()

    def reading(self) -> None:
        processes = read_processes()
        children: dict[int, list[tuple[int, int]]] = {}
        for key, (parent, _) in processes.items():
            children.setdefault(parent, []).append(key)
        tree = [key for key in processes if key[0] == self.root]
        while tree:
            key = tree.pop()
            self.ours.add(key)
            tree.extend(children.get(key[0], []))
        self.ours &= processes.keys()  # an ended process's key never comes back
        now = {key: processes[key][1] for key in self.ours}
        spent = sum(cpu - self.last.get(key, 0.0) for key, cpu in now.items())
        self.last = now
        with self.lock:
            self.spent[self.current] += spent

    def run(self) -> None:
        while not self.stop.wait(INTERVAL_S):
            try:
                self.reading()
            except Exception:  # a measurement never fails a test session
                return

    def enter(self, test: str) -> None:
        self.reading()  # what ran before it belongs to the test before
        with self.lock:
            self.current = test

    def leave(self, test: str, seconds: float) -> None:
        self.reading()
        with self.lock:
            self.current = OUTSIDE_TESTS
            self.wall[test] += seconds

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.reading()


def pytest_configure(config: pytest.Config) -> None:
    if (
        os.environ.get("NEMO_MMPO_CPU_SECONDS")
        and PROC.joinpath("self", "stat").is_file()
        and not hasattr(config, "workerinput")
        and not getattr(config.option, "numprocesses", None)
    ):
        config._cpu_seconds = CPUSeconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    meter = getattr(item.config, "_cpu_seconds", None)
    started = time.monotonic()
    if meter is not None:
        meter.enter(item.nodeid)
    yield
    if meter is not None:
        meter.leave(item.nodeid, time.monotonic() - started)


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    meter = getattr(config, "_cpu_seconds", None)
    if meter is None:
        return
    meter.finish()
    setting = os.environ["NEMO_MMPO_CPU_SECONDS"]
    shown = int(setting) if setting.isdigit() else 30
    total = sum(meter.spent.values())
    wall = time.monotonic() - meter.started
    terminalreporter.write_sep("=", f"CPU-seconds of each test's process tree (top {shown})")
    for test, seconds in meter.spent.most_common(shown):
        terminalreporter.write_line(f"{seconds:8.1f} cpu-s {meter.wall[test]:8.1f} s  {test}")
    terminalreporter.write_line(
        f"cpu-seconds: {total:.0f} in all over {wall:.0f} s of wall clock "
        f"({total / max(wall, 1.0):.2f} cores on average), {len(meter.wall)} tests"
    )
