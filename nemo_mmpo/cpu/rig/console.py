"""What a person sees during a tiny run: one line per step; NeMo-RL's own output in a file.

NeMo-RL's trainers print tens of lines per step (timings, tables, and "Skipping aggregation"
for metrics they log themselves). :func:`output_to_file` sends everything written to the
process's stdout and stderr (file descriptors 1 and 2, so C-level and subprocess output too)
to a log file, and hands back a stream to the terminal; :class:`ProgressLogger` wraps NeMo-RL's
``Logger`` and writes one line per training step there::

    step  12/300  reward 0.453  mean(last 10) 0.441  0.41 s/step  elapsed 0:05  left 1:58
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO


@contextmanager
def output_to_file(path: Path) -> Iterator[TextIO]:
    """Send stdout and stderr (fds 1 and 2) to ``path`` (appended) while the block runs;
    yields a line-buffered stream to the original stdout."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    console = os.fdopen(os.dup(saved[0]), "w", buffering=1)
    with open(path, "a", buffering=1) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield console
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            console.close()


def _clock(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


class ProgressLogger:
    """NeMo-RL's ``Logger`` (every call delegated), plus one progress line per training step.

    Args:
        logger: NeMo-RL's ``Logger``.
        total_steps: ``grpo.max_num_steps``.
        stream: where the progress lines go.
        window: steps in the running mean of the reward.
    """

    def __init__(self, logger: Any, total_steps: int, stream: TextIO, window: int = 10) -> None:
        self._logger = logger
        self._total = total_steps
        self._stream = stream
        self._recent: deque[float] = deque(maxlen=window)
        self._started = time.monotonic()
        self._last = self._started
        self._steps_seen = 0
        #: ``time.monotonic()`` of the last metrics NeMo-RL logged (a step or an evaluation),
        #: and the last training step: what the driver's stall watch reads
        self.last_logged = self._started
        self.last_step = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger, name)

    def log_metrics(self, metrics: dict[str, Any], step: int, prefix: str = "", *args, **kwargs):
        result = self._logger.log_metrics(metrics, step, prefix, *args, **kwargs)
        self.last_logged = time.monotonic()
        if prefix == "train" and "reward" in metrics:
            self.last_step = step
            self._line(float(metrics["reward"]), step)
        if prefix == "validation" and "paper/average" in metrics:
            passes = {
                key.rsplit("/", 1)[1]: value
                for key, value in metrics.items()
                if key.startswith("paper/") and "/pass@" in key
            }
            shown = "  ".join(
                f"{k} {v:.3f}" for k, v in passes.items() if k in ("pass@1", "pass@16")
            )
            self.note(
                f"evaluation at step {step}: average {metrics['paper/average']:.3f}  {shown}  "
                f"never solved {metrics.get('paper/never_solved', float('nan')):.3f}"
            )
        return result

    def _line(self, reward: float, step: int) -> None:
        now = time.monotonic()
        per_step = now - self._last
        self._last = now
        self._steps_seen += 1
        self._recent.append(reward)
        elapsed = now - self._started
        left = elapsed / self._steps_seen * max(self._total - step, 0)
        window = f"mean(last {len(self._recent)}) {sum(self._recent) / len(self._recent):.3f}"
        self._stream.write(
            f"step {step:>4}/{self._total}  reward {reward:.3f}  {window}  {per_step:.2f} s/step"
            f"  elapsed {_clock(elapsed)}  left {_clock(left)}\n"
        )
        self._stream.flush()

    def note(self, message: str) -> None:
        """A line of our own (warm start, resume, where things were written)."""
        self._stream.write(f"[nemo-mmpo] {message}\n")
        self._stream.flush()
