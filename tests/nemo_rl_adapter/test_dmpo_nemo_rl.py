"""DMPO through NeMo-RL: the loss interface, every batch layout NeMo-RL makes, the trainer.

The loss is built from ``dmpo_math_qwen3_1.7b.yaml`` as NeMo-RL's ``setup()`` builds it, the
batch terms by the hooked ``_apply_configured_message_level_advantage_penalties`` that
``grpo_train`` calls; splits come from NeMo-RL's ``BatchedDataDict`` (data-parallel shards,
micro-batches, dynamic batching, sequence packing) and its ``SequencePackingLossWrapper``.
The penalty is checked against the authors' definition written group by group
(``tests/test_dmpo.py``'s ``reference``).
"""

from __future__ import annotations

import pytest
import torch
from nemo_rl_support import import_nemo_rl, master_config_from_recipe

pytestmark = pytest.mark.nemo_rl

grpo = import_nemo_rl("nemo_rl.algorithms.grpo")
loss_module = import_nemo_rl("nemo_rl.algorithms.loss")
wrapper_module = import_nemo_rl("nemo_rl.algorithms.loss.wrapper")
BatchedDataDict = import_nemo_rl("nemo_rl.distributed.batched_data_dict").BatchedDataDict


from test_dmpo import all_patterns_batch, reference

from nemo_mmpo import compute_advantages
from nemo_mmpo.nemo_rl import install, wrappers
from nemo_mmpo.nemo_rl.dmpo_batch_terms import GRADIENT_KEY, SHARE_KEY
from nemo_mmpo.nemo_rl.loss import DMPOLossFn

RECIPE = "dmpo_math_qwen3_1.7b.yaml"


def build(overrides=()):
    install()
    config = master_config_from_recipe(RECIPE, list(overrides))
    return config, grpo.ClippedPGLossFn(config.loss_fn)  # what setup() builds


def training_batch(advantages, groups, generator, max_response=5, dtype=torch.float64):
    """NeMo-RL's ``train_data`` for responses with the given advantages and prompt groups."""
    rows, lengths, masks = [], [], []
    prompt_of_group = {}
    for group in groups.tolist():
        prompt = prompt_of_group.setdefault(
            group, [2 + group % 7, 3 + group % 11, 4 + group // 7, 5 + group // 77]
        )
        response = torch.randint(
            10,
            60,
            (int(torch.randint(1, max_response + 1, (1,), generator=generator)),),
            generator=generator,
        ).tolist()
        rows.append(prompt + response)
        masks.append([0] * len(prompt) + [1] * len(response))
        lengths.append(len(prompt) + len(response))
    width = max(lengths)
    input_ids = torch.tensor([row + [0] * (width - len(row)) for row in rows])
    token_mask = torch.tensor([mask + [0] * (width - len(mask)) for mask in masks], dtype=dtype)
    prev_logprobs = -torch.rand(input_ids.shape, generator=generator, dtype=dtype) * token_mask
    return BatchedDataDict(
        {
            "input_ids": input_ids,
            "input_lengths": torch.tensor(lengths),
            "token_mask": token_mask,
            "sample_mask": torch.ones(len(rows), dtype=dtype),
            "advantages": advantages.to(dtype)[:, None].expand(input_ids.shape).clone(),
            "prev_logprobs": prev_logprobs,
            "generation_logprobs": prev_logprobs.clone(),
            "row": torch.arange(len(rows)),
        }
    )


def attach_terms(train_data, config):
    """What grpo_train does after computing advantages (penalties off: only ours runs), inside
    a hooked trainer's call training DMPO's loss (outside one, the hook refuses)."""
    with wrappers.training_with(DMPOLossFn(config.loss_fn)):
        return grpo._apply_configured_message_level_advantage_penalties(
            train_data, [[] for _ in range(train_data.size)], config
        )


def global_counts(data):
    mask = data["token_mask"][:, 1:] * data["sample_mask"][:, None]
    return data["sample_mask"].sum(), mask.sum()


def penalty_and_gradient(config, loss_fn, data, current):
    """DMPO loss minus NeMo-RL's surrogate on the same inputs: value and gradient."""
    nemo_rl_loss = loss_module.ClippedPGLossFn(config.loss_fn)
    ours, _ = loss_fn(current, data, *global_counts(data))
    theirs, _ = nemo_rl_loss(current, data, *global_counts(data))
    difference = ours - theirs
    (gradient,) = torch.autograd.grad(difference, current)
    return difference.detach(), gradient


def authors_penalty(data, current, temperature, filter_zero_signal, groups):
    mask = data["token_mask"][:, 1:]
    phi = (current * mask).sum(1) / mask.sum(1).clamp(min=1)
    valid = data["sample_mask"] > 0
    return reference(
        data["advantages"][valid, 0], phi[valid], groups[valid], temperature, filter_zero_signal
    )


@pytest.mark.parametrize("filter_zero_signal", [True, False])
@pytest.mark.parametrize("temperature", [1 / 15, 1.0])
@pytest.mark.parametrize("group_size", range(2, 11))
def test_loss_adds_the_authors_penalty_for_every_reward_pattern(
    group_size, temperature, filter_zero_signal
):
    config, loss_fn = build(
        [
            f"loss_fn.dmpo_temperature={temperature}",
            f"loss_fn.dmpo_filter_zero_signal={str(filter_zero_signal).lower()}",
        ]
    )
    assert isinstance(loss_fn, DMPOLossFn) and loss_fn.dmpo.weight == 2.0
    advantages, _, groups = all_patterns_batch(group_size)
    data = training_batch(advantages, groups, torch.Generator().manual_seed(group_size))
    metrics = attach_terms(data, config)
    # the first optimizer step of a batch: the policy is the one prev_logprobs came from
    current = data["prev_logprobs"][:, 1:].clone().requires_grad_()
    difference, gradient = penalty_and_gradient(config, loss_fn, data, current)

    expected_current = data["prev_logprobs"][:, 1:].clone().requires_grad_()
    expected = authors_penalty(data, expected_current, temperature, filter_zero_signal, groups)
    (expected_gradient,) = torch.autograd.grad(expected, expected_current)
    assert difference.item() == pytest.approx(2.0 * expected.item(), rel=1e-10, abs=1e-14)
    torch.testing.assert_close(gradient, 2.0 * expected_gradient, rtol=1e-8, atol=1e-12)
    assert metrics["dmpo/penalty"] == [pytest.approx(expected.item(), rel=1e-10, abs=1e-14)]


def ragged_batch(config, seed=0):
    generator = torch.Generator().manual_seed(seed)
    sizes = [8, 5, 8, 3, 2, 6, 4, 4]
    groups = torch.cat([torch.full((size,), index) for index, size in enumerate(sizes)])
    rewards = (torch.rand(groups.numel(), generator=generator) < 0.5).double()
    rewards[groups == 4] = 1.0  # zero-signal group
    permutation = torch.randperm(groups.numel(), generator=generator)
    groups, rewards = groups[permutation], rewards[permutation]
    advantages = compute_advantages(rewards, groups, None, "grpo")
    data = training_batch(advantages, groups, generator, max_response=9)
    data["sample_mask"][3] = 0.0  # e.g. an overlong response NeMo-RL filtered
    attach_terms(data, config)
    # a later optimizer step: the current policy has moved away from prev_logprobs
    current = (
        data["prev_logprobs"][:, 1:]
        - 0.1
        * torch.rand(data["prev_logprobs"][:, 1:].shape, generator=generator, dtype=torch.float64)
    ).detach()
    return data, groups, current


def run_pieces(loss_fn, data, current, pieces, packed=False):
    """Sum the loss over ``pieces`` (NeMo-RL micro-batches) with whole-batch normalisers."""
    leaf = current.clone().requires_grad_()
    seqs, toks = global_counts(data)
    total, penalty = 0.0, 0.0
    for piece in pieces:
        width = piece["input_ids"].shape[1]  # dynamic batching truncates the sequence dim
        logprobs = leaf[piece["row"]][:, : width - 1]
        if packed:
            loss, metrics = packed_loss(loss_fn, piece, logprobs, seqs, toks)
        else:
            loss, metrics = loss_fn(logprobs, piece, seqs, toks)
        total = total + loss
        penalty += metrics["dmpo/penalty_term"]
    (gradient,) = torch.autograd.grad(total, leaf)
    return total.item(), penalty, gradient


def packed_loss(loss_fn, piece, logprobs, seqs, toks):
    """NeMo-RL's ``SequencePackingLossWrapper`` over the piece's sequences packed in a row."""
    lengths = piece["input_lengths"]
    cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    # position t of a sequence holds the log-probability of its token t + 1 (the last: unused)
    packed = torch.cat(
        [
            torch.cat([logprobs[index, : length - 1], logprobs.new_zeros(1)])
            for index, length in enumerate(lengths.tolist())
        ]
    )[None, :]

    def prepare(logits, data, loss_fn, **kwargs):
        return {"next_token_logprobs": logits[:, :-1]}, data

    wrapper = wrapper_module.SequencePackingLossWrapper(loss_fn, prepare, cu_seqlens)
    return wrapper(packed, piece, seqs, toks)


def layouts(data):
    """Every way NeMo-RL's policy may hand the batch to the loss, as lists of pieces."""
    size = data.size
    yield "one call", [data]
    for ranks, micro in ((2, 1), (2, 5), (4, 1), (4, 2), (5, 4), (8, 5)):
        shards = data.shard_by_batch_size(ranks, batch_size=size)
        yield (
            f"{ranks} ranks x micro-batch {micro}",
            [piece for shard in shards for piece in shard.make_microbatch_iterator(micro)],
        )
    dynamic = {
        "max_tokens_per_microbatch": 40,
        "sequence_length_round": 4,
        "input_key": "input_ids",
        "input_lengths_key": "input_lengths",
    }
    shards, _ = data.shard_by_batch_size(2, batch_size=size, dynamic_batching_args=dynamic)
    yield (
        "2 ranks, dynamic batching",
        [
            piece
            for shard in shards
            for piece in shard.make_microbatch_iterator_with_dynamic_shapes()
        ],
    )
    packing = {
        "algorithm": "modified_first_fit_decreasing",
        "max_tokens_per_microbatch": 48,
        "input_key": "input_ids",
        "input_lengths_key": "input_lengths",
        "sequence_length_pad_multiple": 1,
    }
    shards, _ = data.shard_by_batch_size(2, batch_size=size, sequence_packing_args=packing)
    yield (
        "2 ranks, sequence packing",
        [
            piece
            for shard in shards
            for piece in shard.make_microbatch_iterator_for_packable_sequences()
        ],
    )


def test_penalty_gradient_is_the_same_on_every_layout_nemo_rl_makes():
    config, loss_fn = build()
    data, _, current = ragged_batch(config)
    whole_loss, whole_penalty, whole_gradient = run_pieces(loss_fn, data, current, [data])
    seen = set()
    for name, pieces in layouts(data):
        packed = "packing" in name
        rows = torch.cat([piece["row"] for piece in pieces])
        assert sorted(rows.tolist()) == list(range(data.size)), name  # every row, once
        seen.add(len(pieces))
        loss, penalty, gradient = run_pieces(loss_fn, data, current, pieces, packed=packed)
        assert loss == pytest.approx(whole_loss, rel=1e-12), name
        assert penalty == pytest.approx(whole_penalty, rel=1e-12), name
        torch.testing.assert_close(gradient, whole_gradient, rtol=1e-10, atol=1e-14, msg=name)
    assert len(seen) >= 4  # the layouts really differ in how they split the batch


def test_per_micro_batch_penalty_would_differ():
    """The check above can fail: DMPO computed inside each micro-batch (groups cut apart and
    the mean taken per piece, as a loss with no batch terms would) changes the gradient."""
    from nemo_mmpo.dmpo import distribution_matching_penalty
    from nemo_mmpo.nemo_rl.dmpo_batch_terms import token_means

    config, _ = build()
    data, groups, current = ragged_batch(config)
    leaf = current.clone().requires_grad_()

    def penalty(rows):
        piece = data.select_indices(rows)
        return distribution_matching_penalty(
            piece["advantages"][:, 0],
            token_means(leaf[rows], piece["token_mask"]),
            groups[rows],
            valid_mask=piece["sample_mask"] > 0,
        )

    (whole,) = torch.autograd.grad(penalty(torch.arange(data.size)), leaf)
    split = sum(penalty(rows) for rows in torch.arange(data.size).tensor_split(4))
    (pieces,) = torch.autograd.grad(split, leaf)
    assert not torch.allclose(whole, pieces, rtol=1e-3)


def test_batch_terms_reach_the_loss_with_the_data():
    config, loss_fn = build()
    data, _, _ = ragged_batch(config)
    assert data[SHARE_KEY].shape == data[GRADIENT_KEY].shape == (data.size,)
    assert data[SHARE_KEY][3] == 0 and data[GRADIENT_KEY][3] == 0  # the filtered sample
    del data[GRADIENT_KEY]
    with pytest.raises(RuntimeError, match="grpo_train and async_grpo_train"):
        loss_fn(data["prev_logprobs"][:, 1:], data, *global_counts(data))
