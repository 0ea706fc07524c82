"""Baseline estimators against their papers' formulas, written independently with math.comb."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import all_reward_patterns, pattern_probabilities

from nemo_mmpo import compute_advantages, mmpo_advantages, moment_objective

WORKED = torch.tensor([[1, 1, 0, 0, 0, 0, 0, 0]], dtype=torch.float64)  # G = 8, c = 2


def dense(estimator: str, rewards: torch.Tensor = WORKED, **options) -> torch.Tensor:
    return mmpo_advantages(rewards, 1, estimator, **options)


def test_worked_values_from_the_notes():
    """shared/notes/baselines.md: (success, failure) advantages for G = 8, c = 2."""
    cases = {
        "grpo": ({}, (1.620182, -0.540061)),
        "passk_chen": ({"k": 3}, (0.745354, -0.248451)),
        "maxrl": ({}, (3.0, -1.0)),
        "pkpo": ({"k": 3}, (0.267857, 0.0)),
    }
    for estimator, (options, (success, failure)) in cases.items():
        advantages = dense(estimator, **options)[0]
        assert advantages[0].item() == pytest.approx(success, abs=2e-5), estimator
        assert advantages[-1].item() == pytest.approx(failure, abs=2e-5), estimator


def grpo_reference(rewards: list[float], leave_one_out: bool, normalize: bool) -> list[float]:
    """NeMo-RL's GRPO advantage for one group, one rollout at a time."""
    n = len(rewards)
    result = []
    for j, r in enumerate(rewards):
        pool = [x for i, x in enumerate(rewards) if i != j] if leave_one_out else rewards
        baseline = sum(pool) / len(pool)
        std = (
            math.sqrt(sum((x - baseline) ** 2 for x in pool) / (len(pool) - 1))
            if len(pool) > 1
            else 0.0
        )
        advantage = r - baseline if n > 1 else 0.0
        if normalize and std > 0:
            advantage /= std + 1e-6
        result.append(advantage)
    return result


@pytest.mark.parametrize("leave_one_out", [False, True])
@pytest.mark.parametrize("normalize", [False, True])
def test_grpo_matches_reference(leave_one_out, normalize):
    generator = torch.Generator().manual_seed(5)
    for group_size in (2, 3, 5, 8):
        rewards = (torch.rand(30, group_size, generator=generator) < 0.5).double()
        ours = dense("grpo", rewards, leave_one_out=leave_one_out, normalize_std=normalize)
        expected = [grpo_reference(row, leave_one_out, normalize) for row in rewards.tolist()]
        assert torch.allclose(ours, torch.tensor(expected, dtype=torch.float64), atol=1e-12)


def chen_reference(n: int, c: int, k: int) -> tuple[float, float]:
    group_pass = 1 - math.comb(n - c, k) / math.comb(n, k)
    sigma = math.sqrt(group_pass * (1 - group_pass))
    if sigma == 0:
        return 0.0, 0.0
    positive = (1 - group_pass) / (sigma + 1e-6)
    negative = (1 - group_pass - math.comb(n - c - 1, k - 1) / math.comb(n - 1, k - 1)) / (
        sigma + 1e-6
    )
    return positive, negative


def pkpo_reference(n: int, c: int, k: int) -> float:
    return (k / n) * math.comb(n - c, k - 1) / math.comb(n - 1, k - 1)


@pytest.mark.parametrize("n", [3, 5, 8, 16])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_chen_and_pkpo_match_math_comb_for_every_count(n, k):
    for c in range(n + 1):
        rewards = torch.tensor([[1.0] * c + [0.0] * (n - c)], dtype=torch.float64)
        chen = dense("passk_chen", rewards, k=k)[0]
        pkpo = dense("pkpo", rewards, k=k)[0]
        positive, negative = chen_reference(n, c, k)
        if c > 0:
            assert chen[0].item() == pytest.approx(positive, abs=1e-12)
            assert pkpo[0].item() == pytest.approx(pkpo_reference(n, c, k), abs=1e-12)
        if c < n:
            assert chen[-1].item() == pytest.approx(negative, abs=1e-12)
            assert pkpo[-1].item() == 0.0


def exact_expected_gradient(advantages, patterns, success):
    probabilities = pattern_probabilities(patterns, success)
    return float((probabilities * (advantages * (patterns - success)).sum(dim=1)).sum())


@pytest.mark.parametrize("group_size", [4, 7])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_pkpo_is_unbiased_for_the_pass_at_k_gradient(group_size, k):
    """E[sum_j A_j d log pi(y_j)] = d pass@k / d theta = k f^(k-1) s (1 - s)."""
    patterns = all_reward_patterns(group_size)
    advantages = dense("pkpo", patterns, k=k)
    for success in (0.2, 0.6):
        target = k * (1 - success) ** (k - 1) * success * (1 - success)
        got = exact_expected_gradient(advantages, patterns, success)
        assert got == pytest.approx(target, rel=1e-10)


@pytest.mark.parametrize("group_size", [4, 8])
def test_truncated_maxrl_is_unbiased_for_its_moment_objective(group_size):
    """Order-T Maclaurin MaxRL: E[(1/n) sum_j A_j d log pi] = sum_{k<=T} f^(k-1) s (1 - s)."""
    patterns = all_reward_patterns(group_size)
    for order in range(1, group_size + 1):
        advantages = dense("maxrl", patterns, maclaurin_order=order)
        weight = moment_objective("maxrl", order).weight(torch.tensor(0.0, dtype=torch.float64))
        assert float(weight) == 1.0
        for success in (0.3, 0.7):
            f = 1 - success
            target = sum(f ** (k - 1) for k in range(1, order + 1)) * success * f
            got = exact_expected_gradient(advantages, patterns, success) / group_size
            assert got == pytest.approx(target, rel=1e-10), order


def test_maxrl_default_is_r_n_over_c_minus_one():
    rewards = torch.tensor([[1.0, 0, 0, 0], [0.0, 0, 0, 0], [1.0, 1, 1, 0]], dtype=torch.float64)
    got = dense("maxrl", rewards)
    expected = torch.tensor([[3.0, -1.0, -1.0, -1.0], [0.0] * 4, [1 / 3, 1 / 3, 1 / 3, -1.0]])
    assert torch.allclose(got, expected.double(), atol=1e-5)


def test_baselines_need_k_not_above_group_size():
    from nemo_mmpo import MMPOInputError

    with pytest.raises(MMPOInputError, match="k=5"):
        compute_advantages(torch.ones(4), torch.zeros(4, dtype=torch.long), None, "pkpo", k=5)
    with pytest.raises(MMPOInputError, match="k=0"):
        compute_advantages(torch.ones(4), torch.zeros(4, dtype=torch.long), None, "passk_chen", k=0)
