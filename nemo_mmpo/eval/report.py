"""One command from rollout files to a report folder: summary.md, summary.json, PNG figures.

    python -m nemo_mmpo.eval report runs/mmpo.jsonl runs/grpo.jsonl --out report/

Method names come from the file names (``mmpo.jsonl`` -> ``mmpo``) or ``NAME=path``; the same
``NAME`` given several times makes one run of several files (shards). A spec that is an
existing path is a path, even if it contains ``=``.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.eval.metrics import (
    TABLE_PASS_AT,
    first_success_distribution,
    gini_by_method,
    pass_at_k,
)
from nemo_mmpo.eval.rollouts import ProblemCounts, load_run
from nemo_mmpo.io import markdown_table, pyplot, save_figure_atomic, write_text_atomic

PAPER_COLUMNS = (("math500", 1), ("olymmath", 1), ("amc23", 16), ("aime24", 16), ("aime25", 16))
ALPHAS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3)
LORENZ_ALPHA = 0.1


def _progress(items, description: str, enabled: bool):
    if not enabled:
        return items
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=description)


def parse_run_spec(spec: str) -> tuple[str, Path, bool]:
    """``(name, path, named)`` of ``NAME=path`` or ``path`` (an existing path wins)."""
    if Path(spec).exists() or "=" not in spec:
        return Path(spec).stem, Path(spec), False
    name, _, path = spec.partition("=")
    if not re.fullmatch(r"[\w.+-]+", name):
        raise MMPOInputError(
            f"run {spec!r}: no such file, and {name!r} is not a run name (letters, digits, "
            "'_', '.', '+', '-'); give NAME=path or an existing path"
        )
    return name, Path(path), True


def load_runs(specs: Sequence[str], progress: bool = True) -> dict[str, ProblemCounts]:
    """``["name=path" or "path", ...]`` -> per-run problem counts (notes go to stderr)."""
    files: dict[str, list[Path]] = {}
    named: dict[str, bool] = {}
    for spec in specs:
        name, path, explicit = parse_run_spec(spec)
        if name in files and not (explicit and named[name]):
            raise MMPOInputError(
                f"two runs are named {name!r} ({files[name][0]} and {path}); name them with "
                "NAME=path (the same NAME on several files makes one run of shards)"
            )
        files.setdefault(name, []).append(path)
        named[name] = explicit
    runs: dict[str, ProblemCounts] = {}
    for name in _progress(list(files), "reading rollouts", progress):
        runs[name] = load_run(files[name])
        for note in runs[name].notes:
            print(f"note: run {name}: {note}", file=sys.stderr)
    coverage_note = coverage_difference(runs) if runs else None
    if coverage_note:
        print(f"note: {coverage_note}", file=sys.stderr)
    return runs


def _sample_range(samples: np.ndarray) -> str:
    low, high = int(samples.min()), int(samples.max())
    if low == high:
        return f"{low}"
    fewer = int((samples < high).sum())
    return f"mixed {low}-{high} ({fewer} problems with fewer than {high})"


def coverage_difference(runs: dict[str, ProblemCounts]) -> str | None:
    """A sentence when the runs do not cover the same problems (None when they do)."""
    sets = {name: set(counts.keys) for name, counts in runs.items()}
    union = set().union(*sets.values())
    shared = set.intersection(*sets.values())
    if len(shared) == len(union):
        return None
    partial = ", ".join(
        f"{name} has {len(keys)} of {len(union)}" for name, keys in sets.items() if keys != union
    )
    return (
        f"the runs cover different problems ({partial}): the benchmark and pass@k tables use "
        f"each run's own problems; Gini, Lorenz and the comparison use the {len(shared)} shared"
    )


def inputs_section(runs: dict[str, ProblemCounts]) -> str:
    """What each number covers: files, problems and samples per benchmark, statuses, notes."""
    rows = []
    for name, counts in runs.items():
        for benchmark in [*counts.benchmarks, "all"]:
            subset = counts if benchmark == "all" else counts.benchmark(benchmark)
            samples = subset.samples
            rows.append(
                [name, benchmark, len(subset.keys), int(samples.sum()), _sample_range(samples)]
            )
    header = ["run", "benchmark", "problems", "samples", "samples per problem"]
    lines = ["## Inputs", "", *markdown_table(header, rows)]
    lines.append("")
    coverage_note = coverage_difference(runs)
    if coverage_note:
        lines.extend([f"**Note:** {coverage_note}", ""])
    for name, counts in runs.items():
        statuses = ", ".join(
            f"{key} {value}" for key, value in sorted(counts.status_counts.items())
        )
        lines.append(f"- {name}: {len(counts.files)} file(s); status: {statuses or 'none'}")
        lines.extend(f"  - note: {note}" for note in counts.notes)
    return "\n".join(lines)


def benchmark_table(runs: dict[str, ProblemCounts], numbers: dict[str, Any] | None = None) -> str:
    """The paper's table: avg@1 on MATH500/OlymMATH, avg@16 on AMC23/AIME24/AIME25, mean.

    A column is headed by the samples per problem the files hold (``avg@n``: the mean over
    the problem's n samples, an unbiased estimate of avg@1); the paper used 1, 1, 16, 16, 16.
    """
    header = ["method"]
    for benchmark, _ in PAPER_COLUMNS:
        counts = {int(n) for run in runs.values() for n in run.benchmark(benchmark).samples}
        label = f"avg@{counts.pop()}" if len(counts) == 1 else "avg@n"
        header.append(f"{benchmark} ({label})")
    header.append("average")
    rows = []
    numbers = {} if numbers is None else numbers
    for name, counts in runs.items():
        cells, values = [], []
        numbers[name] = {}
        for benchmark, _ in PAPER_COLUMNS:
            subset = counts.benchmark(benchmark)
            if not subset.keys:
                cells.append("–")
                continue
            value = 100.0 * float(np.mean(subset.correct / subset.samples))
            values.append(value)
            cells.append(f"{value:.1f}")
            numbers[name][benchmark] = {
                "accuracy_percent": value,
                "problems": len(subset.keys),
                "samples": int(subset.samples.sum()),
                "samples_per_problem_min": int(subset.samples.min()),
                "samples_per_problem_max": int(subset.samples.max()),
            }
        numbers[name]["average_percent"] = float(np.mean(values)) if values else None
        rows.append([name, *cells, f"{np.mean(values):.1f}" if values else "–"])
    return "\n".join(markdown_table(header, rows))


def pass_table(runs: dict[str, ProblemCounts], numbers: dict[str, Any] | None = None) -> str:
    """pass@k per run and benchmark (blank where a problem has fewer than k samples); the
    values go into ``numbers[run][benchmark]["pass@k"]`` (None where blank)."""
    numbers = {} if numbers is None else numbers
    rows = []
    for name, counts in runs.items():
        numbers[name] = {}
        for benchmark in [*counts.benchmarks, "all"]:
            subset = counts if benchmark == "all" else counts.benchmark(benchmark)
            cells = []
            numbers[name][benchmark] = {}
            for k in TABLE_PASS_AT:
                if subset.samples.min() >= k:
                    value = float(pass_at_k(subset.samples, subset.correct, k).mean())
                    cells.append(f"{100 * value:.1f}")
                    numbers[name][benchmark][f"pass@{k}"] = value
                else:
                    cells.append("–")
                    numbers[name][benchmark][f"pass@{k}"] = None
            rows.append([name, benchmark, *cells])
    header = ["method", "benchmark", *(f"pass@{k}" for k in TABLE_PASS_AT)]
    return "\n".join(markdown_table(header, rows))


def common_success(runs: dict[str, ProblemCounts]) -> dict[str, np.ndarray]:
    """Per-problem success rates on the problems every run evaluated, in the same order."""
    shared = sorted(set.intersection(*(set(counts.keys) for counts in runs.values())))
    if not shared:
        raise MMPOInputError("the runs share no (benchmark, problem) pair; compare like with like")
    result = {}
    for name, counts in runs.items():
        position = {key: index for index, key in enumerate(counts.keys)}
        rows = [position[key] for key in shared]
        result[name] = counts.correct[rows] / counts.samples[rows]
    return result


def _finish(figure, axis, path: Path, xlabel: str, ylabel: str, title: str) -> None:
    """Label, legend and save one figure (atomically), then free it."""
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.set_title(title)
    axis.legend()
    axis.grid(alpha=0.3)
    save_figure_atomic(figure, path)
    pyplot().close(figure)


def _inputs_section(runs, success, out: Path, numbers: dict[str, Any]) -> str:
    numbers["inputs"] = {
        name: {
            "files": counts.files,
            "problems": len(counts.keys),
            "samples": int(counts.samples.sum()),
            "status_counts": counts.status_counts,
            "notes": counts.notes,
        }
        for name, counts in runs.items()
    }
    return inputs_section(runs)


def _tables_section(runs, success, out: Path, numbers: dict[str, Any]) -> str:
    numbers["benchmarks"], numbers["pass_at_k"] = {}, {}
    table = pass_table(runs, numbers["pass_at_k"])
    return (
        "## Benchmarks\n\n"
        + benchmark_table(runs, numbers["benchmarks"])
        + "\n\n## pass@k (%)\n\n"
        + table
    )


def _gini_section(runs, success, out: Path, numbers: dict[str, Any]) -> str:
    results = [gini_by_method(success, alpha) for alpha in ALPHAS]
    numbers["gini"] = [
        {
            "alpha": result["alpha"],
            "problems_kept": result["kept"],
            "gini": {name: float(result["methods"][name]["gini"]) for name in runs},
        }
        for result in results
    ]
    lines = markdown_table(
        ["alpha", "problems kept", *runs],
        [
            [result["alpha"], result["kept"]]
            + [f"{result['methods'][name]['gini']:.4f}" for name in runs]
            for result in results
        ],
    )
    figure, axis = pyplot().subplots(figsize=(5, 3.6))
    for name in runs:
        axis.plot(ALPHAS, [r["methods"][name]["gini"] for r in results], marker="o", label=name)
    _finish(
        figure,
        axis,
        out / "gini_vs_alpha.png",
        "filter threshold alpha",
        "Gini coefficient",
        "Gini of per-problem success",
    )
    return (
        "## Gini of per-problem success (common filter, mean-normalised)\n\n"
        + "\n".join(lines)
        + "\n\n![Gini vs alpha](gini_vs_alpha.png)"
    )


def _lorenz_section(runs, success, out: Path, numbers: dict[str, Any]) -> str:
    result = gini_by_method(success, LORENZ_ALPHA)
    figure, axis = pyplot().subplots(figsize=(4.6, 4.4))
    axis.plot([0, 1], [0, 1], color="grey", linestyle="--", label="equality")
    for name in runs:
        method = result["methods"][name]
        if method["lorenz"] is not None:
            axis.plot(*method["lorenz"], label=f"{name} (Gini {method['gini']:.3f})")
    _finish(
        figure,
        axis,
        out / "lorenz.png",
        "cumulative share of problems",
        "cumulative share of success",
        f"Lorenz curves (alpha = {LORENZ_ALPHA}, {result['kept']} problems)",
    )
    return "## Lorenz curves\n\n![Lorenz](lorenz.png)"


def _first_success_section(runs, success, out: Path, numbers: dict[str, Any]) -> str:
    numbers["first_success"] = {}
    figure, axis = pyplot().subplots(figsize=(6, 3.6))
    width = 0.8 / len(runs)
    rows = []
    for offset, (name, counts) in enumerate(runs.items()):
        distribution = first_success_distribution(counts.samples, counts.correct)
        attempts = np.arange(1, len(distribution["pmf"]) + 2)
        heights = np.concatenate([distribution["pmf"], [distribution["never_solved"]]])
        axis.bar(attempts + offset * width, heights, width=width, label=name)
        numbers["first_success"][name] = {
            "attempts": len(distribution["pmf"]),
            "probability_first_success_at": [float(value) for value in distribution["pmf"]],
            "never_solved": float(distribution["never_solved"]),
        }
        pmf, never = distribution["pmf"], distribution["never_solved"]
        rows.append([name, len(pmf), f"{pmf[0]:.3f}", f"{never:.3f}"])
    header = ["method", "attempts", "P(first success at 1)", "never solved"]
    lines = markdown_table(header, rows)
    _finish(
        figure,
        axis,
        out / "first_success.png",
        "attempt of the first success (last bar: never, within all samples)",
        "share of problems",
        "First-success time",
    )
    return "## First-success time\n\n" + "\n".join(lines) + "\n\n![first](first_success.png)"


def _pass_curve_section(runs, success, out: Path, numbers: dict[str, Any]) -> str:
    figure, axis = pyplot().subplots(figsize=(5, 3.6))
    for name in runs:  # the values the pass@k table computed (over all problems)
        points = [
            (k, 100 * value)
            for k in TABLE_PASS_AT
            if (value := numbers["pass_at_k"][name]["all"][f"pass@{k}"]) is not None
        ]
        if points:
            axis.plot(*zip(*points, strict=True), marker="o", label=name)
    axis.set_xscale("log", base=2)
    _finish(figure, axis, out / "pass_at_k.png", "k", "pass@k (%)", "pass@k over all problems")
    return "![pass@k](pass_at_k.png)"


REPORT_SECTIONS = (
    _inputs_section,
    _tables_section,
    _gini_section,
    _lorenz_section,
    _first_success_section,
    _pass_curve_section,
)


def write_report(runs: dict[str, ProblemCounts], out: str | Path, progress: bool = True) -> Path:
    """Write ``summary.md``, ``summary.json`` (every number of the summary) and the figures
    into ``out``; returns the summary's path."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise MMPOInputError(f"--out {out} is a file; give a directory (created if missing)")
    out.mkdir(parents=True, exist_ok=True)
    success = common_success(runs)
    numbers: dict[str, Any] = {"runs": list(runs)}
    sections = [f"# Evaluation report\n\nRuns: {', '.join(runs)}.\n"]
    for section in _progress(REPORT_SECTIONS, "writing report", progress):
        sections.append(section(runs, success, out, numbers))
    write_text_atomic(out / "summary.json", json.dumps(numbers, indent=2) + "\n")
    summary = out / "summary.md"
    write_text_atomic(summary, "\n\n".join(sections) + "\n")
    return summary
