"""The study's intervals and tests over seeds: calibrated at every number of seeds from two.

- Per method: the Student-t interval of the mean over seeds (:func:`interval`).
- Paired (method minus method, same seed): the wider of the paired Student-t interval and the
  expanded percentile bootstrap, bound by bound (:func:`paired_bounds`). The t interval alone
  is exact for normal differences at every n; the expanded bootstrap (Hesterberg 2015) alone
  is not: with two seeds its tail probability goes to zero and its bounds are the two seeds'
  differences, which cover the mean about half the time (0.51 at n = 2, 0.75 at 3, 0.87 at 4,
  0.92 at 5 for normal differences; ``tests/test_study_report.py``). Taking the wider bound
  keeps the t interval's coverage and the bootstrap's asymmetry where the differences are
  skewed (there it adds about 0.005 of coverage from five seeds on).
- A p-value per paired difference: the paired t-test's, two-sided, from Student's t CDF in
  closed form (:func:`t_two_sided_p`), for the family-wise correction of the claims
  (:func:`holm`, in :mod:`nemo_mmpo.study.claims`).

What the simulation shows (20,000 simulated studies per n, n = 2..10): normal differences,
coverage 0.95 at every n (the t interval's, by construction); the difference of an exponential
and a normal (skewness 0.7: two methods whose seed-to-seed spread has different shapes)
0.945-0.955. Strongly skewed differences (exponential, skewness 2) are covered 0.88-0.92 from
three seeds on by this interval and by every other one tried (t, bootstrap): the 95% is
nominal for differences that are near-symmetric, as differences of two methods with the same
seed-to-seed noise are.
"""

from __future__ import annotations

import math

import numpy as np

#: Student's t at 0.975 for 1..30 degrees of freedom (then the normal's 1.96).
T_975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip

#: Bootstrap resamples of the seeds for the paired interval.
DRAWS = 10_000


def t_975(degrees_of_freedom: int) -> float:
    """Student's t at 0.975 (the table's, then the normal's 1.96 past 30 degrees of freedom)."""
    if degrees_of_freedom <= len(T_975):
        return T_975[degrees_of_freedom - 1]
    return 1.96


def interval(values: list[float]) -> dict[str, float]:
    """Mean and 95% half-width over seeds (Student's t; 0 half-width for one seed)."""
    array = np.asarray(values, dtype=np.float64)
    if array.size < 2:
        return {"mean": float(array.mean()), "half_width": 0.0, "n": int(array.size)}
    t = t_975(array.size - 1)
    return {
        "mean": float(array.mean()),
        "half_width": float(t * array.std(ddof=1) / np.sqrt(array.size)),
        "n": int(array.size),
    }


def t_bounds(differences: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The paired Student-t 95% interval of the mean over the last axis (seeds)."""
    count = differences.shape[-1]
    mean = differences.mean(axis=-1)
    half_width = t_975(count - 1) * differences.std(axis=-1, ddof=1) / math.sqrt(count)
    return mean - half_width, mean + half_width


def expanded_tail(count: int) -> float:
    """The lower tail probability of the expanded 95% percentile interval for ``count`` seeds:
    ``Phi(-sqrt(n / (n - 1)) * t_{0.975, n - 1})`` (Hesterberg, "What teachers should know
    about the bootstrap", The American Statistician 69(4), 2015)."""
    if count < 2:
        return 0.025
    return 0.5 * math.erfc(math.sqrt(count / (count - 1)) * t_975(count - 1) / math.sqrt(2.0))


def expanded_bootstrap_bounds(
    differences: np.ndarray, draws: int = DRAWS, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """The expanded percentile bootstrap's 95% bounds of the mean over the last axis (seeds).

    The percentiles are taken at :func:`expanded_tail` instead of 2.5% (Hesterberg 2015). Every
    row (a leading axis: simulated studies) is resampled with the same ``draws`` index sets,
    drawn from ``seed``: the resampled means are a matrix product with their weights.
    """
    count = differences.shape[-1]
    indices = np.random.default_rng(seed).integers(0, count, size=(draws, count))
    weights = (indices[:, :, None] == np.arange(count)).sum(axis=1) / count
    means = differences @ weights.T
    tail = expanded_tail(count)
    low_rank, high_rank = int(tail * draws), int((1.0 - tail) * draws) - 1
    ordered = np.partition(means, (low_rank, high_rank), axis=-1)
    return ordered[..., low_rank], ordered[..., high_rank]


def paired_bounds(
    differences: np.ndarray, draws: int = DRAWS, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """The paired 95% interval over the last axis (two seeds or more): the lower of the paired
    t and the expanded bootstrap's lower bounds, the higher of their upper bounds (see the
    module docstring for why, and for the coverage it has)."""
    t_low, t_high = t_bounds(differences)
    bootstrap_low, bootstrap_high = expanded_bootstrap_bounds(differences, draws, seed)
    return np.minimum(t_low, bootstrap_low), np.maximum(t_high, bootstrap_high)


def t_two_sided_p(statistic: float, degrees_of_freedom: int) -> float:
    """``P(|T| >= |statistic|)`` for Student's t, in closed form for integer degrees of freedom
    (Abramowitz and Stegun, Handbook of Mathematical Functions, 26.7.3 and 26.7.4): with
    ``theta = atan(|t| / sqrt(nu))``, ``P(|T| < |t|)`` is a finite series in ``cos(theta)``."""
    if math.isinf(statistic):
        return 0.0
    theta = math.atan(abs(statistic) / math.sqrt(degrees_of_freedom))
    sine, cosine = math.sin(theta), math.cos(theta)
    if degrees_of_freedom % 2:  # odd: (2/pi) (theta + sin cos [1 + 2/3 cos^2 + 2.4/3.5 cos^4 ...])
        term, series = cosine, 0.0
        for j in range((degrees_of_freedom - 1) // 2):
            if j:
                term *= cosine**2 * (2 * j) / (2 * j + 1)
            series += term
        inside = 2.0 / math.pi * (theta + sine * series)
    else:  # even: sin [1 + 1/2 cos^2 + 1.3/2.4 cos^4 + ...]
        term, series = 1.0, 0.0
        for j in range(degrees_of_freedom // 2):
            if j:
                term *= cosine**2 * (2 * j - 1) / (2 * j)
            series += term
        inside = sine * series
    return min(1.0, max(0.0, 1.0 - inside))


def paired_t_p(differences: list[float]) -> float:
    """The paired t-test's two-sided p-value that the mean difference is zero (two seeds or
    more); identical differences give 0 (or 1 when they are all zero)."""
    array = np.asarray(differences, dtype=np.float64)
    mean, spread = float(array.mean()), float(array.std(ddof=1))
    if spread == 0.0:
        return 1.0 if mean == 0.0 else 0.0
    return t_two_sided_p(mean / (spread / math.sqrt(array.size)), array.size - 1)


def paired_interval(differences: list[float], draws: int = DRAWS, seed: int = 0) -> dict:
    """A paired difference over seeds: mean, 95% interval (:func:`paired_bounds`), the t-test's
    p-value, n and the per-seed differences. With one seed there is no interval and no p-value
    (``low``, ``high`` and ``p`` are None)."""
    array = np.asarray(differences, dtype=np.float64)
    entry = {
        "mean": float(array.mean()),
        "low": None,
        "high": None,
        "p": None,
        "n": int(array.size),
        "differences": [float(value) for value in array],
    }
    if array.size >= 2:
        low, high = paired_bounds(array, draws, seed)
        entry |= {"low": float(low), "high": float(high), "p": paired_t_p(array)}
    return entry


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm, "A simple sequentially rejective multiple
    test procedure", Scandinavian Journal of Statistics 6(2), 1979): the i-th smallest of m is
    ``max over j <= i of min(1, (m - j + 1) p_(j))``; rejecting where it is below alpha keeps
    the family-wise error rate at alpha under any dependence between the tests."""
    order = sorted(range(len(p_values)), key=lambda index: p_values[index])
    adjusted = [1.0] * len(p_values)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted
