"""The claims the study reads, as one declared family with a family-wise verdict.

Each claim (the paper's, or an observation the README makes of the study) is mapped to the
paired comparisons it rests on, each with the sign the claim predicts. The README read about
90 intervals and called a result resolved when one of them missed zero; with that many, a few
miss zero by chance. Here every comparison of the family that the study ran (two seeds or
more) gets the paired t-test's p-value (:func:`nemo_mmpo.study.intervals.paired_t_p`), and
Holm's step-down correction over the family keeps the chance of any false "resolved" at 5%
(Holm 1979; valid under any dependence between the comparisons, which share seeds and GRPO's
runs). A comparison is *resolved after Holm* when its Holm-adjusted p-value is below 0.05 and
its raw 95% interval (:func:`nemo_mmpo.study.intervals.paired_bounds`, never narrower than the
t interval) excludes zero, so a verdict after Holm is never one the raw interval does not give.

The family is read per checkpoint (the one the paper's rule selects, and the final one): each
is a separate reading of the claims, the final step the check on the selected one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.study.intervals import holm
from nemo_mmpo.study.methods import ALL_METHODS, PROPOSED, REFERENCE

#: The family-wise error rate of the claims' verdicts.
FAMILY_ALPHA = 0.05


@dataclass(frozen=True)
class Comparison:
    """``method`` minus ``other`` on ``metric`` (paired by seed), and the sign the claim
    predicts (+1: above zero, -1: below zero)."""

    method: str
    other: str
    metric: str
    sign: int


@dataclass(frozen=True)
class Claim:
    """A claim and the comparisons it rests on; ``source`` says whose claim it is."""

    text: str
    source: str
    comparisons: tuple[Comparison, ...]


def _of_mmpo(others: tuple[str, ...], metric: str, sign: int) -> tuple[Comparison, ...]:
    return tuple(Comparison(PROPOSED, other, metric, sign) for other in others)


#: The declared family: the paper's claims, then the README's own observations of the study.
CLAIMS = (
    Claim(
        "MMPO's average accuracy beats GRPO, pass@K, DMPO and MaxRL",
        "paper",
        _of_mmpo(("grpo", "passk", "dmpo", "maxrl"), "average", +1),
    ),
    Claim(
        "MMPO's lead over GRPO grows with k (pass@1 to pass@16)",
        "paper",
        _of_mmpo(("grpo",), "pass@1", +1)
        + _of_mmpo(("grpo",), "pass@4", +1)
        + _of_mmpo(("grpo",), "pass@8", +1)
        + _of_mmpo(("grpo",), "pass@16", +1),
    ),
    Claim(
        "MMPO's per-problem success is more even than GRPO's (lower Gini)",
        "paper",
        _of_mmpo(("grpo",), "gini@0.0", -1) + _of_mmpo(("grpo",), "gini@0.1", -1),
    ),
    Claim(
        "MMPO leaves fewer problems never solved than GRPO",
        "paper",
        _of_mmpo(("grpo",), "never_solved", -1),
    ),
    Claim(
        "T = 4 is the best truncation order",
        "paper",
        _of_mmpo(("mmpo_t2", "mmpo_t3", "mmpo_t8"), "average", +1),
    ),
    Claim(
        "U = 1 (MMPO) beats U = 0.8 and U ~ Beta(1, 2)",
        "paper",
        _of_mmpo(("mmpo_u08", "mmpo_beta12"), "average", +1),
    ),
    Claim(
        "MaxRL is ahead of GRPO on average accuracy",
        "README",
        (Comparison("maxrl", REFERENCE, "average", +1),),
    ),
    Claim(
        "pass@K training leaves fewer problems never solved than GRPO",
        "README",
        (Comparison("passk", REFERENCE, "never_solved", -1),),
    ),
    Claim(
        "the unbiased estimator is ahead of GRPO on average accuracy",
        "README",
        (Comparison("mmpo_unbiased", REFERENCE, "average", +1),),
    ),
)


def paired_entry(numbers: dict[str, Any], comparison: Comparison) -> dict[str, Any] | None:
    """The report's paired entry for ``comparison`` at one checkpoint (None if not run)."""
    if comparison.other == REFERENCE:
        row = (numbers.get("paired_difference_from_grpo") or {}).get(comparison.method)
    elif comparison.method == PROPOSED:
        row = (numbers.get("paired_difference_of_mmpo") or {}).get(comparison.other)
    else:
        raise ValueError(f"{comparison}: the report pairs with GRPO or with MMPO only")
    return None if row is None else row.get(comparison.metric)


def raw_verdict(entry: dict[str, Any]) -> str:
    """``above zero``, ``below zero`` or ``includes zero`` for a paired ``[low, high]``;
    ``too few seeds`` where there is no interval (one seed)."""
    if entry.get("low") is None:
        return "too few seeds"
    if entry["low"] > 0:
        return "above zero"
    if entry["high"] < 0:
        return "below zero"
    return "includes zero"


def label(comparison: Comparison) -> str:
    """``MMPO (T=4) minus GRPO`` and the like."""
    names = (ALL_METHODS[name].label for name in (comparison.method, comparison.other))
    return " minus ".join(names)


def family_verdicts(numbers: dict[str, Any]) -> list[dict[str, Any]]:
    """Every comparison of :data:`CLAIMS` the study ran at one checkpoint, with its raw
    interval and verdict, its p-value, its Holm-adjusted p-value over the family (the
    comparisons with two seeds or more) and its verdict after Holm (see the module
    docstring); ``agrees`` says whether a resolved verdict has the claim's sign."""
    rows = []
    for claim in CLAIMS:
        for comparison in claim.comparisons:
            entry = paired_entry(numbers, comparison)
            if entry is None:
                continue
            if "p" not in entry:
                raise MMPOInputError(
                    "the study's numbers predate the family-wise verdicts (no p-values): "
                    "run `nemo-mmpo study report --out <folder>` again"
                )
            rows.append(
                {
                    "claim": claim.text,
                    "source": claim.source,
                    "comparison": label(comparison),
                    "metric": comparison.metric,
                    "sign": comparison.sign,
                    **{key: entry[key] for key in ("mean", "low", "high", "n", "p")},
                    "raw_verdict": raw_verdict(entry),
                }
            )
    tested = [row for row in rows if row["p"] is not None]
    for row, adjusted in zip(tested, holm([row["p"] for row in tested]), strict=True):
        row["p_holm"] = adjusted
    for row in rows:
        resolved = row["raw_verdict"] in ("above zero", "below zero")
        if row["p"] is None:
            row["p_holm"], row["verdict"] = None, "too few seeds"
        elif resolved and row["p_holm"] < FAMILY_ALPHA:
            row["verdict"] = row["raw_verdict"]
        else:
            row["verdict"] = "includes zero"
        row["family_size"] = len(tested)
        row["agrees"] = {"above zero": 1, "below zero": -1}.get(row["verdict"]) == row["sign"]
    return rows


def claim_summary(rows: list[dict[str, Any]]) -> str:
    """One claim's verdict after Holm from its comparisons' rows."""
    if all(row["verdict"] == "too few seeds" for row in rows):
        return "too few seeds"
    resolved = [row for row in rows if row["verdict"] in ("above zero", "below zero")]
    if any(not row["agrees"] for row in resolved):
        return "contradicted (a comparison resolved against it)"
    if resolved and len(resolved) == len(rows):
        return "holds"
    if resolved:
        return f"holds in part ({len(resolved)} of {len(rows)} comparisons)"
    return "not resolved"
