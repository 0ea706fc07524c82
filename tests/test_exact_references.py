"""Exact references for values a plausible bug could shift without failing the other tests.

Each test compares with an independent computation at ``rtol=0`` and a tight absolute
tolerance (default relative tolerances hide errors of 1e-6): the default truncation order,
the reward threshold's ``>=``, GRPO's epsilon placement, and the empirical-Bayes estimator's
posterior weight, prior fit and failure/success asymmetry.
"""

from __future__ import annotations

import math

import pytest
import torch
from scipy import integrate, stats

from nemo_mmpo import compute_advantages, mmpo_advantages, moment_objective
from nemo_mmpo.empirical_bayes import fit_beta_prior, posterior_weight
from nemo_mmpo.grouping import RewardGroups


def weight(failure: float, order: int) -> float:
    """``w_T(f) = sum_{k=1..T} k f^(k-1)``."""
    return sum(k * failure ** (k - 1) for k in range(1, order + 1))


def expected_weight(failure_shape: float, success_shape: float, order: int) -> float:
    """``E[w_T(F)]`` for ``F ~ Beta(failure_shape, success_shape)`` by numerical integration."""
    density = stats.beta(failure_shape, success_shape).pdf
    value, _ = integrate.quad(
        lambda f: weight(f, order) * density(f), 0, 1, epsabs=1e-13, epsrel=1e-12, limit=200
    )
    return value


def test_mmpo_advantages_default_is_the_paper_order_four():
    rewards = torch.tensor(
        [[1.0, 1, 0, 0, 0, 0, 0, 0], [1.0, 1, 1, 1, 1, 1, 1, 0]], dtype=torch.float64
    )
    expected = torch.tensor(
        [
            [
                weight(1 - row.mean().item(), 4) * (value - row.mean().item())
                for value in row.tolist()
            ]
            for row in rewards
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(mmpo_advantages(rewards), expected, rtol=0, atol=1e-12)
    assert mmpo_advantages(rewards)[0, 0].item() == pytest.approx(5.875 * 0.75, abs=1e-12)


def test_reward_exactly_at_the_threshold_is_a_success():
    rewards = torch.tensor([0.5, 0.4999, 1.0, 0.0, 0.5, 0.2], dtype=torch.float64)
    group_ids = torch.tensor([0, 0, 0, 1, 1, 1])
    binary = torch.tensor([1.0, 0, 1, 0, 1, 0], dtype=torch.float64)
    thresholded = compute_advantages(rewards, group_ids, reward_threshold=0.5)
    torch.testing.assert_close(thresholded, compute_advantages(binary, group_ids), rtol=0, atol=0)


@pytest.mark.parametrize("leave_one_out", [False, True])
def test_grpo_divides_by_std_plus_epsilon(leave_one_out):
    pattern = [1.0, 0, 0, 1, 1, 0, 0, 0]
    rewards = torch.tensor(pattern, dtype=torch.float64)
    group_ids = torch.zeros(8, dtype=torch.long)
    ours = compute_advantages(rewards, group_ids, None, "grpo", leave_one_out=leave_one_out)
    for index, reward in enumerate(pattern):
        others = pattern[:index] + pattern[index + 1 :] if leave_one_out else pattern
        mean = sum(others) / len(others)
        std = math.sqrt(sum((value - mean) ** 2 for value in others) / (len(others) - 1))
        expected = (reward - mean) / (std + 1e-6)
        assert ours[index].item() == pytest.approx(expected, rel=0, abs=1e-12)


@pytest.mark.parametrize(
    ("failure_shape", "success_shape", "order"),
    [(9.0, 1.0, 2), (2.5, 0.7, 4), (0.6, 3.2, 4), (12.3, 4.1, 6)],
)
def test_posterior_weight_equals_numerical_integration(failure_shape, success_shape, order):
    expected = expected_weight(failure_shape, success_shape, order)
    ours = posterior_weight(
        moment_objective("mmpo", order),
        torch.tensor([failure_shape], dtype=torch.float64),
        torch.tensor([success_shape], dtype=torch.float64),
    )
    assert ours.item() == pytest.approx(expected, rel=1e-9)


def test_prior_fit_recovers_known_beta_parameters():
    generator = torch.Generator().manual_seed(0)
    alpha, beta, groups, size = 2.0, 5.0, 200_000, 16
    success = torch.distributions.Beta(alpha, beta).sample((groups,))
    rewards = (torch.rand(groups, size, generator=generator) < success[:, None]).double()
    fitted_alpha, fitted_beta = fit_beta_prior(RewardGroups.from_dense(rewards))
    assert fitted_alpha.item() == pytest.approx(alpha, rel=0.05)
    assert fitted_beta.item() == pytest.approx(beta, rel=0.05)


# quad warns about roundoff at a Beta endpoint singularity; the tolerance below allows for it
@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
def test_empirical_bayes_uses_failures_for_the_failure_shape():
    """All-fail and all-pass groups get the exact posterior weights, not each other's."""
    rewards = torch.tensor(
        [[0.0] * 8, [1.0] * 8, [1.0, 0, 0, 0, 0, 0, 0, 0], [1.0, 1, 1, 1, 1, 1, 0, 0]],
        dtype=torch.float64,
    )
    groups = RewardGroups.from_dense(rewards)
    alpha, beta = (value.item() for value in fit_beta_prior(groups))
    objective = moment_objective("mmpo", 4)
    advantages = compute_advantages(
        rewards.flatten(), torch.arange(4).repeat_interleave(8), objective, "empirical_bayes"
    ).reshape(4, 8)
    for row in range(4):
        successes = rewards[row].sum().item()
        group_weight = expected_weight(beta + 8 - successes, alpha + successes, 4)
        mean = successes / 8
        expected = torch.tensor(
            [group_weight * (value - mean) for value in rewards[row].tolist()],
            dtype=torch.float64,
        )
        # quad is accurate to ~1e-8 relative when a shape is below 1 (endpoint singularity)
        torch.testing.assert_close(advantages[row], expected, rtol=1e-7, atol=1e-12)
    swapped = posterior_weight(
        objective,
        torch.tensor([alpha + 8.0], dtype=torch.float64),
        torch.tensor([beta], dtype=torch.float64),
    )
    correct = posterior_weight(
        objective,
        torch.tensor([beta + 8.0], dtype=torch.float64),
        torch.tensor([alpha], dtype=torch.float64),
    )
    assert abs(swapped.item() - correct.item()) > 1e-3  # swapping the shapes is visible
