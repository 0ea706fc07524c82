"""How long a test waits for a process before it calls it a hang.

These limits catch hangs, not slowness. CI machines are shared: beside a busy neighbour a 2-core
machine runs a step several times slower than when quiet, and a limit set a few times above a
quiet run's time turns that neighbour into a failed test (an infrastructure hiccup read as a
behaviour change). So every limit here is far above what a quiet run needs; how fast things are
is measured in ``benchmarks/``, never by a test's deadline.

A limit is not enough where the process runs at a low priority beside a busy one: the 3.11
suite runs at nice 19 in CI (``scripts/test.sh``), and with a CPU-bound process at nice 0 beside
CI its ~5 CPU-second dry run got too little of a core to end in 600 s (the fresh-clone CI of
d33d8ca, 2026-11-29). So a short command runs through :func:`run`, whose deadline counts only
the seconds the command could run: the wall clock less the time it waited for a core.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

#: a short command (a dry run, the CLI, a docs block): seconds on a quiet machine
COMMAND_S = 600
#: a training run, the watcher, a killed run reaching its step: minutes on a quiet machine
RUN_S = 3600
#: a gloo collective between rank processes, which reach it at different times (each rank
#: imports Megatron and builds its worker at its own speed on a loaded machine)
COLLECTIVE_S = 900
#: how often :func:`run` reads the command's processes
POLL_S = 1.0

PROC = Path("/proc")


def waits_for_a_core(root: int) -> dict[tuple[int, int], float]:
    """``{(pid, thread id): seconds it has waited on a run queue}`` for every thread of ``root``
    and of every process under it (Linux's ``/proc/PID/task/TID/schedstat``, second field);
    empty where the kernel does not say."""
    from cpu_seconds import read_processes  # beside this file, on the tests' sys.path

    children: dict[int, list[int]] = {}
    for (pid, _), (parent, _) in read_processes().items():
        children.setdefault(parent, []).append(pid)
    tree, seen = [root], {}
    while tree:
        pid = tree.pop()
        try:
            threads = os.listdir(PROC / str(pid) / "task")
        except OSError:
            continue
        for thread in threads:
            try:
                schedstat = (PROC / str(pid) / "task" / thread / "schedstat").read_text()
                seen[(pid, int(thread))] = int(schedstat.split()[1]) / 1e9
            except (OSError, IndexError, ValueError):
                continue
        tree.extend(children.get(pid, []))
    return seen


class Patience:
    """The seconds a command could run, read once a poll: each poll's wall-clock seconds less
    the longest wait for a core of any of its processes over that poll (a process that waited
    the whole poll, starved by busier ones, adds nothing; a sleeping or hung one waits for no
    core, and its seconds count)."""

    def __init__(self, reader: Callable[[], dict]) -> None:
        self.reader = reader
        self.last = reader()
        self.runnable_s = 0.0
        self.waited_s = 0.0

    def poll(self, wall_s: float) -> float:
        """Adds a poll of ``wall_s`` seconds; returns the seconds the command could run so far."""
        now = self.reader()
        waited = max((now[pid] - self.last.get(pid, 0.0) for pid in now), default=0.0)
        waited = min(max(waited, 0.0), wall_s)
        self.last = now
        self.waited_s += waited
        self.runnable_s += wall_s - waited
        return self.runnable_s


class Deadline:
    """``seconds`` that the process ``pid`` and every process under it could run
    (:class:`Patience`), read at most once a poll: ``passed()`` in a waiting loop, in place of
    the wall clock."""

    def __init__(self, seconds: float, pid: int) -> None:
        self.seconds = seconds
        self.patience = Patience(lambda: waits_for_a_core(pid))
        self.started = self.polled = time.monotonic()

    def passed(self) -> bool:
        now = time.monotonic()
        if now - self.polled >= POLL_S:
            self.patience.poll(now - self.polled)
            self.polled = now
        return self.patience.runnable_s >= self.seconds

    def __str__(self) -> str:
        return (
            f"ran {self.patience.runnable_s:.0f} s, and waited {self.patience.waited_s:.0f} s for "
            f"a core, in {time.monotonic() - self.started:.0f} s of wall clock"
        )


def run(
    command: Sequence[str] | str,
    *,
    timeout: float = COMMAND_S,
    check: bool = False,
    input=None,
    capture_output: bool = False,
    **popen_arguments,
) -> subprocess.CompletedProcess:
    """:func:`subprocess.run`, whose ``timeout`` counts the seconds the command could run: the
    wall clock less the time its processes waited for a core (a starved command is slow, not
    hung). On a kernel that does not say (no ``/proc/PID/schedstat``) it is the wall clock.
    A command past it is killed and :class:`subprocess.TimeoutExpired` says both times."""
    if capture_output:
        popen_arguments["stdout"] = popen_arguments["stderr"] = subprocess.PIPE
    if input is not None:
        popen_arguments["stdin"] = subprocess.PIPE
    with subprocess.Popen(command, **popen_arguments) as process:
        deadline = Deadline(timeout, process.pid)
        while True:
            try:
                output, errors = process.communicate(input, timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                if deadline.passed():
                    process.kill()
                    output, errors = process.communicate()
                    raise subprocess.TimeoutExpired(
                        f"{command} ({deadline})", timeout, output, errors
                    ) from None
    result = subprocess.CompletedProcess(command, process.returncode, output, errors)
    if check:
        result.check_returncode()
    return result
