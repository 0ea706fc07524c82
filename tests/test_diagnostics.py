"""Per-step diagnostics: unbiased moments, truncated first-success time, signal share."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import all_reward_patterns, pattern_probabilities

from nemo_mmpo import group_ids_from_prompt_rows, moment_diagnostics


def test_moment_estimates_are_unbiased_by_enumeration():
    group_size, order = 6, 4
    patterns = all_reward_patterns(group_size)
    for success in (0.25, 0.6):
        probabilities = pattern_probabilities(patterns, success)
        expected = torch.zeros(order, dtype=torch.float64)
        for pattern, probability in zip(patterns, probabilities, strict=True):
            stats = moment_diagnostics(pattern, torch.zeros(group_size, dtype=torch.long), order)
            expected += probability * torch.tensor(
                [stats[f"failure_moment_{k}"] for k in range(1, order + 1)], dtype=torch.float64
            )
        truth = torch.tensor([(1 - success) ** k for k in range(1, order + 1)], dtype=torch.float64)
        assert torch.allclose(expected, truth, atol=1e-12)


def test_values_for_a_small_batch():
    rewards = torch.tensor([1, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0], dtype=torch.float32)
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2])
    stats = moment_diagnostics(rewards, groups, truncation_order=3)
    # group failures/size: 3/4, 0/4, 3/3
    m1 = (3 / 4 + 0 + 1) / 3
    m2 = (math.comb(3, 2) / math.comb(4, 2) + 0 + 1) / 3
    m3 = (math.comb(3, 3) / math.comb(4, 3) + 0 + 1) / 3
    assert stats["failure_moment_1"] == pytest.approx(m1)
    assert stats["failure_moment_2"] == pytest.approx(m2)
    assert stats["failure_moment_3"] == pytest.approx(m3)
    assert stats["truncated_first_success_time"] == pytest.approx(1 + m1 + m2 + m3)
    assert stats["no_signal_fraction"] == pytest.approx(2 / 3)
    assert stats["all_pass_fraction"] == pytest.approx(1 / 3)
    assert stats["all_fail_fraction"] == pytest.approx(1 / 3)
    assert stats["weight_max"] == pytest.approx(6.0)  # w_3(1) = 1 + 2 + 3
    assert stats["weight_mean"] == pytest.approx((1 + 1.5 + 3 * 0.5625 + 1 + 6) / 3)
    assert stats["success_rate"] == pytest.approx(5 / 11)
    assert stats["num_groups"] == 3


def test_groups_smaller_than_the_order_fall_back_to_plug_in():
    rewards = torch.tensor([1.0, 0.0])
    stats = moment_diagnostics(rewards, torch.zeros(2, dtype=torch.long), truncation_order=4)
    assert stats["failure_moment_2"] == 0.0  # C(1,2)/C(2,2): unbiased and estimable
    assert stats["failure_moment_3"] == pytest.approx(0.125)  # plug-in 0.5^3


def test_group_ids_from_prompt_rows_group_equal_rows():
    rows = torch.tensor([[5, 6, 0], [1, 2, 3], [5, 6, 0], [1, 2, 3], [5, 6, 1]])
    ids = group_ids_from_prompt_rows(rows)
    assert ids[0] == ids[2] and ids[1] == ids[3]
    assert len({int(ids[0]), int(ids[1]), int(ids[4])}) == 3


def test_group_ids_from_prompt_rows_survive_hash_collisions(monkeypatch):
    """Force every row to the same hash: the exact fallback must still separate them."""
    import nemo_mmpo.grouping as grouping

    monkeypatch.setattr(
        grouping,
        "_row_hash_multipliers",
        lambda length, device: torch.zeros(length, dtype=torch.int64, device=device),
    )
    rows = torch.tensor([[5, 6], [1, 2], [5, 6], [1, 2], [5, 7]])
    ids = group_ids_from_prompt_rows(rows)
    assert ids[0] == ids[2] and ids[1] == ids[3]
    assert len({int(ids[0]), int(ids[1]), int(ids[4])}) == 3


def test_group_ids_from_prompt_rows_match_torch_unique_on_random_batches():
    generator = torch.Generator().manual_seed(2)
    prompts = torch.randint(0, 5, (300, 3), generator=generator)  # many exact duplicates
    ids = group_ids_from_prompt_rows(prompts)
    expected = torch.unique(prompts, dim=0, return_inverse=True)[1]
    # same partition: i ~ j in ours iff i ~ j in torch.unique
    assert torch.equal(ids[:, None] == ids[None, :], expected[:, None] == expected[None, :])


def test_a_batch_with_every_rollout_masked_reports_nan_instead_of_failing():
    stats = moment_diagnostics(
        torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), 2, torch.tensor([False, False])
    )
    assert stats["num_groups"] == 0
    assert math.isnan(stats["failure_moment_2"]) and math.isnan(stats["weight_max"])


def test_a_valid_mask_is_the_same_as_leaving_the_masked_rollouts_out():
    """Every statistic (success rate included) with ``valid_mask`` equals the statistic of the
    valid rollouts alone: a masked rollout is not a failure."""
    generator = torch.Generator().manual_seed(11)
    group_ids = torch.arange(6).repeat_interleave(5)
    rewards = (torch.rand(30, generator=generator) < 0.5).float()
    valid = torch.rand(30, generator=generator) < 0.6
    valid[group_ids == 2] = False  # a group with no valid rollout is not counted
    masked = moment_diagnostics(rewards, group_ids, 3, valid)
    assert masked == moment_diagnostics(rewards[valid], group_ids[valid], 3)
    assert masked["success_rate"] == pytest.approx(float(rewards[valid].mean()))
    assert masked["num_groups"] == 5
    assert masked["success_rate"] != pytest.approx(float((rewards * valid).mean()))
