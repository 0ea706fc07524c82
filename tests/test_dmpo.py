"""DMPO penalty against the formula written group by group."""

from __future__ import annotations

import pytest
import torch

from nemo_mmpo import MMPOInputError
from nemo_mmpo.dmpo import distribution_matching_penalty


def reference(rewards, logprobs, groups, temperature):
    values = []
    for group in torch.unique(groups):
        members = groups == group
        p = torch.softmax(rewards[members] / temperature, dim=0)
        q = torch.softmax(logprobs[members], dim=0)
        values.append(((p - q) ** 2).mean())
    return torch.stack(values).mean()


def test_matches_per_group_formula_and_gradient():
    generator = torch.Generator().manual_seed(0)
    sizes = [8, 5, 8, 3]
    groups = torch.cat([torch.full((size,), 10 * i) for i, size in enumerate(sizes)])
    permutation = torch.randperm(groups.numel(), generator=generator)
    groups = groups[permutation]
    rewards = (torch.rand(groups.numel(), generator=generator) < 0.5).double()
    logprobs = (
        -torch.rand(groups.numel(), generator=generator, dtype=torch.float64)
    ).requires_grad_()
    ours = distribution_matching_penalty(rewards, logprobs, groups, temperature=1 / 15)
    (ours_grad,) = torch.autograd.grad(ours, logprobs)
    expected = reference(rewards, logprobs, groups, 1 / 15)
    (expected_grad,) = torch.autograd.grad(expected, logprobs)
    assert ours.item() == pytest.approx(expected.item(), rel=1e-12)
    assert torch.allclose(ours_grad, expected_grad, atol=1e-14)


def test_invalid_responses_are_left_out():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 5.0], dtype=torch.float64)
    logprobs = torch.tensor([-0.1, -0.5, -0.3, -0.2, -9.0], dtype=torch.float64)
    groups = torch.tensor([0, 0, 1, 1, 1])
    valid = torch.tensor([True, True, True, True, False])
    got = distribution_matching_penalty(rewards, logprobs, groups, 0.5, valid)
    expected = reference(rewards[:4], logprobs[:4], groups[:4], 0.5)
    assert got.item() == pytest.approx(expected.item(), rel=1e-12)


def test_bad_temperature_is_named():
    with pytest.raises(MMPOInputError, match="got 0"):
        distribution_matching_penalty(torch.ones(2), torch.ones(2), torch.zeros(2), 0)
