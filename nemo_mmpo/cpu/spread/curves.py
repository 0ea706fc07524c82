"""Training curves of tiny runs from the TensorBoard events NeMo-RL's logger wrote.

:func:`reward_curve` reads one run; :func:`window_means` gives the README's 50-step means;
:func:`plot_reward_bands` draws, per method, the mean over seeds of the moving-average reward
with a band from the lowest to the highest seed (:func:`plot_reward_curves` from the rewards
themselves, e.g. a study's run records).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.io import pyplot, save_figure_atomic


def reward_curve(log_dir: str | Path, tag: str = "train/reward") -> list[tuple[int, float]]:
    """``(step, value)`` of ``tag`` from the TensorBoard events under ``log_dir``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    directory = Path(log_dir) / "tensorboard"
    if not directory.is_dir():
        raise MMPOInputError(f"{directory} does not exist: was the run logged with TensorBoard?")
    points: dict[int, float] = {}
    for events in sorted(directory.rglob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
        accumulator.Reload()
        if tag in accumulator.Tags().get("scalars", []):
            points.update({event.step: event.value for event in accumulator.Scalars(tag)})
    if not points:
        raise MMPOInputError(f"no {tag!r} scalars under {directory}")
    return sorted(points.items())


def window_means(values: list[float] | np.ndarray, window: int = 50) -> list[float]:
    """Means of consecutive ``window``-step blocks (a last partial block is dropped)."""
    values = np.asarray(values, dtype=np.float64)
    blocks = len(values) // window
    return [float(values[i * window : (i + 1) * window].mean()) for i in range(blocks)]


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """``window``-step trailing means (``len(values) - window + 1`` of them)."""
    return np.convolve(values, np.ones(window) / window, mode="valid")


def plot_reward_bands(
    runs: dict[str, list[str | Path]], path: str | Path, window: int = 20, title: str = ""
) -> Path:
    """Per method: the mean over its runs (seeds) of the ``window``-step moving-average reward,
    and a band from the lowest to the highest run. Runs of a method are cut to the shortest."""
    curves = {
        name: [[value for _, value in reward_curve(log_dir)] for log_dir in log_dirs]
        for name, log_dirs in runs.items()
    }
    return plot_reward_curves(curves, path, window, title)


def plot_reward_curves(
    runs: dict[str, list[Sequence[float]]], path: str | Path, window: int = 20, title: str = ""
) -> Path:
    """:func:`plot_reward_bands` on the training rewards themselves (one list per run, a value
    per step) rather than on the logs they were read from."""
    figure, axis = pyplot().subplots(figsize=(6.4, 4.0))
    for name, rewards in runs.items():
        curves = [np.asarray(values, dtype=np.float64) for values in rewards]
        length = min(len(curve) for curve in curves)
        if length < window:
            raise MMPOInputError(f"{name}: a run has {length} steps, fewer than window={window}")
        smooth = np.stack([moving_average(curve[:length], window) for curve in curves])
        steps = np.arange(window, length + 1)
        mean = smooth.mean(axis=0)
        label = f"{name} ({len(curves)} run{'s' if len(curves) > 1 else ''})"
        line = axis.plot(steps, mean, label=label)[0]
        if len(curves) > 1:
            axis.fill_between(
                steps, smooth.min(axis=0), smooth.max(axis=0), color=line.get_color(), alpha=0.2
            )
    axis.set_xlabel("GRPO step")
    axis.set_ylabel(f"training reward ({window}-step moving average)")
    axis.set_title(title or "Tiny CPU runs: mean over seeds, band = lowest to highest seed")
    axis.grid(alpha=0.3)
    axis.legend()
    save_figure_atomic(figure, Path(path))
    pyplot().close(figure)
    return Path(path)
