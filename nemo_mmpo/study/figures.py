"""The study's figures: training reward over seeds, pass@k, Lorenz curves, first success.

Each reads the numbers :mod:`nemo_mmpo.study.comparison` computed (and, for the reward curves,
the runs' TensorBoard logs) and writes a PNG into the study folder, atomically.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from nemo_mmpo.io import pyplot, save_figure_atomic
from nemo_mmpo.study.methods import ALL_METHODS


def figures(runs: list[dict[str, Any]], numbers: dict[str, Any], out: Path) -> list[str]:
    from nemo_mmpo.cpu.curves import plot_reward_bands
    from nemo_mmpo.eval.metrics import lorenz_curve

    methods = list(numbers["methods"])
    logs = {
        ALL_METHODS[name].label: [
            str(Path(run["folder"]) / "logs") for run in runs if run["method"] == name
        ]
        for name in methods
    }
    window = max(1, min(20, min(run["steps"] for run in runs) // 3))
    plot_reward_bands(
        logs,
        out / "study_rewards.png",
        window=window,
        title="Training reward (mean over seeds, band: lowest to highest)",
    )
    figure, axis = pyplot().subplots(figsize=(5, 3.6))
    for name in methods:
        entries = numbers["methods"][name]["pass_at_k"]
        ks = [int(key.split("@")[1]) for key in entries]
        means = [100 * entries[key]["mean"] for key in entries]
        errors = [100 * entries[key]["half_width"] for key in entries]
        axis.errorbar(ks, means, yerr=errors, marker="o", capsize=3, label=ALL_METHODS[name].label)
    axis.set_xscale("log", base=2)
    axis.set_xlabel("k")
    axis.set_ylabel("pass@k (%)")
    axis.set_title("pass@k at the selected checkpoint")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    save_figure_atomic(figure, out / "study_pass_at_k.png")
    pyplot().close(figure)
    figure, axis = pyplot().subplots(figsize=(4.6, 4.4))
    axis.plot([0, 1], [0, 1], color="grey", linestyle="--", label="equality")
    for name in methods:  # per-problem success averaged over seeds, the paper's alpha = 0.1
        of_method = [run["selected"]["success"] for run in runs if run["method"] == name]
        keys = sorted(set.intersection(*(set(values) for values in of_method)))
        mean = np.array([np.mean([values[key] for values in of_method]) for key in keys])
        kept = mean[(mean >= 0.1) & (mean <= 0.9)]
        if kept.size:
            axis.plot(*lorenz_curve(kept / kept.mean()), label=ALL_METHODS[name].label)
    axis.set_xlabel("cumulative share of problems")
    axis.set_ylabel("cumulative share of success")
    axis.set_title("Lorenz curves (alpha = 0.1, mean over seeds)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    save_figure_atomic(figure, out / "study_lorenz.png")
    pyplot().close(figure)
    figure, axis = pyplot().subplots(figsize=(6, 3.6))
    width = 0.8 / len(methods)
    for offset, name in enumerate(methods):
        pmf = numbers["methods"][name]["first_success"]
        attempts = np.arange(1, len(pmf) + 2)
        heights = [*pmf, 1.0 - sum(pmf)]
        axis.bar(attempts + offset * width, heights, width=width, label=ALL_METHODS[name].label)
    axis.set_xlabel("attempt of the first success (last bar: never)")
    axis.set_ylabel("share of problems")
    axis.set_title("First-success time at the selected checkpoint")
    axis.legend(fontsize=8)
    save_figure_atomic(figure, out / "study_first_success.png")
    pyplot().close(figure)
    return [
        "![training reward](study_rewards.png)",
        "![pass@k](study_pass_at_k.png)",
        "![Lorenz curves](study_lorenz.png)",
        "![first success](study_first_success.png)",
        "",
    ]
