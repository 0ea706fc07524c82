"""MMPO estimators: exact expectations by enumeration, closed forms, reductions, ragged groups."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import all_reward_patterns, pattern_probabilities
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_mmpo import (
    MMPOInputError,
    available_estimators,
    compute_advantages,
    mmpo_advantages,
    moment_objective,
)

SUCCESS_PROBABILITIES = (0.1, 0.35, 0.5, 0.8)


def expected_gradient(advantages: torch.Tensor, patterns: torch.Tensor, success: float) -> float:
    """E[(1/G) sum_j A_j d/dtheta log pi(y_j)] for a Bernoulli policy with s = sigmoid(theta).

    d/dtheta log pi(y) = r - s, so the exact expectation is a sum over all 2^G patterns.
    """
    probabilities = pattern_probabilities(patterns, success)
    per_pattern = (advantages * (patterns - success)).mean(dim=1)
    return float((probabilities * per_pattern).sum())


@pytest.mark.parametrize("group_size", range(2, 11))
def test_unbiased_estimator_is_exactly_unbiased_for_every_order(group_size):
    """For every T <= G: E[score-weighted advantage] = w_T(f) ds/dtheta, by enumeration."""
    patterns = all_reward_patterns(group_size)
    for order in range(1, group_size + 1):
        objective = moment_objective("mmpo", order)
        advantages = mmpo_advantages(patterns, order, "unbiased")
        for success in SUCCESS_PROBABILITIES:
            target = (
                float(objective.weight(torch.tensor(1.0 - success, dtype=torch.float64)))
                * success
                * (1 - success)
            )
            got = expected_gradient(advantages, patterns, success)
            assert got == pytest.approx(target, rel=1e-10, abs=1e-13), (group_size, order)


@pytest.mark.parametrize("group_size", [2, 4, 8])
def test_plugin_estimator_is_biased(group_size):
    patterns = all_reward_patterns(group_size)
    for order in (1, 2, min(4, group_size)):
        objective = moment_objective("mmpo", order)
        advantages = mmpo_advantages(patterns, order, "plugin")
        success = 0.35
        target = (
            float(objective.weight(torch.tensor(1.0 - success, dtype=torch.float64)))
            * success
            * (1 - success)
        )
        got = expected_gradient(advantages, patterns, success)
        assert abs(got - target) > 1e-4 * target


@pytest.mark.parametrize(
    "objective",
    [
        moment_objective("maxrl", 5),
        moment_objective("pass_at_k", k=3),
        moment_objective("mmpo", 4, transform="beta", alpha=0.5, beta=1.0),
        moment_objective("mmpo", 3, transform="constant", constant=0.7),
        moment_objective("explicit", coefficients=[0.3, -1.0, 2.0]),
    ],
    ids=lambda objective: objective.name,
)
def test_unbiased_estimator_is_unbiased_for_any_coefficients(objective):
    group_size = 7
    patterns = all_reward_patterns(group_size)
    groups = torch.arange(patterns.shape[0]).repeat_interleave(group_size)
    advantages = compute_advantages(patterns.reshape(-1), groups, objective, "unbiased").reshape(
        patterns.shape
    )
    for success in SUCCESS_PROBABILITIES:
        target = (
            float(objective.weight(torch.tensor(1.0 - success, dtype=torch.float64)))
            * success
            * (1 - success)
        )
        assert expected_gradient(advantages, patterns, success) == pytest.approx(target, rel=1e-10)


@pytest.mark.parametrize("group_size", range(2, 13))
def test_unbiased_with_t_equal_g_matches_the_closed_form(group_size):
    """Eq. mmpo_simple_case of the paper."""
    g = group_size
    for successes in range(g + 1):
        rewards = torch.tensor([[1.0] * successes + [0.0] * (g - successes)], dtype=torch.float64)
        advantages = mmpo_advantages(rewards, g, "unbiased")[0]
        n = successes
        if n > 0:
            expected = g * (g + 1) * (g - n) / ((g - 1) * n * (n + 1))
            assert float(advantages[0]) == pytest.approx(expected, rel=1e-12, abs=1e-12)
        if n < g:
            expected = -g * (g + 1) * n / ((g - 1) * (n + 1) * (n + 2))
            assert float(advantages[-1]) == pytest.approx(expected, rel=1e-12, abs=1e-12)


def reference_unbiased(rewards: list[float], coefficients: tuple[float, ...]) -> list[float]:
    """The paper's Eq. unbiased_advantage written with math.comb, one rollout at a time."""
    g = len(rewards)
    failures = sum(1 for r in rewards if r == 0)
    result = []
    for r in rewards:
        m = failures - (1 - int(r))
        coefficient = sum(
            k * a * math.comb(m, k - 1) / math.comb(g - 1, k - 1)
            for k, a in enumerate(coefficients, start=1)
        )
        result.append(coefficient * (r - 1 + m / (g - 1)))
    return result


def test_unbiased_matches_factorial_reference_for_large_groups():
    generator = torch.Generator().manual_seed(0)
    for group_size, order in [(16, 16), (32, 9), (64, 16), (64, 64), (128, 20)]:
        rewards = (torch.rand(group_size, generator=generator) < 0.3).double()
        ours = mmpo_advantages(rewards[None], order, "unbiased")[0]
        expected = reference_unbiased(rewards.tolist(), (1.0,) * order)
        assert torch.allclose(ours, torch.tensor(expected, dtype=torch.float64), rtol=1e-9)


def test_paper_defaults_worked_values():
    rewards = torch.tensor([[1, 1, 0, 0, 0, 0, 0, 0]], dtype=torch.float64)
    plugin = mmpo_advantages(rewards, 4, "plugin")[0]
    assert plugin[0].item() == pytest.approx(4.40625) and plugin[-1].item() == pytest.approx(
        -1.46875
    )
    unbiased = mmpo_advantages(rewards, 4, "unbiased")[0]
    assert unbiased[0].item() == pytest.approx(6.122449, abs=1e-6)
    assert unbiased[-1].item() == pytest.approx(-1.428571, abs=1e-6)


def test_order_one_reductions():
    generator = torch.Generator().manual_seed(1)
    rewards = (torch.rand(40, 6, generator=generator) < 0.5).double()
    mean = rewards.mean(dim=1, keepdim=True)
    assert torch.allclose(mmpo_advantages(rewards, 1, "plugin"), rewards - mean)
    leave_one_out = (rewards.sum(dim=1, keepdim=True) - rewards) / 5
    assert torch.allclose(mmpo_advantages(rewards, 1, "unbiased"), rewards - leave_one_out)
    flat, groups = rewards.reshape(-1), torch.arange(40).repeat_interleave(6)
    grpo_mean = compute_advantages(flat, groups, estimator="grpo", normalize_std=False)
    grpo_loo = compute_advantages(
        flat, groups, estimator="grpo", normalize_std=False, leave_one_out=True
    )
    reinforce = moment_objective("reinforce")
    assert torch.allclose(compute_advantages(flat, groups, reinforce, "plugin"), grpo_mean)
    assert torch.allclose(compute_advantages(flat, groups, reinforce, "unbiased"), grpo_loo)


def test_groups_without_signal_get_zero_advantage():
    rewards = torch.tensor([[1.0] * 8, [0.0] * 8])
    for estimator in ("plugin", "unbiased"):
        assert torch.count_nonzero(mmpo_advantages(rewards, 4, estimator)) == 0


@given(
    sizes=st.lists(st.integers(4, 9), min_size=1, max_size=6),
    seed=st.integers(0, 2**31 - 1),
    estimator=st.sampled_from(["plugin", "unbiased"]),
    order=st.integers(1, 4),
)
@settings(max_examples=60, deadline=None)
def test_ragged_shuffled_groups_equal_per_group_dense(sizes, seed, estimator, order):
    generator = torch.Generator().manual_seed(seed)
    rewards = [(torch.rand(size, generator=generator) < 0.4).double() for size in sizes]
    flat = torch.cat(rewards)
    group_ids = torch.cat([torch.full((size,), 100 + 7 * i) for i, size in enumerate(sizes)])
    permutation = torch.randperm(flat.numel(), generator=generator)
    objective = moment_objective("mmpo", order)
    got = compute_advantages(flat[permutation], group_ids[permutation], objective, estimator)
    expected = torch.cat([mmpo_advantages(r[None], order, estimator)[0] for r in rewards])
    assert torch.allclose(got, expected[permutation].to(got.dtype), rtol=1e-12, atol=1e-12)


def test_invalid_rollouts_are_excluded_and_get_zero():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 123.0, 1.0, 0.0])
    groups = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1])
    valid = torch.tensor([1, 1, 1, 1, 1, 0, 1, 1], dtype=torch.bool)
    objective = moment_objective("mmpo", 2)
    for estimator in available_estimators():
        options = {"k": 2} if estimator in ("passk_chen", "pkpo") else {}
        got = compute_advantages(rewards, groups, objective, estimator, valid, **options)
        kept = compute_advantages(rewards[valid], groups[valid], objective, estimator, **options)
        assert got[5] == 0
        assert torch.allclose(got[valid], kept), estimator


def test_dtype_and_device_follow_the_input():
    rewards = torch.tensor([[1, 0, 0, 1]], dtype=torch.int64)
    assert mmpo_advantages(rewards).dtype == torch.float32
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        assert mmpo_advantages(rewards.to(dtype), 2, "unbiased").dtype == dtype
    assert compute_advantages(rewards[0].bool(), torch.zeros(4, dtype=torch.long)).dtype == (
        torch.float32
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    generator = torch.Generator().manual_seed(3)
    rewards = (torch.rand(256, 16, generator=generator) < 0.3).float()
    groups = torch.arange(256).repeat_interleave(16)
    for estimator in available_estimators():
        options = {"k": 3} if estimator in ("passk_chen", "pkpo") else {}
        cpu = compute_advantages(rewards.reshape(-1), groups, None, estimator, **options)
        gpu = compute_advantages(
            rewards.reshape(-1).cuda(), groups.cuda(), None, estimator, **options
        )
        assert gpu.device.type == "cuda"
        assert torch.allclose(cpu, gpu.cpu(), atol=1e-6)


def test_reward_threshold_binarises():
    rewards = torch.tensor([0.9, 0.2, 0.7, 0.1])
    groups = torch.zeros(4, dtype=torch.long)
    got = compute_advantages(rewards, groups, reward_threshold=0.5)
    expected = compute_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0]), groups)
    assert torch.equal(got, expected)


@pytest.mark.parametrize(
    ("call", "fragments"),
    [
        (
            lambda: compute_advantages(torch.tensor([1.0, 0.5]), torch.tensor([0, 0])),
            ["index 1", "0.5", "reward_threshold"],
        ),
        (
            lambda: compute_advantages(torch.tensor([1.0, math.nan]), torch.tensor([0, 0])),
            ["index 1", "nan"],
        ),
        (
            lambda: compute_advantages(torch.tensor([]), torch.tensor([], dtype=torch.long)),
            ["empty batch"],
        ),
        (
            lambda: compute_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0, 0])),
            ["(3,)", "(2,)"],
        ),
        (
            lambda: compute_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0])),
            ["integer", "torch.float32"],
        ),
        (
            lambda: compute_advantages(torch.ones(2, 2), torch.zeros(2, 2, dtype=torch.long)),
            ["1-D", "(2, 2)", "mmpo_advantages"],
        ),
        (lambda: mmpo_advantages(torch.ones(3, 4), 5, "unbiased"), ["T=5", "only 4 valid"]),
        (
            lambda: compute_advantages(
                torch.tensor([1.0, 0.0, 1.0]),
                torch.tensor([0, 0, 1]),
                moment_objective("mmpo", 1),
                "unbiased",
            ),
            ["at least 2", "only 1 valid"],
        ),
        (lambda: mmpo_advantages(torch.ones(2, 4), 0), ["truncation_order", "got 0"]),
        (lambda: mmpo_advantages(torch.ones(2, 4), 2, "nope"), ["'nope'", "plugin"]),
        (lambda: mmpo_advantages(torch.ones(0, 4)), ["empty batch"]),
    ],
)
def test_bad_input_errors_name_the_value_and_the_fix(call, fragments):
    with pytest.raises(MMPOInputError) as error:
        call()
    for fragment in fragments:
        assert fragment in str(error.value)
