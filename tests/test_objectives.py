"""Moment objectives: coefficients, weights, the paper's toy example and Proposition 1."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_mmpo import MMPOInputError, moment_objective
from nemo_mmpo.objectives import MomentObjective, beta_moments


def test_coefficients_of_each_kind():
    assert moment_objective("mmpo", 4).coefficients == (1.0, 1.0, 1.0, 1.0)
    assert moment_objective("maxrl", 3).coefficients == (1.0, 0.5, 1.0 / 3.0)
    assert moment_objective("pass_at_k", k=3).coefficients == (0.0, 0.0, 1.0)
    assert moment_objective("reinforce").coefficients == (1.0,)
    assert moment_objective("explicit", coefficients=[2, 1]).coefficients == (2.0, 1.0)
    constant = moment_objective("mmpo", 3, transform="constant", constant=0.5)
    assert constant.coefficients == (0.5, 0.25, 0.125)
    beta = moment_objective("mmpo", 3, transform="beta", alpha=2.0, beta=3.0)
    # E[U] = 2/5, E[U^2] = 2*3/(5*6), E[U^3] = 2*3*4/(5*6*7)
    assert beta.coefficients == pytest.approx((0.4, 0.2, 24 / 210))


@pytest.mark.parametrize("lam", [0.1, 0.5, 2.0])
def test_beta_lambda_one_moments_are_lambda_over_lambda_plus_k(lam):
    assert beta_moments(lam, 1.0, 6) == pytest.approx(tuple(lam / (lam + k) for k in range(1, 7)))


def test_beta_moments_match_numerical_integration():
    alpha, beta = 1.5, 2.5
    grid = torch.linspace(0, 1, 200_001, dtype=torch.float64)[1:-1]
    density = grid ** (alpha - 1) * (1 - grid) ** (beta - 1)
    density = density / torch.trapezoid(density, grid)
    numeric = [float(torch.trapezoid(density * grid**k, grid)) for k in range(1, 5)]
    assert beta_moments(alpha, beta, 4) == pytest.approx(numeric, rel=1e-5)


def test_maxrl_is_the_small_lambda_limit_of_beta_lambda_one_up_to_scale():
    maxrl = torch.tensor(moment_objective("maxrl", 6).coefficients)
    errors = []
    for lam in (1e-2, 1e-4, 1e-6):
        beta = moment_objective("mmpo", 6, transform="beta", alpha=lam, beta=1.0)
        scaled = torch.tensor(beta.coefficients) / lam
        errors.append(float((scaled - maxrl).abs().max()))
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 1e-5


@given(
    coefficients=st.lists(st.floats(-3, 3), min_size=1, max_size=8),
    failure_rate=st.floats(0, 1),
)
@settings(max_examples=60, deadline=None)
def test_weight_is_the_derivative_of_the_objective(coefficients, failure_rate):
    objective = MomentObjective(tuple(coefficients))
    f = torch.tensor(failure_rate, dtype=torch.float64, requires_grad=True)
    objective.value(f).backward()
    assert float(objective.weight(f.detach())) == pytest.approx(float(f.grad), abs=1e-9)


def test_mmpo_weight_reaches_t_t_plus_one_over_two_at_total_failure():
    for order in range(1, 9):
        objective = moment_objective("mmpo", order)
        assert float(objective.weight(torch.tensor(1.0))) == order * (order + 1) / 2
        assert float(objective.weight(torch.tensor(0.0))) == 1.0


def uniform_moment(low: Fraction, high: Fraction, order: int) -> Fraction:
    return (high ** (order + 1) - low ** (order + 1)) / ((order + 1) * (high - low))


def test_paper_toy_example_moments():
    """Appendix 'A Toy Example on Moments': Unif(0.3, 0.5) vs Beta(1/2, 1)."""
    low, high = Fraction(3, 10), Fraction(1, 2)
    uniform = [uniform_moment(low, high, k) for k in range(1, 5)]
    assert uniform[0] == Fraction(2, 5)
    assert uniform[3] == Fraction(1441, 50000)
    assert sum(uniform) == Fraction(99023, 150000)
    beta = beta_moments(0.5, 1.0, 4)  # E[F^k] for F ~ Beta(1/2, 1)
    assert beta[0] == pytest.approx(1 / 3)
    assert beta[3] == pytest.approx(1 / 9)
    assert sum(beta) == pytest.approx(248 / 315)
    mmpo = moment_objective("mmpo", 4)
    # J_T as a linear functional of the moment sequence prefers theta_1; the mean prefers theta_2.
    j_uniform = sum(a * float(m) for a, m in zip(mmpo.coefficients, uniform, strict=True))
    j_beta = sum(a * m for a, m in zip(mmpo.coefficients, beta, strict=True))
    assert j_uniform < j_beta
    assert float(uniform[0]) > beta[0]


def reweighting_factor(order: int, ratio: float) -> float:
    """c_T(rho) of Proposition 1."""
    return (
        2
        * (ratio ** (order + 1) - (order + 1) * ratio + order)
        / (order * (order + 1) * (ratio - 1) ** 2)
    )


def threshold_ratio(order: int) -> float:
    """Smallest rho with sum_{k<T} (T-k) rho^k > T^2 (bisection)."""
    low, high = 1.0, 10.0
    for _ in range(200):
        middle = (low + high) / 2
        value = sum((order - k) * middle**k for k in range(1, order))
        low, high = (middle, high) if value <= order**2 else (low, middle)
    return (low + high) / 2


@pytest.mark.parametrize(("order", "expected"), [(3, 2.1623), (4, 1.7112), (5, 1.5109)])
def test_proposition_1_thresholds(order, expected):
    ratio = threshold_ratio(order)
    assert round(ratio, 4) == expected
    assert reweighting_factor(order, ratio) == pytest.approx(2.0, abs=1e-9)
    assert reweighting_factor(order, ratio * 1.001) > 2.0
    assert reweighting_factor(order, ratio * 0.999) < 2.0


@given(
    order=st.integers(2, 10),
    easy=st.floats(1e-3, 0.99),
    ratio=st.floats(1.0 + 1e-3, 50.0),
)
@settings(max_examples=200, deadline=None)
def test_moderate_reweighting_bound(order, easy, ratio):
    """Proposition 1: 1 <= w(hard)/w(easy) <= W(hard)/W(easy) / c_T(rho), c_T >= 1."""
    hard = easy * ratio
    if hard >= 1.0:
        return
    mmpo = moment_objective("mmpo", order)
    pass_at_t = moment_objective("pass_at_k", k=order)
    f = torch.tensor([hard, easy], dtype=torch.float64)
    mmpo_weight = mmpo.weight(f)
    pass_weight = pass_at_t.weight(f)
    mmpo_ratio = float(mmpo_weight[0] / mmpo_weight[1])
    pass_ratio = float(pass_weight[0] / pass_weight[1])
    factor = reweighting_factor(order, ratio)
    assert factor >= 1.0 - 1e-12
    assert 1.0 <= mmpo_ratio * (1 + 1e-12)
    assert mmpo_ratio <= pass_ratio / factor * (1 + 1e-9)


transforms = st.one_of(
    st.just({"transform": "none"}),
    st.builds(lambda c: {"transform": "constant", "constant": c}, st.floats(0.05, 1.0)),
    st.builds(
        lambda a, b: {"transform": "beta", "alpha": a, "beta": b},
        st.floats(0.05, 5.0),
        st.floats(0.05, 5.0),
    ),
)


@given(
    failure_rates=st.lists(st.floats(0.0, 1.0), min_size=2, max_size=12),
    order=st.integers(2, 8),
    transform=transforms,
    data=st.data(),
)
@settings(max_examples=150, deadline=None)
def test_generalised_objective_is_schur_convex(failure_rates, order, transform, data):
    """Theorem 2: a Robin Hood transfer (f majorises g, same mean) strictly lowers J_{U,T}."""
    i = data.draw(st.integers(0, len(failure_rates) - 1))
    j = data.draw(st.integers(0, len(failure_rates) - 1))
    high, low = max(failure_rates[i], failure_rates[j]), min(failure_rates[i], failure_rates[j])
    if i == j or high - low < 1e-3:
        return
    share = data.draw(st.floats(0.05, 0.5))
    transfer = share * (high - low)
    f = torch.tensor(failure_rates, dtype=torch.float64)
    g = f.clone()
    hi_index, lo_index = (i, j) if failure_rates[i] >= failure_rates[j] else (j, i)
    g[hi_index] -= transfer
    g[lo_index] += transfer
    objective = moment_objective("mmpo", order, **transform)
    assert float(objective.value(f).mean()) > float(objective.value(g).mean())


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"kind": "mmpo", "truncation_order": 0}, "got 0"),
        ({"kind": "mmpo", "truncation_order": 2.5}, "got 2.5"),
        ({"kind": "wat"}, "'wat'"),
        ({"kind": "pass_at_k"}, "got None"),
        ({"kind": "mmpo", "transform": "constant", "constant": 1.5}, "constant=1.5"),
        ({"kind": "mmpo", "transform": "beta", "alpha": -1.0, "beta": 1.0}, "alpha=-1.0"),
        ({"kind": "maxrl", "transform": "constant", "constant": 0.5}, "kind='maxrl'"),
        ({"kind": "explicit"}, "coefficients"),
        ({"kind": "explicit", "coefficients": [1.0, math.nan]}, "a_2 = nan"),
    ],
)
def test_bad_objectives_name_the_value(kwargs, fragment):
    with pytest.raises(MMPOInputError) as error:
        moment_objective(**kwargs)
    assert fragment in str(error.value)
