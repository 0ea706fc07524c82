"""The confirmatory study's analysis, fixed before its runs: ``nemo-mmpo study confirm``.

Given the registered plan (:mod:`nemo_mmpo.study.plan`) and the records of its runs, for each
claim the paired differences (``method`` minus ``other``, one per planned seed, the study
report's metric code: :func:`nemo_mmpo.study.power.seed_differences`) give the mean, the 95%
Student-t interval and the paired t test's two-sided p-value
(:func:`nemo_mmpo.study.intervals.paired_t_p`). The test is the paired t alone (no bootstrap
widening: at the planned 40 seeds the two agree, and the power was computed for the t test).

The primary claims are one family: Holm's correction over them
(:func:`nemo_mmpo.study.intervals.holm`), and a verdict for each:

- **resolved for the paper**: Holm-adjusted p below the plan's alpha, mean of the paper's sign;
- **resolved against the paper**: Holm-adjusted p below alpha, mean of the other sign;
- **null**: otherwise, with the effect it rules out: the bound, on the paper's side, of the
  family-wise interval (Student t at ``1 - alpha / (2 m)``, Bonferroni's level, which Holm's
  verdicts never contradict: a claim Holm does not resolve has that interval across zero).

The secondary comparisons are exploratory: each p-value and interval alone, no verdict.
The analysis refuses records that are not the plan's (other seeds, a seed missing, a seed with
one method only, other steps): the plan's stopping rule is its full list of seeds.
``report.md``, ``report.json`` and ``confirmatory_differences.png`` are written atomically.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.io import markdown_table, pyplot, save_figure_atomic, write_text_atomic
from nemo_mmpo.study.comparison import display_scale, finished_runs
from nemo_mmpo.study.intervals import holm, paired_t_p
from nemo_mmpo.study.methods import ALL_METHODS
from nemo_mmpo.study.plan import Plan, PlannedClaim, read_plan
from nemo_mmpo.study.power import seed_differences, t_quantile, units

FIGURE = "confirmatory_differences.png"
RESOLVED_FOR, RESOLVED_AGAINST, NULL = "resolved for the paper", "resolved against it", "null"


def check_runs(runs: list[dict[str, Any]], plan: Plan) -> None:
    """Refuse runs that are not exactly the plan's: both methods on every planned seed, no
    other seed, ``plan.steps`` steps, evaluated at the last."""
    planned = set(plan.seeds)
    for name in (plan.method, plan.other):
        seeds = {run["seed"] for run in runs if run["method"] == name}
        if seeds != planned:
            missing, extra = sorted(planned - seeds), sorted(seeds - planned)
            raise MMPOInputError(
                f"{name}: seeds missing {missing}, not in the plan {extra}; the plan's analysis "
                f"reads its {len(planned)} seeds, all of them (its stopping rule), and only them"
            )
    for run in runs:
        if run.get("steps") != plan.steps or run.get("final_step") != plan.steps:
            raise MMPOInputError(
                f"{run['method']} seed {run['seed']}: {run.get('steps')} steps, final "
                f"evaluation at {run.get('final_step')}; the plan runs {plan.steps}"
            )


def claim_numbers(claim: PlannedClaim, seeds: list[int], differences: np.ndarray) -> dict[str, Any]:
    """One claim's paired differences (shape ``(seeds,)``, raw units): mean, sd, n, the 95%
    t interval and the two-sided paired t p-value."""
    count = differences.size
    mean, sd = float(differences.mean()), float(differences.std(ddof=1))
    half = t_quantile(0.975, count - 1) * sd / math.sqrt(count)
    return {
        "text": claim.text,
        "metric": claim.metric,
        "units": units(claim.metric),
        "sign": claim.sign,
        "checkpoint": claim.checkpoint,
        "n": count,
        "mean": mean,
        "sd": sd,
        "low": mean - half,
        "high": mean + half,
        "p": paired_t_p(differences.tolist()),
        "seeds": seeds,
        "differences": differences.tolist(),
    }


def family_verdicts(rows: list[dict[str, Any]], alpha: float) -> list[dict[str, Any]]:
    """The primary rows with Holm-adjusted p-values, the family-wise interval (t at
    ``1 - alpha / (2 m)``) and the verdict (see the module docstring)."""
    size = len(rows)
    for row, adjusted in zip(rows, holm([row["p"] for row in rows]), strict=True):
        half = t_quantile(1.0 - alpha / (2 * size), row["n"] - 1) * row["sd"] / math.sqrt(row["n"])
        row |= {
            "p_holm": adjusted,
            "family_low": row["mean"] - half,
            "family_high": row["mean"] + half,
        }
        if adjusted < alpha:
            row["verdict"] = RESOLVED_FOR if row["mean"] * row["sign"] > 0 else RESOLVED_AGAINST
            row["rules_out"] = None
        else:
            row["verdict"] = NULL
            row["rules_out"] = row["family_low"] if row["sign"] < 0 else row["family_high"]
    return rows


def analyse(runs: list[dict[str, Any]], plan: Plan) -> dict[str, Any]:
    """The plan's analysis of ``runs`` (checked by :func:`check_runs`): the primary family's
    rows with verdicts and the exploratory rows."""
    check_runs(runs, plan)
    ours = [run for run in runs if run["method"] in (plan.method, plan.other)]

    def rows(claims: tuple[PlannedClaim, ...]) -> list[dict[str, Any]]:
        return [
            claim_numbers(
                claim,
                *seed_differences(ours, claim.checkpoint, claim.metric, plan.method, plan.other),
            )
            for claim in claims
        ]

    return {
        "registered": plan.registered,
        "plan_sha256": plan.sha256,
        "method": plan.method,
        "other": plan.other,
        "seeds": list(plan.seeds),
        "steps": plan.steps,
        "alpha": plan.alpha,
        "amendments": list(plan.amendments),
        "primary": family_verdicts(rows(plan.primary), plan.alpha),
        "secondary": rows(plan.secondary),
    }


def seed_ranges(seeds: list[int]) -> str:
    """``100-116, 140, 118-139``: runs of consecutive seeds, in their order."""
    parts: list[list[int]] = []
    for seed in seeds:
        if parts and seed == parts[-1][-1] + 1:
            parts[-1].append(seed)
        else:
            parts.append([seed])
    return ", ".join(str(p[0]) if len(p) == 1 else f"{p[0]}-{p[-1]}" for p in parts)


def _value(value: float, metric: str) -> str:
    scale, digits = display_scale(metric)
    return f"{scale * value:+.{digits + 1}f}"


def _interval(row: dict[str, Any], low: str = "low", high: str = "high") -> str:
    return f"[{_value(row[low], row['metric'])}, {_value(row[high], row['metric'])}]"


def verdict_text(row: dict[str, Any]) -> str:
    """The verdict as the report states it (a null with the effect it rules out)."""
    if row["verdict"] != NULL:
        return f"**{row['verdict']}**"
    return (
        f"**null**: rules out an effect in the paper's direction beyond "
        f"{_value(row['rules_out'], row['metric'])} {row['units']}"
    )


def confirm_markdown(result: dict[str, Any], plan_path: str) -> str:
    """``report.md``: the plan, the primary family's verdicts, the exploratory comparisons."""
    pair = " minus ".join(ALL_METHODS[name].label for name in (result["method"], result["other"]))
    size = len(result["primary"])
    seeds = result["seeds"]
    lines = [
        "# Confirmatory study: the pre-registered analysis",
        "",
        f"Plan: `{plan_path}`, registered {result['registered']} (SHA-256 "
        f"`{result['plan_sha256'][:16]}`). {pair}, paired by seed, on the plan's {len(seeds)} "
        f"seeds ({seed_ranges(seeds)}), {result['steps']} steps each; the paired t test, "
        f"two-sided, Holm's correction over the {size} primary claims (family-wise error "
        f"{result['alpha']:g}).",
        *(
            f"Amendment of {amendment['date']}: {amendment['why']}"
            for amendment in result["amendments"]
        ),
        "",
        f"## Primary claims (one family of {size}, the final step)",
        "",
    ]
    header = ["claim (the paper's sign)", "units", "mean [95% t interval]"]
    header += ["family-wise interval", "p (Holm)", "verdict"]
    lines += markdown_table(
        header,
        (
            [
                f"{row['text']} ({'+' if row['sign'] > 0 else '-'})",
                row["units"],
                f"{_value(row['mean'], row['metric'])} {_interval(row)}",
                _interval(row, "family_low", "family_high"),
                f"{row['p']:.4f} ({row['p_holm']:.4f})",
                verdict_text(row),
            ]
            for row in result["primary"]
        ),
    )
    lines += [
        "",
        "## Secondary comparisons (exploratory: each alone, no correction, no verdict)",
        "",
    ]
    lines += markdown_table(
        ["comparison (the paper's sign)", "checkpoint", "units", "mean [95% t interval]", "p"],
        (
            [
                f"{row['text']} ({'+' if row['sign'] > 0 else '-'})",
                row["checkpoint"],
                row["units"],
                f"{_value(row['mean'], row['metric'])} {_interval(row)}",
                f"{row['p']:.4f}",
            ]
            for row in result["secondary"]
        ),
    )
    lines += ["", f"![paired differences with their intervals]({FIGURE})", ""]
    return "\n".join(lines)


def confirm_figure(result: dict[str, Any], path: Path) -> None:
    """One panel a claim: each seed's difference (dots), the mean with its 95% t interval
    (black) and, for a primary claim, the family-wise interval (grey, wider); zero dashed."""
    rows = result["primary"] + result["secondary"]
    plt = pyplot()
    columns = min(4, len(rows))
    lines = math.ceil(len(rows) / columns)
    figure, axes = plt.subplots(lines, columns, figsize=(2.4 * columns, 3.0 * lines), squeeze=False)
    for axis in axes.flat[len(rows) :]:
        axis.set_visible(False)
    jitter = np.random.default_rng(0).uniform(-0.15, 0.15, size=len(result["seeds"]))
    for axis, row in zip(axes.flat, rows, strict=False):
        scale, _ = display_scale(row["metric"])
        axis.axhline(0.0, color="grey", linestyle="--", linewidth=1)
        axis.scatter(jitter, scale * np.array(row["differences"]), s=8, color="tab:blue", alpha=0.5)
        if "family_low" in row:
            axis.plot(
                [0.45, 0.45],
                [scale * row["family_low"], scale * row["family_high"]],
                color="grey",
                linewidth=5,
                alpha=0.5,
            )
        axis.errorbar(
            [0.45],
            [scale * row["mean"]],
            yerr=[[scale * (row["mean"] - row["low"])], [scale * (row["high"] - row["mean"])]],
            color="black",
            marker="o",
            capsize=4,
        )
        kind = row.get("verdict", "exploratory")
        side = "below" if row["sign"] < 0 else "above"
        axis.set_title(
            f"{row['metric']} ({row['checkpoint']})\npaper: {side} 0; {kind}", fontsize=8
        )
        axis.set_ylabel(row["units"], fontsize=8)
        axis.set_xticks([])
        axis.set_xlim(-0.4, 0.8)
        axis.grid(alpha=0.3)
    figure.suptitle(
        " minus ".join(ALL_METHODS[name].label for name in (result["method"], result["other"]))
        + f", {len(result['seeds'])} seeds",
        fontsize=9,
    )
    figure.tight_layout()
    save_figure_atomic(figure, path)
    plt.close(figure)


def write_confirmation(plan_path: str | Path, studies: list[str | Path], out: str | Path) -> Path:
    """``study confirm``: the plan's analysis of the runs (or records) of ``studies``, pooled;
    ``report.md``, ``report.json`` and the figure into ``out``; returns the Markdown's path."""
    plan = read_plan(plan_path)
    runs = finished_runs([Path(study) for study in studies], (plan.method, plan.other))
    result = analyse(runs, plan)
    out = Path(out)
    write_text_atomic(out / "report.json", json.dumps(result, indent=2) + "\n")
    confirm_figure(result, out / FIGURE)
    path = out / "report.md"
    write_text_atomic(path, confirm_markdown(result, str(plan_path)))
    return path
