"""Markdown summaries and PNG figures of lab experiments, written atomically."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from nemo_mmpo.io import markdown_table, save_figure_atomic
from nemo_mmpo.io import pyplot as _pyplot

PLOTTED = (
    ("mean_success", "mean success rate"),
    ("gini", "Gini of per-problem success"),
    ("pass@8", "pass@8"),
    ("failure_moment_4", "E[F^4]"),
)


def plot_training(history: dict[str, list[dict[str, float]]], path: Path, title: str) -> None:
    """Four panels over steps: mean success, Gini, pass@8 and E[F^4], one line per arm."""
    pyplot = _pyplot()
    figure, axes = pyplot.subplots(1, len(PLOTTED), figsize=(4.8 * len(PLOTTED), 3.8))
    for axis, (key, label) in zip(axes, PLOTTED, strict=True):
        for name, rows in history.items():
            axis.plot([row["step"] for row in rows], [row[key] for row in rows], label=name)
        axis.set_xlabel("training step")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    figure.suptitle(title)
    figure.tight_layout()
    save_figure_atomic(figure, path)
    pyplot.close(figure)


def plot_gradient_study(rows: Sequence[dict], path: Path) -> None:
    """Relative gradient MSE (bias^2 + variance) against T, one panel per group size."""
    pyplot = _pyplot()
    group_sizes = sorted({row["group_size"] for row in rows})
    figure, axes = pyplot.subplots(
        1, len(group_sizes), figsize=(4.8 * len(group_sizes), 3.8), layout="constrained"
    )
    axes = [axes] if len(group_sizes) == 1 else list(axes)
    for axis, group_size in zip(axes, group_sizes, strict=True):
        for estimator in sorted({row["estimator"] for row in rows}):
            points = sorted(
                (row["truncation_order"], row["mse"])
                for row in rows
                if row["group_size"] == group_size and row["estimator"] == estimator
            )
            axis.plot(*zip(*points, strict=True), marker="o", label=estimator)
        axis.set_title(f"G = {group_size}")
        axis.set_xlabel("truncation order T")
        axis.set_yscale("log")
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("relative gradient MSE")  # one label: the panels share its meaning
    axes[0].legend(fontsize=8)
    save_figure_atomic(figure, path)
    pyplot.close(figure)


def training_table(history: dict[str, list[dict[str, float]]]) -> str:
    keys = (
        "mean_success",
        "gini",
        "pass@1",
        "pass@8",
        "pass@16",
        "failure_moment_4",
        "truncated_first_success_time",
    )
    rows = [
        [name, *(f"{rows[0][key]:.3f} → {rows[-1][key]:.3f}" for key in keys)]
        for name, rows in history.items()
    ]
    return "\n".join(markdown_table(["arm", *keys], rows))


def gradient_table(rows: Sequence[dict]) -> str:
    header = ["G", "T", "estimator", "bias²", "variance", "MSE"]
    cells = [
        [row["group_size"], row["truncation_order"], row["estimator"]]
        + [f"{row[key]:.4f}" for key in ("bias2", "variance", "mse")]
        for row in rows
    ]
    return "\n".join(markdown_table(header, cells))
