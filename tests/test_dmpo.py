"""DMPO's penalty against the authors' definition, written group by group.

The reference follows the authors' code (verl-recipe #105, ``dmpo_core_algos.py``) in plain
per-group steps: target softmax of the GRPO advantages over ``alpha``, policy softmax of the
token-mean log-probabilities, both over ``sum + 1e-10``; squared error summed over samples
and divided by the number of counted samples; zero-signal groups (advantage spread <= 1e-5)
left out in the filtering mode.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from nemo_mmpo import MMPOInputError, compute_advantages
from nemo_mmpo.dmpo import distribution_matching_penalty


def softmax_with_guard(values: torch.Tensor) -> torch.Tensor:
    exponentials = torch.exp(values - values.max())
    return exponentials / (exponentials.sum() + 1e-10)


def reference(advantages, logprobs, groups, temperature, filter_zero_signal):
    total = logprobs.sum() * 0.0
    counted = 0
    for group in torch.unique(groups):
        members = groups == group
        group_advantages = advantages[members]
        if filter_zero_signal and group_advantages.max() - group_advantages.min() <= 1e-5:
            continue
        target = softmax_with_guard(group_advantages / temperature)
        policy = softmax_with_guard(logprobs[members])
        total = total + ((target - policy) ** 2).sum()
        counted += int(members.sum())
    return total / max(counted, 1)


def all_patterns_batch(group_size: int, seed: int = 0):
    patterns = torch.tensor(list(itertools.product((0.0, 1.0), repeat=group_size)))
    rewards = patterns.flatten().double()
    groups = torch.arange(patterns.shape[0]).repeat_interleave(group_size)
    advantages = compute_advantages(rewards, groups, None, "grpo")  # GRPO, as the authors feed
    generator = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(rewards.numel(), generator=generator, dtype=torch.float64)
    return advantages, logprobs, groups


@pytest.mark.parametrize("filter_zero_signal", [True, False])
@pytest.mark.parametrize("temperature", [1 / 15, 1.0])
@pytest.mark.parametrize("group_size", range(2, 11))
def test_every_reward_pattern_matches_the_authors_definition(
    group_size, temperature, filter_zero_signal
):
    advantages, logprobs, groups = all_patterns_batch(group_size)
    logprobs.requires_grad_()
    ours = distribution_matching_penalty(
        advantages, logprobs, groups, temperature, filter_zero_signal=filter_zero_signal
    )
    (our_gradient,) = torch.autograd.grad(ours, logprobs)
    expected = reference(advantages, logprobs, groups, temperature, filter_zero_signal)
    (expected_gradient,) = torch.autograd.grad(expected, logprobs)
    assert ours.item() == pytest.approx(expected.item(), rel=1e-12, abs=1e-15)
    torch.testing.assert_close(our_gradient, expected_gradient, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("filter_zero_signal", [True, False])
def test_ragged_shuffled_groups_average_over_samples(filter_zero_signal):
    generator = torch.Generator().manual_seed(1)
    sizes = [8, 5, 8, 3, 2]
    groups = torch.cat([torch.full((size,), 10 * index) for index, size in enumerate(sizes)])
    rewards = (torch.rand(groups.numel(), generator=generator) < 0.5).double()
    rewards[groups == 40] = 1.0  # an all-pass group: no signal
    permutation = torch.randperm(groups.numel(), generator=generator)
    groups, rewards = groups[permutation], rewards[permutation]
    advantages = compute_advantages(rewards, groups, None, "grpo")
    logprobs = (
        -torch.rand(groups.numel(), generator=generator, dtype=torch.float64)
    ).requires_grad_()
    ours = distribution_matching_penalty(
        advantages, logprobs, groups, filter_zero_signal=filter_zero_signal
    )
    expected = reference(advantages, logprobs, groups, 1 / 15, filter_zero_signal)
    assert ours.item() == pytest.approx(expected.item(), rel=1e-12)
    per_group_mean = torch.stack(
        [
            reference(
                advantages[groups == g], logprobs[groups == g], groups[groups == g], 1 / 15, False
            )
            for g in torch.unique(groups)
        ]
    ).mean()
    assert ours.item() != pytest.approx(per_group_mean.item(), rel=1e-3)  # not a mean over groups


def test_target_is_the_advantage_softmax_not_the_reward_softmax():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    groups = torch.zeros(4, dtype=torch.long)
    advantages = compute_advantages(rewards, groups, None, "grpo")
    logprobs = torch.tensor([-0.2, -0.4, -0.1, -0.3], dtype=torch.float64)
    on_advantages = distribution_matching_penalty(advantages, logprobs, groups, 1.0)
    on_rewards = distribution_matching_penalty(rewards, logprobs, groups, 1.0)
    assert on_advantages.item() == pytest.approx(
        reference(advantages, logprobs, groups, 1.0, True).item(), rel=1e-12
    )
    assert abs(on_advantages.item() - on_rewards.item()) > 1e-3


def test_only_zero_signal_groups_give_zero_and_no_gradient():
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    advantages = torch.zeros(6, dtype=torch.float64)  # all pass / all fail: GRPO gives 0
    logprobs = torch.tensor([-0.1, -0.5, -0.3, -0.2, -0.9, -0.4], dtype=torch.float64)
    logprobs.requires_grad_()
    penalty = distribution_matching_penalty(advantages, logprobs, groups)
    (gradient,) = torch.autograd.grad(penalty, logprobs)
    assert penalty.item() == 0.0 and torch.count_nonzero(gradient) == 0
    kept = distribution_matching_penalty(advantages, logprobs, groups, filter_zero_signal=False)
    assert kept.item() > 0  # the uniform target still pulls the policy in grpo_dmpo mode


def test_invalid_responses_are_left_out():
    advantages = torch.tensor([1.0, -1.0, 0.7, -0.7, 5.0], dtype=torch.float64)
    logprobs = torch.tensor([-0.1, -0.5, -0.3, -0.2, -9.0], dtype=torch.float64)
    groups = torch.tensor([0, 0, 1, 1, 1])
    valid = torch.tensor([True, True, True, True, False])
    got = distribution_matching_penalty(advantages, logprobs, groups, 0.5, valid)
    expected = reference(advantages[:4], logprobs[:4], groups[:4], 0.5, True)
    assert got.item() == pytest.approx(expected.item(), rel=1e-12)


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ((torch.ones(2), torch.ones(2), torch.zeros(2), 0), "got 0"),
        ((torch.ones(2), torch.ones(3), torch.zeros(2)), "must all be [num_responses]"),
        ((torch.ones(0), torch.ones(0), torch.zeros(0)), "empty batch"),
    ],
)
def test_bad_input_is_named(arguments, fragment):
    with pytest.raises(MMPOInputError) as error:
        distribution_matching_penalty(*arguments)
    assert fragment in str(error.value)
