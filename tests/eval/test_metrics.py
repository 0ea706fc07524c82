"""Metrics against brute force and hand-worked values."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_mmpo import MMPOInputError
from nemo_mmpo.eval.metrics import (
    average_at_k,
    common_filter,
    first_success_distribution,
    gini,
    gini_by_method,
    lorenz_curve,
    pass_at_k,
)


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    """Average over all k-subsets of the n samples of 'at least one correct'."""
    outcomes = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(outcomes[i] for i in subset) for subset in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_equals_the_average_over_all_subsets(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            got = pass_at_k([n], [c], k)[0]
            assert got == pytest.approx(brute_pass_at_k(n, c, k), abs=1e-12)
            assert got == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_pass_at_k_is_stable_for_large_n():
    value = pass_at_k([1000], [3], 500)[0]
    exact = 1 - math.comb(997, 500) / math.comb(1000, 500)
    assert value == pytest.approx(exact, rel=1e-12)


def test_first_success_distribution_equals_the_average_over_orderings():
    samples, correct = [5, 4, 6], [2, 0, 6]
    result = first_success_distribution(samples, correct, max_attempts=4)
    expected = np.zeros(4)
    for n, c in zip(samples, correct, strict=True):
        orderings = set(itertools.permutations([1] * c + [0] * (n - c)))
        for t in range(1, 5):
            expected[t - 1] += np.mean([any(order[:t]) for order in orderings]) / len(samples)
    assert np.allclose(result["cdf"], expected)
    assert np.allclose(np.cumsum(result["pmf"]), expected)
    assert result["never_solved"] == pytest.approx(1 - expected[-1])


@given(st.lists(st.floats(0, 1), min_size=1, max_size=30))
@settings(max_examples=100, deadline=None)
def test_gini_three_forms_agree(values):
    values = np.array(values)
    if values.sum() == 0:
        assert gini(values) == 0.0
        return
    n = values.size
    scaled = values / values.max()  # Gini is scale-free; keeps the reference's mean off 0
    pairwise = np.abs(scaled[:, None] - scaled[None, :]).sum() / (2 * n**2 * scaled.mean())
    shares_x, shares_y = lorenz_curve(values)
    area = float(np.sum((shares_y[1:] + shares_y[:-1]) / 2 * np.diff(shares_x)))
    assert gini(values) == pytest.approx(pairwise, abs=1e-9)
    assert gini(values) == pytest.approx(1 - 2 * area, abs=1e-9)


def test_gini_equal_and_degenerate_cases():
    assert gini([0.3] * 10) == pytest.approx(0.0, abs=1e-12)
    assert gini([0, 0, 0, 1.0]) == pytest.approx(3 / 4)
    with pytest.raises(MMPOInputError, match="empty"):
        gini([])


def test_common_filter_and_normalised_gini():
    success = {
        "a": np.array([0.0, 0.05, 0.5, 1.0, 0.95, 0.2]),
        "b": np.array([0.0, 0.50, 0.4, 1.0, 0.99, 0.95]),
    }
    keep = common_filter(success, alpha=0.1)
    # dropped: problem 0 (both < 0.1) and problem 3/4 (both > 0.9)
    assert keep.tolist() == [False, True, True, False, False, True]
    result = gini_by_method(success, alpha=0.1)
    assert result["kept"] == 3
    z = success["a"][keep] / success["a"][keep].mean()
    expected = np.abs(z[:, None] - z[None, :]).sum() / (2 * 3**2)
    assert result["methods"]["a"]["gini"] == pytest.approx(expected)


def test_average_and_bad_counts():
    assert average_at_k([4, 2], [1, 2]).tolist() == [0.25, 1.0]
    with pytest.raises(MMPOInputError, match="problem 1 has 3 correct of 2"):
        average_at_k([4, 2], [1, 3])
    with pytest.raises(MMPOInputError, match="pass@5"):
        pass_at_k([4], [1], 5)
