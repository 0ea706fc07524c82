"""The estimator called once per streaming chunk of a step (NeMo-RL main's single controller,
single_controller.py:1778): the step's ``mmpo/`` metrics, combined over its chunks, are those of
one call on the whole step's batch. No ``nemo_rl`` here (the NeMo-RL side is
``tests/nemo_rl_adapter/test_single_controller_metrics.py``)."""

from __future__ import annotations

import math
import pickle

import pytest
import torch

from nemo_mmpo.nemo_rl.advantage_estimator import MMPOAdvantageEstimator, combine_chunk_metrics


def step_batch(seed: int, groups: int = 7, group_size: int = 4, width: int = 5):
    """Prompt rows (zero-padded to ``width``), 0/1 rewards and a token mask of ragged lengths."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (groups,), generator=generator)
    prompts = torch.zeros(groups, width, dtype=torch.long)
    for group, length in enumerate(lengths):
        prompts[group, :length] = torch.randint(1, 50, (int(length),), generator=generator)
    prompt_ids = prompts.repeat_interleave(group_size, dim=0)
    rewards = torch.randint(0, 2, (groups * group_size,), generator=generator).float()
    tokens = torch.randint(0, 9, (groups * group_size,), generator=generator)
    mask = (torch.arange(10)[None, :] <= tokens[:, None]).float()
    return prompt_ids, rewards, mask


def chunks_of(batch, group_size: int, sizes: list[int]):
    """The batch cut into chunks of whole groups, each padded to its own widest prompt (as the
    controller's per-chunk fetch from the data plane pads it)."""
    prompt_ids, rewards, mask = batch
    start = 0
    for groups in sizes:
        rows = slice(start * group_size, (start + groups) * group_size)
        chunk_prompts = prompt_ids[rows]
        width = int((chunk_prompts != 0).sum(dim=1).max())
        yield chunk_prompts[:, :width], rewards[rows], mask[rows]
        start += groups


def assert_same(combined: dict, whole: dict) -> None:
    assert combined.keys() == whole.keys()
    for key, value in whole.items():
        if math.isnan(value):
            assert math.isnan(combined[key]), key
        else:
            assert combined[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


@pytest.mark.parametrize(
    "config",
    [
        {"name": "mmpo"},
        {"name": "mmpo", "estimator": "unbiased", "truncation_order": 3},
        {"name": "passk_chen", "k": 3},
        {"name": "maxrl"},
    ],
    ids=lambda config: "-".join(str(value) for value in config.values()),
)
def test_the_step_metrics_over_chunks_are_those_of_the_whole_step(config):
    batch = step_batch(seed=3)
    whole = MMPOAdvantageEstimator(config)
    whole.compute_advantage(*batch)
    streamed = pickle.loads(pickle.dumps(MMPOAdvantageEstimator(config, streaming_chunks=True)))
    for _step in range(2):  # taken once per step: the second step starts afresh
        for chunk in chunks_of(batch, 4, [3, 1, 3]):
            streamed.compute_advantage(*chunk)
        assert_same(streamed.take_step_metrics(), whole.last_metrics)
        assert streamed.take_step_metrics() == {}


def test_a_chunk_without_groups_or_tokens_takes_no_part_in_the_means():
    prompt_ids, rewards, mask = step_batch(seed=5, groups=4)
    estimator = MMPOAdvantageEstimator({"name": "mmpo"}, streaming_chunks=True)
    estimator.compute_advantage(prompt_ids, rewards, mask)
    expected = estimator.take_step_metrics()
    estimator.compute_advantage(prompt_ids, rewards, mask)
    # a chunk whose rows are all masked out (valid_mask 0): no group, no token
    estimator.compute_advantage(
        prompt_ids[:4], rewards[:4], torch.zeros(4, 10), valid_mask=torch.zeros(4)
    )
    assert_same(estimator.take_step_metrics(), expected)


def test_a_step_without_any_group_is_nan_where_one_call_is():
    empty = MMPOAdvantageEstimator({"name": "mmpo"})
    args = (torch.ones(4, 2, dtype=torch.long), torch.ones(4), torch.zeros(4, 3))
    empty.compute_advantage(*args, valid_mask=torch.zeros(4))
    chunks = [
        (dict(empty.last_metrics), dict.fromkeys(("groups", "rollouts", "valid", "tokens"), 0.0))
    ] * 2
    assert_same(combine_chunk_metrics(chunks), empty.last_metrics)


def test_outside_the_controller_nothing_accumulates():
    """The other trainers call once per step and take once (or read ``last_metrics``): no
    chunk is kept for them."""
    estimator = MMPOAdvantageEstimator({"name": "mmpo"})
    for _ in range(3):
        estimator.compute_advantage(*step_batch(seed=1))
    assert estimator._chunks == []
    assert estimator.take_step_metrics() == estimator.last_metrics
