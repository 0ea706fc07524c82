"""NeMo-RL's Megatron log-prob pass and train step on this rank's part of a megatron-core model.

What NeMo-RL's ``Policy`` (driver side) and ``MegatronPolicyWorker`` (each rank) do around
megatron-core, with NeMo-RL's own functions and the model and optimizer built by us (NeMo-RL's
worker builds them through Megatron-Bridge, which does not install here):

- :func:`logprobs`: ``Policy._shard_for_logprob``, ``get_microbatch_iterator``,
  ``LogprobsPostProcessor`` through ``megatron_forward_backward`` (forward only);
- :func:`train_step`: ``Policy._shard_for_train``, ``zero_grad_buffer``,
  ``process_global_batch``, ``get_microbatch_iterator``, ``LossPostProcessor`` through
  ``megatron_forward_backward`` (megatron-core's schedule; its ``finalize_model_grads``
  all-reduces the DDP gradient buffers), ``aggregate_training_statistics``, then the
  optimizer's step.

``cfg`` is NeMo-RL's ``policy`` section. Every rank of the model calls these together (they
meet in megatron-core's collectives). Used by the parallel-loss tests
(``tests/parallel_loss_ranks.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
from megatron.core import parallel_state
from nemo_rl.models.megatron.data import get_microbatch_iterator, process_global_batch
from nemo_rl.models.megatron.train import (
    LogprobsPostProcessor,
    LossPostProcessor,
    aggregate_training_statistics,
    megatron_forward_backward,
)
from nemo_rl.models.policy.lm_policy import Policy


def policy_sharding(cfg: dict[str, Any], dp_size: int) -> SimpleNamespace:
    """What ``Policy._shard_for_train`` and ``_shard_for_logprob`` read: the attributes
    ``Policy.__init__`` sets from ``cfg``."""
    state = SimpleNamespace(
        cfg=cfg,
        data_parallel_size=dp_size,
        use_dynamic_batches=cfg["dynamic_batching"]["enabled"],
        use_sequence_packing=cfg["sequence_packing"]["enabled"],
    )
    if state.use_dynamic_batches:
        state.dynamic_batching_args = {
            "input_key": "input_ids",
            "input_lengths_key": "input_lengths",
            "sequence_length_round": cfg["dynamic_batching"]["sequence_length_round"],
            "max_tokens_per_microbatch": 0,
        }
    if state.use_sequence_packing:
        state.sequence_packing_args = {
            "algorithm": cfg["sequence_packing"]["algorithm"],
            "input_key": "input_ids",
            "input_lengths_key": "input_lengths",
            "sequence_length_pad_multiple": cfg["make_sequence_length_divisible_by"],
        }
        if cfg["sequence_packing"].get("microbatch_order") is not None:  # main's option
            order = cfg["sequence_packing"]["microbatch_order"]
            state.sequence_packing_args["microbatch_order"] = order
    return state


def logprobs(model: Any, cfg: dict[str, Any], data: Any) -> tuple[torch.Tensor | None, Any]:
    """The log-probs ``[rows, seq_len]`` of this rank's data-parallel shard of ``data`` (on the
    last pipeline stage; None elsewhere) and the shards' inverse permutation (to put every
    shard's rows back in order)."""
    sharding = policy_sharding(cfg, parallel_state.get_data_parallel_world_size())
    shards, unsorted = Policy._shard_for_logprob(sharding, data)
    shard = shards[parallel_state.get_data_parallel_rank()]
    model.eval()
    with torch.no_grad():
        iterator, count, micro_batch_size, seq_length, padded = get_microbatch_iterator(
            shard, cfg, cfg["logprob_batch_size"], straggler_timer=None
        )
        results = megatron_forward_backward(
            model=model,
            data_iterator=iterator,
            num_microbatches=count,
            seq_length=padded,
            mbs=micro_batch_size,
            post_processing_fn=LogprobsPostProcessor(cfg=cfg),
            forward_only=True,
        )
    if not parallel_state.is_pipeline_last_stage():
        return None, unsorted
    pieces = [
        torch.nn.functional.pad(r["logprobs"], (0, seq_length - r["logprobs"].shape[1]))
        for r in results
    ]
    return torch.cat(pieces), unsorted


def train_step(
    model: Any,
    optimizer: Any,
    cfg: dict[str, Any],
    loss_fn: Any,
    data: Any,
    before_optimizer_step: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """One global batch of ``data`` (``cfg['train_global_batch_size']`` rows) and the
    optimizer's step; ``before_optimizer_step`` runs between the two (the gradients are
    reduced then). Returns ``loss`` (the global batch's, on the last pipeline stage; None
    elsewhere) and ``stepped`` (False when the optimizer skipped the step)."""
    global_batch, micro_batch = cfg["train_global_batch_size"], cfg["train_micro_batch_size"]
    dp_group = parallel_state.get_data_parallel_group()
    dp_size = parallel_state.get_data_parallel_world_size()
    shard = Policy._shard_for_train(policy_sharding(cfg, dp_size), data, global_batch)[
        parallel_state.get_data_parallel_rank()
    ]
    model.train()
    model.zero_grad_buffer()
    optimizer.zero_grad()
    batch = process_global_batch(
        shard, loss_fn=loss_fn, dp_group=dp_group, batch_idx=0, batch_size=global_batch // dp_size
    )
    iterator, count, micro_batch_size, _, padded = get_microbatch_iterator(
        batch["batch"], cfg, micro_batch, straggler_timer=None
    )
    reduced = megatron_forward_backward(
        model=model,
        data_iterator=iterator,
        num_microbatches=count,
        seq_length=padded,
        mbs=micro_batch_size,
        post_processing_fn=LossPostProcessor(loss_fn=loss_fn, cfg=cfg, num_microbatches=count),
        global_valid_seqs=batch["global_valid_seqs"],
        global_valid_toks=batch["global_valid_toks"],
    )
    loss = None
    if parallel_state.is_pipeline_last_stage():
        losses = [torch.tensor([metrics["loss"] for metrics in reduced]).sum().item()]
        _, global_loss = aggregate_training_statistics(reduced, losses, dp_group)
        loss = float(global_loss.sum())
    if before_optimizer_step is not None:
        before_optimizer_step()
    updated, _, _ = optimizer.step()
    return {"loss": loss, "stepped": bool(updated)}
