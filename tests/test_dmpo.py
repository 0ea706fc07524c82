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
from nemo_mmpo.dmpo import distribution_matching_penalty, linearized_penalty
from nemo_mmpo.nemo_rl.dmpo_batch_terms import (
    GRADIENT_KEY,
    SHARE_KEY,
    DMPOSettings,
    attach_penalty_terms,
    penalty_term,
    prompt_groups,
    read_dmpo_settings,
)


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


@pytest.mark.parametrize("filter_zero_signal", [True, False])
@pytest.mark.parametrize("temperature", [1 / 15, 1.0])
@pytest.mark.parametrize("group_size", range(2, 11))
def test_linearized_penalty_has_the_authors_value_and_gradient(
    group_size, temperature, filter_zero_signal
):
    advantages, logprobs, groups = all_patterns_batch(group_size, seed=group_size)
    linear = linearized_penalty(
        advantages, logprobs, groups, temperature, filter_zero_signal=filter_zero_signal
    )
    logprobs.requires_grad_()
    expected = reference(advantages, logprobs, groups, temperature, filter_zero_signal)
    (expected_gradient,) = torch.autograd.grad(expected, logprobs)
    assert linear.shares.sum().item() == pytest.approx(expected.item(), rel=1e-12, abs=1e-15)
    assert linear.metrics["penalty"] == pytest.approx(expected.item(), rel=1e-12, abs=1e-15)
    torch.testing.assert_close(linear.gradient, expected_gradient, rtol=1e-10, atol=1e-13)


def test_linearized_metrics_match_direct_formulas():
    groups = torch.tensor([0, 0, 0, 1, 1, 2, 2])
    advantages = torch.tensor([1.0, -0.5, -0.5, 0.7, -0.7, 0.0, 0.0], dtype=torch.float64)
    logprobs = torch.tensor([-0.1, -0.5, -0.3, -0.2, -0.9, -0.4, -0.6], dtype=torch.float64)
    metrics = linearized_penalty(advantages, logprobs, groups, 0.5).metrics
    kl, variation = [], []
    for members in (slice(0, 3), slice(3, 5)):  # group 2 has no signal: left out
        target = torch.softmax(advantages[members] / 0.5, 0)
        policy = torch.softmax(logprobs[members], 0)
        kl.append(float((target * (target / policy).log()).sum()))
        variation.append(float(0.5 * (target - policy).abs().sum()))
    assert metrics["target_policy_kl"] == pytest.approx(sum(kl) / 2, rel=1e-8)
    assert metrics["total_variation"] == pytest.approx(sum(variation) / 2, rel=1e-8)
    assert metrics["counted_fraction"] == pytest.approx(5 / 7)
    assert metrics["counted_groups"] == 2.0


def padded_batch(generator, prompts, group_sizes, max_len=12):
    """A NeMo-RL-shaped batch: right-padded prompt + response rows, token mask on responses."""
    rows, masks, lengths, group_of_row = [], [], [], []
    for group, (prompt, size) in enumerate(zip(prompts, group_sizes, strict=True)):
        for _ in range(size):
            response_length = int(torch.randint(0, 5, (1,), generator=generator))
            response = torch.randint(3, 50, (response_length,), generator=generator).tolist()
            tokens = prompt + response
            rows.append(tokens + [0] * (max_len - len(tokens)))
            masks.append([0] * len(prompt) + [1] * response_length + [0] * (max_len - len(tokens)))
            lengths.append(len(tokens))
            group_of_row.append(group)
    return (
        torch.tensor(rows),
        torch.tensor(masks),
        torch.tensor(lengths),
        torch.tensor(group_of_row),
    )


def test_prompt_groups_follow_the_prompt_tokens_not_the_padding():
    generator = torch.Generator().manual_seed(3)
    prompts = [[5, 6, 7], [5, 6], [5, 6, 7, 8], [9], [5, 6, 0]]  # prefixes of each other
    input_ids, token_mask, lengths, expected = padded_batch(generator, prompts, [3, 2, 4, 2, 2])
    assert (token_mask.sum(1) == 0).any()  # an empty response: its row is all prompt
    permutation = torch.randperm(len(expected), generator=generator)
    groups = prompt_groups(input_ids[permutation], token_mask[permutation], lengths[permutation])
    expected = expected[permutation]
    assert torch.equal(groups[:, None] == groups[None, :], expected[:, None] == expected)


def batch_with_terms(seed=0, temperature=1 / 15, filter_zero_signal=True, device="cpu"):
    generator = torch.Generator().manual_seed(seed)
    prompts = [[5, 6, 7], [5, 6], [8, 9, 10, 11], [12]]
    input_ids, token_mask, lengths, groups = padded_batch(generator, prompts, [4, 3, 4, 2])
    rows = len(groups)
    rewards = (torch.rand(rows, generator=generator) < 0.5).double()
    rewards[groups == 3] = 1.0  # a zero-signal group
    advantages = compute_advantages(rewards, groups, None, "grpo")
    prev_logprobs = -torch.rand(input_ids.shape, generator=generator, dtype=torch.float64)
    prev_logprobs[:, 0] = 0.0
    data = {
        "input_ids": input_ids,
        "input_lengths": lengths,
        "token_mask": token_mask,
        "sample_mask": torch.ones(rows, dtype=torch.float64),
        "advantages": advantages[:, None].expand(input_ids.shape).clone(),
        "prev_logprobs": prev_logprobs,
    }
    data["sample_mask"][1] = 0.0  # a filtered sample takes no part
    data = {key: value.to(device) for key, value in data.items()}
    settings = DMPOSettings(
        dmpo_weight=2.0, dmpo_temperature=temperature, dmpo_filter_zero_signal=filter_zero_signal
    )
    metrics = attach_penalty_terms(data, settings)
    return data, groups, metrics


@pytest.mark.parametrize("filter_zero_signal", [True, False])
@pytest.mark.parametrize("temperature", [1 / 15, 1.0])
def test_batch_terms_give_the_authors_penalty_at_the_rollout_policy(
    temperature, filter_zero_signal
):
    data, groups, metrics = batch_with_terms(1, temperature, filter_zero_signal)
    current = data["prev_logprobs"][:, 1:].clone().requires_grad_()
    term = penalty_term(current, data)
    (gradient,) = torch.autograd.grad(term, current)

    # the authors' definition on the token-mean log-probabilities of the valid responses
    reference_current = data["prev_logprobs"][:, 1:].clone().requires_grad_()
    mask = data["token_mask"][:, 1:].double()
    phi = (reference_current * mask).sum(1) / mask.sum(1).clamp(min=1)
    valid = (data["sample_mask"] > 0) & (mask.sum(1) > 0)
    expected = reference(
        data["advantages"][valid, 0], phi[valid], groups[valid], temperature, filter_zero_signal
    )
    (expected_gradient,) = torch.autograd.grad(expected, reference_current)
    assert term.item() == pytest.approx(expected.item(), rel=1e-12)
    assert metrics["dmpo/penalty"] == pytest.approx(expected.item(), rel=1e-12)
    torch.testing.assert_close(gradient, expected_gradient, rtol=1e-10, atol=1e-13)


def test_batch_terms_are_the_same_on_every_split_of_the_batch():
    data, _, _ = batch_with_terms(2)
    current = (data["prev_logprobs"][:, 1:] - 0.05).clone().requires_grad_()  # a later step
    whole = penalty_term(current, data)
    (whole_gradient,) = torch.autograd.grad(whole, current)
    generator = torch.Generator().manual_seed(0)
    for pieces in (2, 3, len(data["sample_mask"])):
        order = torch.randperm(len(data["sample_mask"]), generator=generator)
        total = 0.0
        for rows in order.tensor_split(pieces):
            piece = {key: value[rows] for key, value in data.items()}
            total = total + penalty_term(current[rows], piece)
        (gradient,) = torch.autograd.grad(total, current)
        assert total.item() == pytest.approx(whole.item(), rel=1e-12)
        torch.testing.assert_close(gradient, whole_gradient, rtol=1e-12, atol=1e-15)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_batch_terms_and_penalty_term_match_cpu():
    """DMPO's batch terms and the loss's penalty term on CUDA (the GPU check runs ``-k cuda``)."""
    cpu, _, cpu_metrics = batch_with_terms(2)
    gpu, _, gpu_metrics = batch_with_terms(2, device="cuda")
    assert gpu[SHARE_KEY].device.type == gpu[GRADIENT_KEY].device.type == "cuda"
    assert gpu_metrics == pytest.approx(cpu_metrics, rel=1e-9)
    for data in (cpu, gpu):
        data["current"] = (data["prev_logprobs"][:, 1:] - 0.05).clone().requires_grad_()
        data["term"] = penalty_term(data["current"], data)
        (data["gradient"],) = torch.autograd.grad(data["term"], data["current"])
    for key in (SHARE_KEY, GRADIENT_KEY, "term", "gradient"):
        torch.testing.assert_close(gpu[key].detach().cpu(), cpu[key].detach())


def test_missing_batch_terms_name_the_trainer_fix():
    data, _, _ = batch_with_terms()
    del data[GRADIENT_KEY]
    with pytest.raises(RuntimeError, match="grpo_train and async_grpo_train"):
        penalty_term(data["prev_logprobs"][:, 1:], data)


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({"dmpo_weight": -1}, "loss_fn.dmpo_weight=-1: give a value >= 0"),
        ({"dmpo_temperature": 0}, "loss_fn.dmpo_temperature=0: give a value > 0"),
        ({"dmpo_temperature": "1/15"}, "loss_fn.dmpo_temperature='1/15'"),
        ({"dmpo_weight": float("nan")}, "loss_fn.dmpo_weight=nan"),
        ({"dmpo_filter_zero_signal": "yes"}, "loss_fn.dmpo_filter_zero_signal='yes'"),
    ],
)
def test_bad_dmpo_settings_are_named(config, fragment):
    with pytest.raises(MMPOInputError) as error:
        read_dmpo_settings({"name": "dmpo", **config})
    assert fragment in str(error.value)


def test_dmpo_settings_default_to_the_paper_and_report_deviations():
    assert read_dmpo_settings({"name": "dmpo"}) == DMPOSettings(
        dmpo_weight=2.0, dmpo_temperature=1 / 15, dmpo_filter_zero_signal=True
    )
    assert read_dmpo_settings({"dmpo_temperature": 0.06666666666666667}).deviations() == []
    assert read_dmpo_settings(
        {"dmpo_weight": 1, "dmpo_filter_zero_signal": False}
    ).deviations() == [
        "loss_fn.dmpo_weight=1.0 (paper: 2.0)",
        "loss_fn.dmpo_filter_zero_signal=False (paper: True)",
    ]
