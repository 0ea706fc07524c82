"""Does a second study reproduce the first? ``nemo-mmpo study check``.

The README's study reports means with 95% intervals over seeds. A user who runs the same
methods on other seeds (``study run --out results/check --seeds 5 6 7 8 9``) asks two things of
each number: does the new mean fall inside the reference's interval, and does each paired
difference get the same verdict (interval above zero, below zero, or across it)? This module
answers both from the two folders' ``study.json`` (written by ``study report``) and writes
``check.md`` and ``check.json`` into the second folder.

What to expect if nothing differs but the seeds: were both intervals exact normal 95%
intervals with the same spread, a second sample's mean would fall inside the first's interval
about 83% of the time (the two means differ by a normal with sqrt(2) times the standard
error). The per-method intervals here are Student-t intervals over the seeds, the paired ones
the wider of the paired t interval and the expanded percentile bootstrap, so the share inside
is a rough guide, not a test; a verdict that flips from resolved to the opposite sign is the
finding to look at. MMPO minus GRPO is in both paired tables; it is compared once.

Verdicts are counted twice. Over every paired number, raw: each interval alone, as a reader of
one cell of the tables would. Over the claims' family (:mod:`nemo_mmpo.study.claims`), after
Holm's correction: the rule ``study report`` gives the claims' verdicts by, applied to each
study, so a claim's verdict is compared the way the report states it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.io import markdown_table, write_text_atomic
from nemo_mmpo.study.claims import family_verdicts, raw_verdict
from nemo_mmpo.study.comparison import display_scale, format_difference
from nemo_mmpo.study.methods import ALL_METHODS, PROPOSED

CHECKPOINTS = ("selected", "final")
METHOD_METRICS = ("average", "pass@1", "pass@4", "pass@8", "pass@16", "never_solved", "gini@0.0")
PAIRED_TABLES = {
    "paired_difference_from_grpo": "{method} minus GRPO",
    "paired_difference_of_mmpo": "MMPO minus {method}",
}


def read_study(folder: str | Path) -> dict[str, Any]:
    """The numbers ``study report`` wrote into ``folder/study.json``."""
    path = Path(folder) / "study.json"
    if not path.is_file():
        raise MMPOInputError(
            f"{path} does not exist: run `nemo-mmpo study report --out {folder}` first"
        )
    return json.loads(path.read_text())


def _method_entry(numbers: dict[str, Any], metric: str) -> dict[str, float] | None:
    """One method's ``{mean, half_width}`` for ``metric`` (``gini@0.0``: Gini at alpha 0).

    Only alpha 0 is compared per method: at alpha > 0 the report filters on the problems every
    method of a seed keeps, so the value depends on which other methods the study ran (the
    paired tables' Gini, on the pair's own filter, is compared at every alpha they give)."""
    if metric.startswith("pass@"):
        return numbers["pass_at_k"].get(metric)
    if metric.startswith("gini@"):
        return numbers["gini"].get(metric.split("@")[1])
    return numbers.get(metric)


#: A paired interval's raw verdict (each interval alone): the report's rule.
verdict = raw_verdict
RESOLVED = {"above zero", "below zero"}


def compare_claims(reference: dict[str, Any], check: dict[str, Any]) -> list[dict[str, Any]]:
    """The claims' comparisons both studies ran, with each study's raw verdict and verdict
    after Holm over its own family (:func:`nemo_mmpo.study.claims.family_verdicts`)."""
    rows = []
    for which in CHECKPOINTS:
        theirs = {
            (row["claim"], row["comparison"], row["metric"]): row
            for row in family_verdicts(check[which])
        }
        for mine in family_verdicts(reference[which]):
            other = theirs.get((mine["claim"], mine["comparison"], mine["metric"]))
            if other is None:
                continue
            rows.append(
                {
                    "checkpoint": which,
                    **{key: mine[key] for key in ("claim", "comparison", "metric")},
                    **{key: mine[key] for key in ("mean", "low", "high")},
                    "reference_raw_verdict": mine["raw_verdict"],
                    "reference_verdict": mine["verdict"],
                    "check": other["mean"],
                    "check_raw_verdict": other["raw_verdict"],
                    "check_verdict": other["verdict"],
                }
            )
    return rows


def compare_studies(reference: dict[str, Any], check: dict[str, Any]) -> dict[str, Any]:
    """Every number both studies have: the check's mean against the reference's interval.

    Returns ``{"rows": [...], "inside": int, "compared": int, "verdicts_agree": int,
    "verdicts_compared": int, "verdicts_flipped": int, "claims": [...], "claims_agree": int,
    "claims_compared": int, "claims_flipped": int}``; a row holds the checkpoint, the table,
    the method, the metric, the reference's mean, low and high, the check's mean and whether
    it lies inside, and for paired rows both raw verdicts; ``claims`` are
    :func:`compare_claims`'s rows, counted by their verdicts after Holm. A paired difference
    the reference read on one seed (no interval) is not compared.
    """
    rows: list[dict[str, Any]] = []
    for which in CHECKPOINTS:
        mine, theirs = reference[which], check[which]
        for method in [name for name in mine["methods"] if name in theirs["methods"]]:
            for metric in METHOD_METRICS:
                old = _method_entry(mine["methods"][method], metric)
                new = _method_entry(theirs["methods"][method], metric)
                if old is None or new is None:
                    continue
                low, high = old["mean"] - old["half_width"], old["mean"] + old["half_width"]
                rows.append(
                    {
                        "checkpoint": which,
                        "table": "per method",
                        "method": method,
                        "metric": metric,
                        "reference": old["mean"],
                        "low": low,
                        "high": high,
                        "check": new["mean"],
                        "inside": low <= new["mean"] <= high,
                    }
                )
        for table in PAIRED_TABLES:
            old_table, new_table = mine.get(table, {}), theirs.get(table, {})
            for method in [name for name in old_table if name in new_table]:
                if table == "paired_difference_of_mmpo" and method == "grpo":
                    continue  # the same numbers as MMPO's row of the table from GRPO
                for metric, old in old_table[method].items():
                    new = new_table[method].get(metric)
                    if new is None or old["low"] is None:
                        continue
                    rows.append(
                        {
                            "checkpoint": which,
                            "table": table,
                            "method": method,
                            "metric": metric,
                            "reference": old["mean"],
                            "low": old["low"],
                            "high": old["high"],
                            "check": new["mean"],
                            "inside": old["low"] <= new["mean"] <= old["high"],
                            "reference_verdict": verdict(old),
                            "check_verdict": verdict(new),
                        }
                    )
    paired = [row for row in rows if "reference_verdict" in row]
    claims = compare_claims(reference, check)
    return {
        "rows": rows,
        "inside": sum(row["inside"] for row in rows),
        "compared": len(rows),
        "verdicts_agree": sum(row["reference_verdict"] == row["check_verdict"] for row in paired),
        "verdicts_compared": len(paired),
        "verdicts_flipped": sum(
            {row["reference_verdict"], row["check_verdict"]} == RESOLVED for row in paired
        ),
        "claims": claims,
        "claims_agree": sum(row["reference_verdict"] == row["check_verdict"] for row in claims),
        "claims_compared": len(claims),
        "claims_flipped": sum(
            {row["reference_verdict"], row["check_verdict"]} == RESOLVED for row in claims
        ),
    }


def _reference(row: dict[str, Any]) -> dict[str, float]:
    """A row's reference mean and interval as ``format_difference`` reads them."""
    return {"mean": row["reference"], "low": row["low"], "high": row["high"]}


def _label(row: dict[str, Any]) -> str:
    name = ALL_METHODS[row["method"]].label if row["method"] in ALL_METHODS else row["method"]
    if row["table"] == "per method":
        return name
    return PAIRED_TABLES[row["table"]].format(method=name)


def check_markdown(result: dict[str, Any], reference: str, check: str) -> str:
    """``check.md``: the summary, then every verdict that changed and every mean outside."""
    share = result["inside"] / max(1, result["compared"])
    lines = [
        f"# Check: does `{check}` reproduce `{reference}`?",
        "",
        f"{result['inside']} of {result['compared']} means ({100 * share:.0f}%) lie inside the "
        "reference's 95% interval (about 83% if nothing but the seeds differs and the intervals "
        "were exact; see `nemo_mmpo/study/check.py`).",
        f"{result['verdicts_agree']} of {result['verdicts_compared']} paired differences get "
        "the same raw verdict (each interval alone: above zero, below zero, includes zero); "
        f"{result['verdicts_flipped']} flip from one resolved sign to the other.",
        f"{result['claims_agree']} of {result['claims_compared']} of the claims' comparisons "
        "get the same verdict after Holm's correction over each study's family (the report's "
        f"rule for the claims); {result['claims_flipped']} flip from one resolved sign to the "
        "other.",
        "",
        "## The claims' comparisons, after Holm",
        "",
    ]
    claims = []
    for row in result["claims"]:
        scale, digits = display_scale(row["metric"])
        claims.append(
            [
                row["checkpoint"],
                row["claim"],
                row["comparison"],
                row["metric"],
                format_difference(row, scale, digits),
                f"{row['reference_raw_verdict']}, {row['reference_verdict']}",
                f"{scale * row['check']:+.{digits}f}",
                f"{row['check_raw_verdict']}, {row['check_verdict']}",
            ]
        )
    lines += markdown_table(
        [
            "checkpoint",
            "claim",
            "comparison",
            "metric",
            "reference [raw interval]",
            "reference: raw, after Holm",
            "check",
            "check: raw, after Holm",
        ],
        claims,
    )
    changed, outside = [], []
    for row in result["rows"]:
        scale, digits = display_scale(row["metric"])
        reference = format_difference(_reference(row), scale, digits)
        check = f"{scale * row['check']:+.{digits}f}"
        if "reference_verdict" in row and row["reference_verdict"] != row["check_verdict"]:
            changed.append(
                [
                    row["checkpoint"],
                    _label(row),
                    row["metric"],
                    reference,
                    row["reference_verdict"],
                    check,
                    row["check_verdict"],
                ]
            )
        if not row["inside"]:
            outside.append([row["checkpoint"], _label(row), row["metric"], reference, check])
    lines += ["", "## Paired differences whose raw verdict changed", ""]
    lines += markdown_table(
        [
            "checkpoint",
            "difference",
            "metric",
            "reference [interval]",
            "reference verdict",
            "check",
            "check verdict",
        ],
        changed,
    )
    lines += ["", "## Means outside the reference's interval", ""]
    lines += markdown_table(
        ["checkpoint", "number", "metric", "reference [interval]", "check"], outside
    )
    return "\n".join(lines) + "\n"


def write_check(reference: str | Path, check: str | Path) -> Path:
    """Compare ``check``'s study with ``reference``'s; write ``check.md`` and ``check.json``
    into ``check`` (atomically) and return the Markdown's path."""
    result = compare_studies(read_study(reference), read_study(check))
    if not result["compared"]:
        raise MMPOInputError(
            f"{reference} and {check} share no method: run the same methods "
            f"(for example `--methods {PROPOSED} grpo`) in both"
        )
    folder = Path(check)
    write_text_atomic(folder / "check.json", json.dumps(result, indent=2) + "\n")
    path = folder / "check.md"
    write_text_atomic(path, check_markdown(result, str(reference), str(check)))
    return path
