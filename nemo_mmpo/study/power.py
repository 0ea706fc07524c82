"""How many seeds a confirmatory study needs: ``nemo-mmpo study power``.

From the pilot's committed records (``docs/results/study`` and ``docs/results/check``: MMPO and
GRPO on seeds 0-9), each candidate claim's paired differences (MMPO minus GRPO, one per seed,
:func:`seed_differences`, with the report's metric code) give a mean and a standard deviation,
and from them the seeds a paired, two-sided test needs for 80% power:

- the **normal approximation** ``n = ((z_{1-a/2} + z_{0.8}) sd / |mean|)^2``, rounded up (the
  issue's table);
- the **paired t test's exact power** (the noncentral t, :func:`t_power`, integrated here so
  that numpy is all it needs; ``tests/test_study_power.py`` checks it against scipy), and the
  fewest seeds that reach 80% with it (:func:`seeds_for_power`). The plan uses this one: it is
  the power of the test the analysis runs, and at these sizes it needs three to five seeds
  more than the normal approximation, which ignores that the spread is estimated.

A family of ``m`` claims is read with Holm's correction. Holm rejects every claim that
Bonferroni (each at ``a / m``) rejects, and more, so planning each claim at ``a / m`` is the
conservative bound: the power under Holm is at least the one computed.

The pilot's means are estimates from ten seeds (their standard error is a third of their sd),
so the table also gives the effect each claim resolves with 80% power at the planned number of
seeds (:func:`detectable_effect`): the size below which a null result is expected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.io import markdown_table
from nemo_mmpo.study.comparison import display_scale, finished_runs, paired_difference
from nemo_mmpo.study.intervals import t_two_sided_p
from nemo_mmpo.study.methods import PROPOSED, REFERENCE

#: Two-sided family-wise error rate and the power the plan asks for.
ALPHA = 0.05
POWER = 0.80
CHECKPOINTS = ("selected", "final")


@dataclass(frozen=True)
class Candidate:
    """A claim about ``method`` minus ``other`` on ``metric``, with the sign the paper predicts
    (+1 above zero, -1 below). ``metric`` is a paired-table key (``average``, ``pass@16``,
    ``never_solved``, ``gini@0.0``, ...) or a contrast of two (``"pass@16 - pass@1"``)."""

    text: str
    metric: str
    sign: int


#: The claims the power table is computed for (MMPO minus GRPO). pass@16 with 16 samples is
#: the share of problems solved at least once: ``1 - never_solved / 240``, the same claim.
CANDIDATES = (
    Candidate("per-problem success more even (Gini, α = 0, unfiltered)", "gini@0.0", -1),
    Candidate("per-problem success more even (Gini, α = 0.1)", "gini@0.1", -1),
    Candidate("fewer problems never solved in 16 samples", "never_solved", -1),
    Candidate("pass@16 higher (never solved, in other units)", "pass@16", +1),
    Candidate("the lead grows with k (pass@16 lead minus pass@1 lead)", "pass@16 - pass@1", +1),
    Candidate("pass@4 higher", "pass@4", +1),
    Candidate("average accuracy higher (= pass@1)", "average", +1),
)


def units(metric: str) -> str:
    """The unit a metric's difference is shown in (:func:`display_scale` gives the scale)."""
    if metric.startswith("gini"):
        return "Gini coefficient"
    if metric == "never_solved":
        return "problems"
    return "points"


def seed_differences(
    runs: list[dict[str, Any]],
    checkpoint: str,
    metric: str,
    method: str = PROPOSED,
    other: str = REFERENCE,
) -> tuple[list[int], np.ndarray]:
    """The seeds both methods ran (sorted) and ``method`` minus ``other`` on each, shape
    ``(seeds,)``, in the metric's raw unit (fractions, problems, Gini), as the study report
    computes it (:func:`nemo_mmpo.study.comparison.paired_difference`); a contrast
    ``"a - b"`` is the difference of the two metrics' paired differences, seed by seed."""
    paired = paired_difference(runs, checkpoint, method, other)
    if paired is None:
        raise MMPOInputError(f"no seed has both {method} and {other}")
    seeds = sorted(
        {run["seed"] for run in runs if run["method"] == method}
        & {run["seed"] for run in runs if run["method"] == other}
    )
    parts = [part.strip() for part in metric.split(" - ")]
    missing = [part for part in parts if part not in paired]
    if missing or len(parts) > 2:
        raise MMPOInputError(f"metric {metric!r}: choose from {', '.join(paired)} (or 'a - b')")
    values = np.array(paired[parts[0]]["differences"])
    if len(parts) == 2:
        values = values - np.array(paired[parts[1]]["differences"])
    return seeds, values


def t_quantile(probability: float, degrees_of_freedom: int) -> float:
    """Student's t quantile for ``probability`` in (0.5, 1), by bisection on the closed-form
    CDF (:func:`nemo_mmpo.study.intervals.t_two_sided_p`); to 1e-10."""
    tail = 2.0 * (1.0 - probability)
    low, high = 0.0, 1.0
    while t_two_sided_p(high, degrees_of_freedom) > tail:
        high *= 2.0
    while high - low > 1e-10:
        middle = 0.5 * (low + high)
        low, high = (
            (middle, high) if t_two_sided_p(middle, degrees_of_freedom) > tail else (low, middle)
        )
    return 0.5 * (low + high)


_normal_cdf = np.vectorize(NormalDist().cdf, otypes=[float])


def t_power(seeds: int, effect_size: float, alpha: float = ALPHA) -> float:
    """The paired t test's power with ``seeds`` pairs, two-sided at ``alpha``, for a true
    standardised effect ``effect_size`` (mean over sd of the differences): ``P(|T'| > c)``
    with ``T'`` noncentral t (``seeds - 1`` degrees of freedom, noncentrality
    ``effect_size * sqrt(seeds)``), integrated over the sample sd's distribution
    (``u = sqrt(chi2)``, 4001 points; within 1e-5 of scipy's ``nct``)."""
    freedom = seeds - 1
    critical = t_quantile(1.0 - alpha / 2.0, freedom)
    shift = abs(effect_size) * math.sqrt(seeds)
    # u = top * s^2 on an even grid of s: points crowd near u = 0, where a large critical value
    # puts all of the rejection mass when the effect is small
    top = math.sqrt(freedom) + 12.0
    grid = np.linspace(0.0, 1.0, 4001)
    u = top * grid**2
    log_density = (
        math.log(2.0)
        + (freedom - 1) * np.log(np.where(u > 0, u, 1.0))
        - u**2 / 2.0
        - (freedom / 2.0) * math.log(2.0)
        - math.lgamma(freedom / 2.0)
    )
    density = np.where((u > 0) | (freedom == 1), np.exp(log_density), 0.0)
    scale = critical * u / math.sqrt(freedom)
    rejects = _normal_cdf(shift - scale) + _normal_cdf(-shift - scale)
    values = density * rejects * 2.0 * top * grid  # du = 2 top s ds
    return float(np.sum((values[1:] + values[:-1]) * np.diff(grid)) / 2.0)


def seeds_normal(effect_size: float, alpha: float = ALPHA, power: float = POWER) -> int | None:
    """The normal approximation's seeds, ``ceil(((z_{1-alpha/2} + z_power) / d)^2)``; None for
    a zero effect."""
    if effect_size == 0:
        return None
    z = NormalDist().inv_cdf
    return math.ceil(((z(1.0 - alpha / 2.0) + z(power)) / abs(effect_size)) ** 2)


def seeds_for_power(
    effect_size: float, alpha: float = ALPHA, power: float = POWER, most: int = 10_000
) -> int | None:
    """The fewest seeds (two or more) whose paired t test reaches ``power``
    (:func:`t_power`); None for a zero effect or past ``most``."""
    if effect_size == 0 or t_power(most, effect_size, alpha) < power:
        return None
    low, high = 1, 2  # t_power(low) < power <= t_power(high)
    while t_power(high, effect_size, alpha) < power:
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if t_power(middle, effect_size, alpha) < power else (low, middle)
    return high


def detectable_effect(seeds: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The standardised effect the paired t test resolves with ``power`` at ``seeds``."""
    low, high = 0.0, 1.0
    while t_power(seeds, high, alpha) < power:
        high *= 2.0
    while high - low > 1e-6:
        middle = 0.5 * (low + high)
        low, high = (middle, high) if t_power(seeds, middle, alpha) < power else (low, middle)
    return high


def power_rows(
    runs: list[dict[str, Any]],
    family_sizes: tuple[int, ...],
    planned: int,
    candidates: tuple[Candidate, ...] = CANDIDATES,
) -> list[dict[str, Any]]:
    """One row per candidate and checkpoint: the pilot's seeds, mean and sd (raw units), the
    standardised effect, the seeds each family size ``m`` needs (normal, t; each claim at
    ``ALPHA / m``), and at ``planned`` seeds with the first family size the t test's power
    and the smallest effect it resolves with 80% (raw units)."""
    rows = []
    for candidate in candidates:
        for checkpoint in CHECKPOINTS:
            seeds, values = seed_differences(runs, checkpoint, candidate.metric)
            mean, sd = float(values.mean()), float(values.std(ddof=1))
            size = mean / sd if sd > 0 else math.copysign(math.inf, mean)
            first = ALPHA / family_sizes[0]
            rows.append(
                {
                    "claim": candidate.text,
                    "metric": candidate.metric,
                    "sign": candidate.sign,
                    "checkpoint": checkpoint,
                    "seeds": len(seeds),
                    "mean": mean,
                    "sd": sd,
                    "effect_size": size,
                    "needed": {
                        str(m): {
                            "normal": seeds_normal(size, ALPHA / m),
                            "t": seeds_for_power(size, ALPHA / m),
                        }
                        for m in family_sizes
                    },
                    "power_at_planned": t_power(planned, size, first),
                    "detectable_at_planned": detectable_effect(planned, first) * sd,
                }
            )
    return rows


def _number(value: float, metric: str, signed: bool = True) -> str:
    scale, digits = display_scale(metric)
    return f"{scale * value:{'+' if signed else ''}.{digits + 1}f}"


def power_markdown(rows: list[dict[str, Any]], family_sizes: tuple[int, ...], planned: int) -> str:
    """The power table as Markdown (the plan's table is this text)."""
    first = family_sizes[0]
    header = ["claim: MMPO minus GRPO (the paper's sign)", "checkpoint", "units"]
    header += ["pilot mean", "pilot sd", "mean / sd"]
    header += [f"seeds, m = {m} (normal / t)" for m in family_sizes]
    header += [
        f"power at {planned} seeds, m = {first}",
        f"effect resolved with 80% at {planned} seeds",
    ]
    table = []
    for row in rows:
        opposite = " (pilot: opposite)" if row["mean"] * row["sign"] < 0 else ""
        needs = [
            " / ".join("-" if value is None else str(value) for value in need.values())
            for need in row["needed"].values()
        ]
        table.append(
            [
                f"{row['claim']} ({'> 0' if row['sign'] > 0 else '< 0'}){opposite}",
                row["checkpoint"],
                units(row["metric"]),
                _number(row["mean"], row["metric"]),
                _number(row["sd"], row["metric"], signed=False),
                f"{row['effect_size']:+.2f}",
                *needs,
                f"{row['power_at_planned']:.2f}",
                _number(row["detectable_at_planned"], row["metric"], signed=False),
            ]
        )
    return "\n".join(markdown_table(header, table)) + "\n"


def power_table(
    studies: list[str | Path], family_sizes: tuple[int, ...] = (3,), planned: int = 40
) -> str:
    """``study power``: the table from the records (or runs) of ``studies``, pooled."""
    if not family_sizes or min(family_sizes) < 1 or planned < 2:
        raise MMPOInputError("give --claims of 1 or more and --planned of 2 or more")
    runs = finished_runs([Path(study) for study in studies], (PROPOSED, REFERENCE))
    return power_markdown(power_rows(runs, family_sizes, planned), family_sizes, planned)
