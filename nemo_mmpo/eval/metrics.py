"""Evaluation metrics from per-problem counts, exactly as the paper defines them.

Inputs are per-problem sample counts ``n`` and correct counts ``c`` (arrays ``[num_problems]``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from nemo_mmpo.errors import MMPOInputError

#: The pass@k of the paper's tables, and of every report here.
TABLE_PASS_AT = (1, 4, 8, 16)
#: The pass@k recorded at each evaluation step of a run.
STEP_PASS_AT = (1, 2, 4, 8, 16)


def _counts(samples: Sequence[int] | np.ndarray, correct: Sequence[int] | np.ndarray):
    samples = np.asarray(samples, dtype=np.int64)
    correct = np.asarray(correct, dtype=np.int64)
    if samples.shape != correct.shape or samples.ndim != 1:
        raise MMPOInputError(
            f"samples {samples.shape} and correct {correct.shape} must be equal 1-D shapes"
        )
    if np.any(correct < 0) or np.any(correct > samples):
        index = int(np.argmax((correct < 0) | (correct > samples)))
        raise MMPOInputError(
            f"problem {index} has {correct[index]} correct of {samples[index]} samples; "
            "need 0 <= correct <= samples"
        )
    return samples, correct


def pass_at_k(samples, correct, k: int) -> np.ndarray:
    """Unbiased pass@k per problem: ``1 - C(n-c, k)/C(n, k)`` (Chen et al. 2021).

    Stable product form ``1 - prod_{i=n-c+1..n} (1 - k/i)``; needs ``k <= n``.
    """
    samples, correct = _counts(samples, correct)
    if k < 1 or np.any(samples < k):
        smallest = int(samples.min()) if samples.size else 0
        raise MMPOInputError(f"pass@{k} needs 1 <= k <= samples per problem (smallest: {smallest})")
    result = np.ones(samples.shape, dtype=np.float64)
    for index, (n, c) in enumerate(zip(samples, correct, strict=True)):
        if n - c >= k:
            result[index] = 1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1))
    return result


def average_at_k(samples, correct) -> np.ndarray:
    """avg@n per problem: the mean correctness of its samples (pass@1)."""
    samples, correct = _counts(samples, correct)
    return correct / samples


def first_success_distribution(samples, correct, max_attempts: int | None = None) -> dict:
    """Distribution of the attempt at which the first success comes, over a random order.

    ``P(T <= t) = pass@t`` for each problem; returns the benchmark averages
    ``cdf[t-1] = mean_i P(T_i <= t)`` and ``pmf`` for t = 1..max_attempts, and
    ``never_solved = 1 - cdf[-1]`` (no success within ``max_attempts`` samples).
    """
    samples, correct = _counts(samples, correct)
    attempts = int(samples.min()) if max_attempts is None else max_attempts
    cdf = np.array([pass_at_k(samples, correct, t).mean() for t in range(1, attempts + 1)])
    pmf = np.diff(np.concatenate([[0.0], cdf]))
    return {"cdf": cdf, "pmf": pmf, "never_solved": float(1.0 - cdf[-1])}


def gini(values: Sequence[float] | np.ndarray) -> float:
    """Gini coefficient ``sum_ij |v_i - v_j| / (2 n^2 mean(v))`` (0 when all are equal)."""
    values = np.sort(np.asarray(values, dtype=np.float64))
    n = values.size
    if n == 0:
        raise MMPOInputError("Gini of an empty set of problems; relax the filter threshold")
    total = values.sum()
    if total <= 0:
        return 0.0
    ranks = np.arange(1, n + 1)
    return float(2.0 * np.sum(ranks * values) / (n * total) - (n + 1) / n)


def lorenz_curve(values: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(q/n, share of the total held by the q smallest values)`` for q = 0..n."""
    values = np.sort(np.asarray(values, dtype=np.float64))
    total = values.sum()
    cumulative = np.concatenate([[0.0], np.cumsum(values)])
    shares = cumulative / total if total > 0 else np.linspace(0.0, 1.0, values.size + 1)
    return np.linspace(0.0, 1.0, values.size + 1), shares


def common_filter(success_by_method: Mapping[str, np.ndarray], alpha: float) -> np.ndarray:
    """The paper's retained set: ``max_m s_i >= alpha`` and ``min_m s_i <= 1 - alpha``."""
    stacked = np.stack([np.asarray(v, dtype=np.float64) for v in success_by_method.values()])
    return (stacked.max(axis=0) >= alpha) & (stacked.min(axis=0) <= 1.0 - alpha)


def gini_by_method(success_by_method: Mapping[str, np.ndarray], alpha: float) -> dict:
    """Per method: Gini and Lorenz curve of mean-normalised success on the common subset.

    Appendix "Gini Coefficient and Lorenz Curve": keep problems not too hard or too easy for
    all methods, normalise ``z_i = s_i / mean(s)`` per method, then Gini and Lorenz of ``z``.
    """
    keep = common_filter(success_by_method, alpha)
    result = {"kept": int(keep.sum()), "alpha": alpha, "methods": {}}
    for method, success in success_by_method.items():
        subset = np.asarray(success, dtype=np.float64)[keep]
        mean = subset.mean() if subset.size else 0.0
        normalised = subset / mean if mean > 0 else subset
        result["methods"][method] = {
            "gini": gini(normalised) if subset.size else float("nan"),
            "lorenz": lorenz_curve(normalised) if subset.size else None,
            "mean_success": float(mean),
        }
    return result
