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
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from nemo_mmpo.errors import MMPOInputError

STATUSES = ("ok", "timeout", "error", "too_long")
DEFAULT_MAX_CHARS = 20_000


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

    return score


def grade_serially(gold: str, prediction: str, max_chars: int = DEFAULT_MAX_CHARS) -> Verdict:
    """Grade in this process (no budget beyond Math-Verify's own): the serial baseline."""
    if len(prediction) > max_chars or len(gold) > max_chars:
        return Verdict(False, "too_long")
    global _SERIAL_SCORER
    if _SERIAL_SCORER is None:
        _SERIAL_SCORER = make_scorer()
    try:
        return Verdict(_SERIAL_SCORER(gold, prediction) >= 1.0)
    except BaseException:  # Math-Verify's TimeoutException derives from BaseException
        return Verdict(False, "error")


_SERIAL_SCORER = None


def _worker_loop(connection: Connection) -> None:
    score = make_scorer()
    connection.send(("ready", None))
    while True:
        task = connection.recv()
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
    index: int | None = None  # the answer it is grading
    started: float = 0.0
    ready: bool = False


class VerifierPool:
    """Grade many answers in parallel, each within a hard wall-clock budget.

    Args:
        num_workers: processes (default: CPU count).
        timeout_seconds: budget per answer; past it the worker is killed and replaced.
        max_chars: longer answers or golds are not parsed and count as ``too_long``.
        start_method: multiprocessing start method; default "fork" where available (no
            ``if __name__ == "__main__"`` guard needed in the caller's script), else "spawn".
    """

    def __init__(
        self,
        num_workers: int | None = None,
        timeout_seconds: float = 5.0,
        max_chars: int = DEFAULT_MAX_CHARS,
        start_method: str | None = None,
    ) -> None:
        if timeout_seconds <= 0:
            raise MMPOInputError(f"timeout_seconds={timeout_seconds} must be > 0")
        self.num_workers = num_workers or os.cpu_count() or 1
        self.timeout_seconds = timeout_seconds
        self.max_chars = max_chars
        if start_method is None:
            available = multiprocessing.get_all_start_methods()
            start_method = "fork" if "fork" in available else "spawn"
        self.context = multiprocessing.get_context(start_method)
        self.workers: list[_Worker] = [self._start() for _ in range(self.num_workers)]
        self.counts: Counter[str] = Counter()
        self.replaced_workers = 0

    def _start(self) -> _Worker:
        parent, child = self.context.Pipe()
        process = self.context.Process(target=_worker_loop, args=(child,), daemon=True)
        process.start()
        child.close()
        return _Worker(process, parent)

    def _ensure_ready(self, position: int) -> None:
        """Wait for a worker's start-up; replace it if it died on the way."""
        worker = self.workers[position]
        if not worker.ready and not self._await_ready(worker):
            self.workers[position] = self._replace(worker)

    def _replace(self, worker: _Worker) -> _Worker:
        worker.process.kill()
        worker.process.join(timeout=5)
        worker.connection.close()
        self.replaced_workers += 1
        replacement = self._start()
        self._await_ready(replacement)
        return replacement

    @staticmethod
    def _await_ready(worker: _Worker) -> bool:
        try:
            if worker.connection.poll(120) and worker.connection.recv()[0] == "ready":
                worker.ready = True
        except (EOFError, OSError):
            pass
        return worker.ready

    def verify(self, golds: Sequence[str], predictions: Sequence[str]) -> list[Verdict]:
        """One :class:`Verdict` per (gold, prediction) pair, in order."""
        if len(golds) != len(predictions):
            raise MMPOInputError(
                f"{len(golds)} gold answers but {len(predictions)} predictions; pair them up"
            )
        verdicts: list[Verdict | None] = [None] * len(golds)
        pending: deque[int] = deque()
        for index, (gold, prediction) in enumerate(zip(golds, predictions, strict=True)):
            if len(str(prediction)) > self.max_chars or len(str(gold)) > self.max_chars:
                verdicts[index] = Verdict(False, "too_long")
            else:
                pending.append(index)
        for position in range(len(self.workers)):
            self._ensure_ready(position)
        while pending or any(worker.index is not None for worker in self.workers):
            for position in range(len(self.workers)):
                if self.workers[position].index is None and pending:
                    self._assign(position, pending.popleft(), golds, predictions)
            busy = {w.connection: p for p, w in enumerate(self.workers) if w.index is not None}
            deadline = min(self.workers[p].started for p in busy.values()) + self.timeout_seconds
            for connection in wait(list(busy), timeout=max(0.0, deadline - time.monotonic())):
                position = busy[connection]
                worker = self.workers[position]
                try:
                    status, correct = connection.recv()
                except (EOFError, OSError):  # the worker died (e.g. out of memory)
                    status, correct = "error", False
                    self.workers[position] = self._replace(worker)
                verdicts[worker.index] = Verdict(bool(correct), status)
                worker.index = None
            now = time.monotonic()
            for position, worker in enumerate(self.workers):
                if worker.index is not None and now - worker.started >= self.timeout_seconds:
                    verdicts[worker.index] = Verdict(False, "timeout")
                    self.workers[position] = self._replace(worker)
        result = [
            verdict if verdict is not None else Verdict(False, "error") for verdict in verdicts
        ]
        self.counts.update(verdict.status for verdict in result)
        return result

    def _assign(self, position: int, index: int, golds, predictions) -> None:
        """Send answer ``index`` to worker ``position``, replacing the worker if it is gone."""
        task = (str(golds[index]), str(predictions[index]))
        try:
            self.workers[position].connection.send(task)
        except (BrokenPipeError, OSError):
            self.workers[position] = self._replace(self.workers[position])
            self.workers[position].connection.send(task)
        self.workers[position].index = index
        self.workers[position].started = time.monotonic()

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

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
