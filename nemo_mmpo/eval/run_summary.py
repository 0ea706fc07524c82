"""Over a run's evaluations: the paper's selection rule next to the final step, and curves.

    nemo-mmpo eval summary logs/mmpo_tiny_cpu/evaluation

reads every ``step_<N>.json`` (written by the in-loop evaluation or ``nemo-mmpo eval watch``)
and writes ``run_summary.json``, ``run_summary.md`` and ``run_curves.png`` (the average and
pass@k over steps) beside them. The paper reports the best average over the evaluations; the
summary gives that step (ties go to the earlier one) and, beside it, the final step's numbers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.eval.protocol import read_steps
from nemo_mmpo.io import finish_figure, markdown_table, pyplot, write_text_atomic


def pass_at_all(numbers: dict[str, Any]) -> dict[str, float]:
    """pass@k averaged over the benchmarks (each benchmark counts once, as the average)."""
    benchmarks = list(numbers["benchmarks"].values())
    keys = [key for key in benchmarks[0] if key.startswith("pass@")]
    shared = [key for key in keys if all(key in entry for entry in benchmarks)]
    return {key: sum(entry[key] for entry in benchmarks) / len(benchmarks) for key in shared}


def select(steps: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The paper's selection (best average; the earlier step on a tie) and the final step."""
    if not steps:
        raise MMPOInputError("no evaluated step (step_<N>.json) in this folder yet")
    best = max(steps.values(), key=lambda entry: (entry["average"], -entry["step"]))
    final = steps[max(steps)]
    return {
        "selected": {"step": best["step"], "average": best["average"], **pass_at_all(best)},
        "final": {"step": final["step"], "average": final["average"], **pass_at_all(final)},
        "steps": sorted(steps),
    }


def write_summary(output_dir: str | Path) -> Path:
    """Write ``run_summary.json``, ``run_summary.md`` and ``run_curves.png``; returns the .md."""
    output_dir = Path(output_dir)
    steps = read_steps(output_dir)
    summary = select(steps)
    summary["per_step"] = {
        str(step): {
            "average": entry["average"],
            "never_solved": entry["never_solved"],
            **pass_at_all(entry),
            **{f"gini_{key}": value for key, value in entry["gini"].items()},
        }
        for step, entry in steps.items()
    }
    write_text_atomic(output_dir / "run_summary.json", json.dumps(summary, indent=2) + "\n")
    columns = [key for key in summary["per_step"][str(max(steps))] if key != "average"]
    lines = [
        f"# Evaluations of {output_dir}",
        "",
        f"Selected (best average, the paper's rule): step {summary['selected']['step']}, "
        f"average {summary['selected']['average']:.4f}. Final: step {summary['final']['step']}, "
        f"average {summary['final']['average']:.4f}.",
        "",
    ]
    rows = [
        [
            f"{step} (selected)" if int(step) == summary["selected"]["step"] else step,
            f"{row['average']:.4f}",
            *(f"{row[key]:.4f}" for key in columns),
        ]
        for step, row in summary["per_step"].items()
    ]
    lines += markdown_table(["step", "average", *columns], rows)
    figure, axis = pyplot().subplots(figsize=(6.4, 4.0))
    xs = [int(step) for step in summary["per_step"]]
    axis.plot(
        xs, [row["average"] for row in summary["per_step"].values()], marker="o", label="average"
    )
    for key in (key for key in columns if key.startswith("pass@")):
        axis.plot(xs, [row[key] for row in summary["per_step"].values()], linestyle="--", label=key)
    axis.axvline(summary["selected"]["step"], color="grey", linewidth=0.8)
    finish_figure(
        figure,
        axis,
        output_dir / "run_curves.png",
        xlabel="training step",
        ylabel="score (benchmark mean)",
        title="The paper's evaluation over the run (line: selected step)",
    )
    lines += ["", "![average and pass@k over steps](run_curves.png)", ""]
    path = output_dir / "run_summary.md"
    write_text_atomic(path, "\n".join(lines))
    return path
