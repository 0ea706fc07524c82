"""The study's figures: training reward over seeds, pass@k, pass@k paired with GRPO, Lorenz
curves, first success.

Each reads the numbers :mod:`nemo_mmpo.study.comparison` computed (and, for the reward curves,
the training rewards each run's record holds) and writes a PNG into the study folder,
atomically.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from nemo_mmpo.cpu.spread.curves import plot_reward_curves
from nemo_mmpo.eval.metrics import lorenz_curve
from nemo_mmpo.io import finish_figure, pyplot
from nemo_mmpo.study.methods import ALL_METHODS


def figures(runs: list[dict[str, Any]], numbers: dict[str, Any], out: Path) -> list[str]:
    """Write the figures; a method has one colour in all of them (more than ten: tab20's)."""
    from cycler import cycler

    with pyplot().rc_context({"axes.prop_cycle": cycler(color=_colours(len(numbers["methods"])))}):
        return _figures(runs, numbers, out)


def _colours(count: int) -> list[Any]:
    """``count`` distinct colours: tab10 (matplotlib's default cycle), or tab20 past ten."""
    import matplotlib

    return list(matplotlib.colormaps["tab10" if count <= 10 else "tab20"].colors)


def _figures(runs: list[dict[str, Any]], numbers: dict[str, Any], out: Path) -> list[str]:
    methods = list(numbers["methods"])
    _reward_figure(runs, methods, out)
    paired = _pass_at_k_figures(numbers, methods, out)
    _lorenz_figure(runs, methods, out)
    _first_success_figure(numbers, methods, out)
    return [
        "![training reward](study_rewards.png)",
        "![pass@k](study_pass_at_k.png)",
        *(["![pass@k minus GRPO's](study_paired_pass_at_k.png)"] if paired else []),
        "![Lorenz curves](study_lorenz.png)",
        "![first success](study_first_success.png)",
        "",
    ]


def _reward_figure(runs: list[dict[str, Any]], methods: list[str], out: Path) -> None:
    """``study_rewards.png``: each method's training reward, mean and band over seeds."""
    rewards = {
        ALL_METHODS[name].label: [run["reward"] for run in runs if run["method"] == name]
        for name in methods
    }
    window = max(1, min(20, min(run["steps"] for run in runs) // 3))
    plot_reward_curves(
        rewards,
        out / "study_rewards.png",
        window=window,
        title="Training reward (mean over seeds, band: lowest to highest)",
    )


def _pass_at_k_figures(numbers: dict[str, Any], methods: list[str], out: Path) -> bool:
    """``study_pass_at_k.png`` and, when the study has paired differences,
    ``study_paired_pass_at_k.png``; returns whether it drew the second."""
    series = []
    for name in methods:
        entries = numbers["methods"][name]["pass_at_k"]
        means = np.array([100 * entry["mean"] for entry in entries.values()])
        errors = np.array([100 * entry["half_width"] for entry in entries.values()])
        series.append((name, list(entries), means, [errors, errors]))
    _pass_at_k_figure(
        out / "study_pass_at_k.png",
        series,
        methods,
        ylabel="pass@k (%)",
        title="pass@k at the selected checkpoint",
    )
    paired = numbers.get("paired_difference_from_grpo") or {}
    if not paired:
        return False
    series = []  # the seeds' spread hides the differences the pairing resolves
    for name, row in paired.items():
        keys = [key for key in row if key.startswith("pass@")]
        means = np.array([100 * row[key]["mean"] for key in keys])
        lows = means - np.array([100 * _bound(row[key], "low") for key in keys])
        highs = np.array([100 * _bound(row[key], "high") for key in keys]) - means
        series.append((name, keys, means, [lows, highs]))
    _pass_at_k_figure(
        out / "study_paired_pass_at_k.png",
        series,
        methods,
        ylabel="pass@k minus GRPO's (points)",
        title="Paired difference from GRPO (95% interval over seeds)",
        differences=True,
    )
    return True


def _lorenz_figure(runs: list[dict[str, Any]], methods: list[str], out: Path) -> None:
    """``study_lorenz.png``: per-problem success averaged over seeds, the paper's alpha = 0.1."""
    figure, axis = pyplot().subplots(figsize=(4.6, 4.4))
    axis.plot([0, 1], [0, 1], color="grey", linestyle="--", label="equality")
    for name in methods:
        of_method = [run["selected"]["success"] for run in runs if run["method"] == name]
        keys = sorted(set.intersection(*(set(values) for values in of_method)))
        mean = np.array([np.mean([values[key] for values in of_method]) for key in keys])
        kept = mean[(mean >= 0.1) & (mean <= 0.9)]
        if kept.size:
            axis.plot(*lorenz_curve(kept / kept.mean()), label=ALL_METHODS[name].label)
    finish_figure(
        figure,
        axis,
        out / "study_lorenz.png",
        xlabel="cumulative share of problems",
        ylabel="cumulative share of success",
        title="Lorenz curves (alpha = 0.1, mean over seeds)",
    )


def _first_success_figure(numbers: dict[str, Any], methods: list[str], out: Path) -> None:
    """``study_first_success.png``: the first-success time's distribution per method."""
    figure, axis = pyplot().subplots(figsize=(6, 3.6))
    width = 0.8 / len(methods)
    for offset, name in enumerate(methods):
        pmf = numbers["methods"][name]["first_success"]
        attempts = np.arange(1, len(pmf) + 2)
        heights = [*pmf, 1.0 - sum(pmf)]
        axis.bar(attempts + offset * width, heights, width=width, label=ALL_METHODS[name].label)
    finish_figure(
        figure,
        axis,
        out / "study_first_success.png",
        xlabel="attempt of the first success (last bar: never)",
        ylabel="share of problems",
        title="First-success time at the selected checkpoint",
    )


def _bound(entry: dict, which: str) -> float:
    """A paired interval's bound; the mean where one seed gives none (a point without a bar)."""
    return entry["mean"] if entry[which] is None else entry[which]


def _pass_at_k_figure(
    path: Path,
    series: list[tuple[str, list[str], np.ndarray, list[np.ndarray]]],
    methods: list[str],
    *,
    ylabel: str,
    title: str,
    differences: bool = False,
) -> None:
    """pass@k against k (log scale), one line with error bars ``[below, above]`` a method,
    coloured by the method's place in ``methods`` (as in the other figures), nudged apart;
    ``differences`` draws the zero line."""
    colours = _colours(len(methods))
    figure, axis = pyplot().subplots(figsize=(5, 3.6))
    if differences:
        axis.axhline(0.0, color="grey", linestyle="--", linewidth=1)
    for offset, (name, keys, means, errors) in enumerate(series):
        ks = np.array([int(key.split("@")[1]) for key in keys], dtype=float)
        axis.errorbar(
            ks * 2 ** (0.06 * (offset - (len(series) - 1) / 2)),
            means,
            yerr=errors,
            marker="o",
            capsize=3,
            label=ALL_METHODS[name].label,
            color=colours[methods.index(name) % len(colours)],
        )
    axis.set_xscale("log", base=2)
    finish_figure(figure, axis, path, xlabel="k", ylabel=ylabel, title=title)
