"""A Math-Verify grader that never stalls: a process pool with a hard budget per answer.

Math-Verify's own timeouts use SIGALRM (main thread only) and cannot interrupt C-level
sympy/bignum work, so an answer like ``9^{9^{9^9}}`` can hang a grader for ever. Here every
answer runs in a worker process; the parent waits at most ``timeout_seconds`` for it, then
kills that worker, starts a fresh one, and counts the answer as a timeout (incorrect).
Nothing raised in a worker reaches the caller: errors are verdicts too.

Scoring is NeMo-RL's math environment's (``HFVerifyWorker``): gold wrapped as
``"\\boxed{" + answer + "}"`` and parsed as LaTeX; the prediction parsed as an expression or
LaTeX; ``math_metric`` score 1.0 is correct. A score here equals the training reward.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from nemo_mmpo.errors import MMPOInputError


@dataclass(frozen=True)
class Verdict:
    """The grade of one answer: ``correct`` and how it was reached (``status``)."""

    correct: bool
    status: str = "ok"


def make_scorer():
    """The grading function of NeMo-RL's math environment: ``(gold, prediction) -> float``."""
    from math_verify.metric import math_metric
    from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig

    metric = math_metric(
        gold_extraction_target=(LatexExtractionConfig(),),
        pred_extraction_target=(ExprExtractionConfig(), LatexExtractionConfig()),
    )

    def score(gold: str, prediction: str) -> float:
        value, _ = metric(["\\boxed{" + gold + "}"], [prediction])
        return float(value)

    # Math-Verify imports its LaTeX and expression parsers on the first answer, inside its own
    # 5 s alarm (wall clock): on a loaded machine that first answer timed out ("Timeout during
    # parsing") and counted as wrong. One answer graded here takes those imports out of it.
    score("1", "1")
    return score


def grade_serially(gold: str, prediction: str, max_chars: int | None = None) -> Verdict:
    """Grade in this process (no budget beyond Math-Verify's own): the serial baseline."""
    if max_chars is not None and max(len(prediction), len(gold)) > max_chars:
        return Verdict(False, "too_long")
    global _SERIAL_SCORER
    if _SERIAL_SCORER is None:
        _SERIAL_SCORER = make_scorer()
    try:
        return Verdict(_SERIAL_SCORER(gold, prediction) >= 1.0)
    except BaseException:  # Math-Verify's TimeoutException derives from BaseException
        return Verdict(False, "error")


_SERIAL_SCORER = None


def _die_with_parent(lifeline: Connection) -> None:
    """Exit when the process that made this worker dies, even if grading is stuck.

    Linux: ``PR_SET_PDEATHSIG`` (a signal, so it works while C code holds the GIL). Anywhere:
    a thread that waits on a pipe whose only other end the parent holds (EOF when it dies).
    """
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(0)

    def watch() -> None:
        try:
            lifeline.recv()
        except (EOFError, OSError):
            pass
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def _worker_loop(connection: Connection, lifeline: Connection | None = None) -> None:
    if lifeline is not None:
        _die_with_parent(lifeline)
    score = make_scorer()
    connection.send(("ready", None))
    while True:
        try:
            task = connection.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if task is None:
            return
        gold, prediction = task
        try:
            verdict = ("ok", score(gold, prediction) >= 1.0)
        except BaseException:
            verdict = ("error", False)
        connection.send(verdict)


@dataclass
class _Worker:
    process: Any
    connection: Connection
    lifeline: Connection | None = None
    in_flight: deque = field(default_factory=deque)  # answers sent, oldest (running) first
    started: float = 0.0  # when the oldest in-flight answer started
    ready: bool = False


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float | None:
    """The CPU seconds process ``pid`` has spent (``/proc/PID/stat``), or None where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def default_workers() -> int:
    """The CPUs this process may use, at most 16 (each worker holds ~200 MB)."""
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:
        available = os.cpu_count() or 1
    return max(1, min(available, 16))


class VerifierPool:
    """Grade many answers in parallel, each within a hard wall-clock budget.

    Workers start with ``spawn`` (a fresh interpreter), never ``fork``: the caller may already
    hold CUDA or vLLM threads, which a forked child would inherit broken. ``spawn`` also makes
    the driver the workers' parent, so they exit when it dies, even while an answer is stuck
    in C code (see :func:`_die_with_parent`); a ``forkserver`` worker's parent is the fork
    server, which outlives a killed driver while its workers hold its pipe. Create the pool
    before any GPU work all the same (the CLI does).

    Each worker has up to two answers in flight (the one it grades, the next queued), so no
    round trip separates two answers; the budget of an answer starts when the previous one's
    verdict arrives.

    Args:
        num_workers: processes (default :func:`default_workers`).
        timeout_seconds: budget per answer (CLI ``--grade-timeout``); past it the worker is
            killed and replaced.
        max_chars: answers or golds longer than this are not parsed and count as
            ``too_long`` (CLI ``--max-answer-chars``). Default None: no limit, as NeMo-RL's
            math environment, so a grade here equals the training reward.
        start_method: ``spawn`` (default) or ``forkserver`` (``fork`` is refused).
    """

    PIPELINE_DEPTH = 16
    DRAIN_INTERVAL = 0.01  # seconds between the parent's wake-ups while pipelines are full
    POLL_S = 0.25  # seconds between readings of a starting worker's CPU time
    START_S = 120  # CPU seconds a starting worker may take to be ready
    START_WALL_S = 1800  # and wall-clock seconds (a start that spends no CPU is stuck)
    PIPELINE_MAX_BYTES = 16_000  # longer tasks are sent only to an idle worker (no pipe stall)

    def __init__(
        self,
        num_workers: int | None = None,
        timeout_seconds: float = 5.0,
        max_chars: int | None = None,
        start_method: str | None = None,
    ) -> None:
        if not timeout_seconds > 0:
            raise MMPOInputError(f"--grade-timeout {timeout_seconds} must be > 0 seconds")
        if num_workers is not None and (isinstance(num_workers, bool) or num_workers < 1):
            raise MMPOInputError(f"--grade-workers {num_workers} must be >= 1")
        if max_chars is not None and max_chars < 1:
            raise MMPOInputError(f"--max-answer-chars {max_chars} must be >= 1 (or unset)")
        if start_method is None:
            start_method = "spawn"
        if start_method not in ("forkserver", "spawn"):
            raise MMPOInputError(
                f"start_method={start_method!r}: use 'forkserver' or 'spawn' (a forked grader "
                "inherits the parent's CUDA and vLLM threads)"
            )
        self.num_workers = num_workers or default_workers()
        self.timeout_seconds = timeout_seconds
        self.max_chars = max_chars
        self.context = multiprocessing.get_context(start_method)
        self.workers: list[_Worker] = [self._start() for _ in range(self.num_workers)]
        self.counts: Counter[str] = Counter()
        self.replaced_workers = 0
        self.seconds_replacing = 0.0  # spent starting replacements (Math-Verify's import)

    def _start(self) -> _Worker:
        parent, child = self.context.Pipe()
        lifeline_reader, lifeline_writer = self.context.Pipe(duplex=False)
        process = self.context.Process(
            target=_worker_loop, args=(child, lifeline_reader), daemon=True
        )
        process.start()
        child.close()
        lifeline_reader.close()
        return _Worker(process, parent, lifeline_writer)

    @property
    def pids(self) -> list[int]:
        """Process ids of the current workers."""
        return [worker.process.pid for worker in self.workers]

    def _ensure_ready(self, position: int) -> None:
        """Wait for a worker's start-up; replace it if it died on the way."""
        worker = self.workers[position]
        if not worker.ready and not self._await_ready(worker):
            self.workers[position] = self._replace(worker)

    def _replace(self, worker: _Worker) -> _Worker:
        start = time.monotonic()
        worker.process.kill()
        worker.process.join(timeout=5)
        worker.connection.close()
        if worker.lifeline is not None:
            worker.lifeline.close()
        self.replaced_workers += 1
        replacement = self._start()
        self._await_ready(replacement)
        self.seconds_replacing += time.monotonic() - start
        return replacement

    @classmethod
    def _await_ready(cls, worker: _Worker) -> bool:
        """Wait for a worker's ``ready`` (Math-Verify imported and warmed up: a few CPU
        seconds) while it lives, up to ``START_S`` of its CPU seconds or ``START_WALL_S`` of
        wall clock: on a loaded machine a starting worker waiting for a core is not stuck."""
        started, started_cpu = time.monotonic(), cpu_seconds(worker.process.pid) or 0.0
        try:
            while not worker.connection.poll(cls.POLL_S):
                spent = cpu_seconds(worker.process.pid)
                if (
                    not worker.process.is_alive()
                    or (spent is not None and spent - started_cpu >= cls.START_S)
                    or time.monotonic() - started >= cls.START_WALL_S
                ):
                    return worker.ready
            if worker.connection.recv()[0] == "ready":
                worker.ready = True
        except (EOFError, OSError):
            pass
        return worker.ready

    def _too_long(self, gold: str, prediction: str) -> bool:
        return self.max_chars is not None and max(len(gold), len(prediction)) > self.max_chars

    def verify(self, golds: Sequence[str], predictions: Sequence[str]) -> list[Verdict]:
        """One :class:`Verdict` per (gold, prediction) pair, in order."""
        if len(golds) != len(predictions):
            raise MMPOInputError(
                f"{len(golds)} gold answers but {len(predictions)} predictions; pair them up"
            )
        tasks = [(str(g), str(p)) for g, p in zip(golds, predictions, strict=True)]
        verdicts: list[Verdict | None] = [None] * len(tasks)
        pending: deque[int] = deque()
        for index, (gold, prediction) in enumerate(tasks):
            if self._too_long(gold, prediction):
                verdicts[index] = Verdict(False, "too_long")
            else:
                pending.append(index)
        for position in range(len(self.workers)):
            self._ensure_ready(position)
        while pending or any(worker.in_flight for worker in self.workers):
            for position in range(len(self.workers)):
                self._fill(position, pending, tasks)
            busy = {w.connection: p for p, w in enumerate(self.workers) if w.in_flight}
            deadline = min(self.workers[p].started for p in busy.values()) + self.timeout_seconds
            if pending and all(len(w.in_flight) >= self.PIPELINE_DEPTH for w in self.workers):
                # every worker has queued work: let verdicts accumulate, drain them together
                time.sleep(max(0.0, min(self.DRAIN_INTERVAL, deadline - time.monotonic())))
            for connection in wait(list(busy), timeout=max(0.0, deadline - time.monotonic())):
                position = busy[connection]
                worker = self.workers[position]
                try:
                    while worker.in_flight and connection.poll():
                        status, correct = connection.recv()
                        verdicts[worker.in_flight.popleft()] = Verdict(bool(correct), status)
                        worker.started = time.monotonic()
                except (EOFError, OSError):  # the worker died (e.g. out of memory)
                    verdicts[worker.in_flight.popleft()] = Verdict(False, "error")
                    pending.extendleft(reversed(worker.in_flight))
                    self.workers[position] = self._replace(worker)
            now = time.monotonic()
            for position, worker in enumerate(self.workers):
                if worker.in_flight and now - worker.started >= self.timeout_seconds:
                    verdicts[worker.in_flight.popleft()] = Verdict(False, "timeout")
                    pending.extendleft(reversed(worker.in_flight))  # not started: retry
                    self.workers[position] = self._replace(worker)
        result = [
            verdict if verdict is not None else Verdict(False, "error") for verdict in verdicts
        ]
        self.counts.update(verdict.status for verdict in result)
        return result

    def _fill(self, position: int, pending: deque[int], tasks) -> None:
        """Send pending answers to worker ``position`` up to the pipeline depth."""
        while pending:
            worker = self.workers[position]
            index = pending[0]
            size = len(tasks[index][0]) + len(tasks[index][1])
            if worker.in_flight and (
                len(worker.in_flight) >= self.PIPELINE_DEPTH or size > self.PIPELINE_MAX_BYTES
            ):
                return
            pending.popleft()
            try:
                worker.connection.send(tasks[index])
            except (BrokenPipeError, OSError):  # found dead: replace, retry its answers
                pending.appendleft(index)
                pending.extendleft(reversed(worker.in_flight))
                self.workers[position] = self._replace(worker)
                continue
            if not worker.in_flight:
                worker.started = time.monotonic()
            worker.in_flight.append(index)

    def close(self) -> None:
        for worker in self.workers:
            try:
                worker.connection.send(None)
            except (BrokenPipeError, OSError):
                pass
            worker.process.join(timeout=2)
            if worker.process.is_alive():
                worker.process.kill()
            worker.connection.close()
            if worker.lifeline is not None:
                worker.lifeline.close()

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
