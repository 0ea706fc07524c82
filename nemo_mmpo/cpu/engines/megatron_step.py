"""NeMo-RL's Megatron log-prob pass and train step on this rank's part of a megatron-core model.

What NeMo-RL's ``Policy`` (driver side) and ``MegatronPolicyWorker`` (each rank) do around
megatron-core, with NeMo-RL's own functions and the model and optimizer built by us: the
parallel-loss tests' ranks (NeMo-RL's own worker, :mod:`nemo_mmpo.cpu.engines.megatron_policy`, runs
the recipes):

- :func:`logprobs`: ``Policy._shard_for_logprob``, ``get_microbatch_iterator``,
  ``LogprobsPostProcessor`` through ``megatron_forward_backward`` (forward only);
- :func:`train`: ``Policy._shard_for_train``, then per global batch ``zero_grad_buffer``,
  ``process_global_batch``, ``get_microbatch_iterator``, ``LossPostProcessor`` through
  ``megatron_forward_backward`` (megatron-core's schedule; its ``finalize_model_grads``
  all-reduces the DDP gradient buffers), the optimizer's step,
  ``broadcast_loss_metrics_from_last_stage``; then ``aggregate_training_statistics``.

Both pass the generation sampler's ``TrainingSamplingParams``, as NeMo-RL's Megatron setup
does. ``cfg`` is NeMo-RL's ``policy`` section. Every rank of the model calls these together
(they meet in megatron-core's collectives). Used by the parallel-loss tests
(``tests/parallel_loss_ranks.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
from megatron.core import parallel_state
from nemo_rl.models.megatron.data import get_microbatch_iterator, process_global_batch
from nemo_rl.models.megatron.pipeline_parallel import broadcast_loss_metrics_from_last_stage
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


def training_sampling_params(cfg: dict[str, Any]) -> Any:
    """NeMo-RL's ``TrainingSamplingParams`` from ``cfg['generation']`` (what its Megatron
    setup passes the post-processors, so that log-probs use the sampler's temperature), or
    None without a generation section."""
    from nemo_rl.algorithms.logits_sampling_utils import TrainingSamplingParams

    generation = cfg.get("generation")
    if not generation:
        return None
    return TrainingSamplingParams(
        top_k=generation.get("top_k"),
        top_p=generation.get("top_p", 1.0),
        temperature=generation.get("temperature", 1.0),
    )


def logprobs(model: Any, cfg: dict[str, Any], data: Any) -> tuple[torch.Tensor | None, Any]:
    """The log-probs ``[rows, seq_len]`` of this rank's data-parallel shard of ``data`` (on the
    last pipeline stage; None elsewhere) and the shards' inverse permutation (to put every
    shard's rows back in order)."""
    sharding = policy_sharding(cfg, parallel_state.get_data_parallel_world_size())
    shards, unsorted = Policy._shard_for_logprob(sharding, data)
    shard = shards[parallel_state.get_data_parallel_rank()]
    sampling = training_sampling_params(cfg)
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
            post_processing_fn=LogprobsPostProcessor(cfg=cfg, sampling_params=sampling),
            forward_only=True,
            sampling_params=sampling,
        )
    if not parallel_state.is_pipeline_last_stage():
        return None, unsorted
    pieces = [
        torch.nn.functional.pad(r["logprobs"], (0, seq_length - r["logprobs"].shape[1]))
        for r in results
    ]
    return torch.cat(pieces), unsorted


def train(
    model: Any,
    optimizer: Any,
    cfg: dict[str, Any],
    loss_fn: Any,
    data: Any,
    *,
    gbs: int | None = None,
    mbs: int | None = None,
    eval_mode: bool = False,
    before_optimizer_step: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """``MegatronPolicyWorker.train`` on this rank: ``data`` (the whole batch; this rank takes
    its data-parallel shard as ``Policy.train`` would send it) in global batches of ``gbs``
    rows, each one optimizer step (none in ``eval_mode``). ``before_optimizer_step`` runs
    between the backward pass and the step (the gradients are reduced then).

    Returns what the worker returns: ``global_loss`` ``[global batches]`` (summed over data
    parallel), ``grad_norm`` ``[1]`` (the last step's, over the whole model),
    ``all_mb_metrics`` (per micro-batch, each divided by the number of global batches except
    ``*_min``/``*_max``, with ``lr`` and the valid counts), and ``stepped`` (False when the
    optimizer skipped a step)."""
    global_batch = gbs or cfg["train_global_batch_size"]
    micro_batch = mbs or cfg["train_micro_batch_size"]
    dp_group = parallel_state.get_data_parallel_group()
    dp_size = parallel_state.get_data_parallel_world_size()
    shard = Policy._shard_for_train(policy_sharding(cfg, dp_size), data, global_batch)[
        parallel_state.get_data_parallel_rank()
    ]
    sampling = training_sampling_params(cfg)
    batches = data.size // global_batch
    model.train(not eval_mode)
    all_metrics: list[dict[str, Any]] = []
    losses: list[float] = []
    grad_norm, stepped = 0.0, True
    with torch.no_grad() if eval_mode else contextlib.nullcontext():
        for index in range(batches):
            model.zero_grad_buffer()
            optimizer.zero_grad()
            batch = process_global_batch(
                shard,
                loss_fn=loss_fn,
                dp_group=dp_group,
                batch_idx=index,
                batch_size=global_batch // dp_size,
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
                post_processing_fn=LossPostProcessor(
                    loss_fn=loss_fn, cfg=cfg, num_microbatches=count, sampling_params=sampling
                ),
                forward_only=eval_mode,
                global_valid_seqs=batch["global_valid_seqs"],
                global_valid_toks=batch["global_valid_toks"],
                sampling_params=sampling,
            )
            if not eval_mode:
                if before_optimizer_step is not None:
                    before_optimizer_step()
                updated, norm, _ = optimizer.step()
                stepped &= bool(updated)
                grad_norm = float(norm) if norm is not None else 0.0
            metrics = None
            if parallel_state.is_pipeline_last_stage(ignore_virtual=True):
                metrics = [
                    {
                        **{
                            key: value if "_min" in key or "_max" in key else value / batches
                            for key, value in piece.items()
                        },
                        "lr": optimizer.param_groups[0]["lr"],
                        "global_valid_seqs": float(batch["global_valid_seqs"]),
                        "global_valid_toks": float(batch["global_valid_toks"]),
                    }
                    for piece in reduced
                ]
            metrics = broadcast_loss_metrics_from_last_stage(metrics)
            all_metrics.extend(metrics)
            losses.append(torch.tensor([piece["loss"] for piece in metrics]).sum().item())
    model.eval()
    merged, global_loss = aggregate_training_statistics(all_metrics, losses, dp_group)
    return {
        "global_loss": global_loss,
        "grad_norm": torch.tensor([grad_norm]),
        "all_mb_metrics": merged,
        "stepped": stepped,
    }


def train_step(
    model: Any,
    optimizer: Any,
    cfg: dict[str, Any],
    loss_fn: Any,
    data: Any,
    before_optimizer_step: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """One global batch of ``data`` (``cfg['train_global_batch_size']`` rows) through
    :func:`train`. Returns ``loss`` (the global batch's, on the last pipeline stage; None
    elsewhere) and ``stepped`` (False when the optimizer skipped the step)."""
    result = train(
        model, optimizer, cfg, loss_fn, data, before_optimizer_step=before_optimizer_step
    )
    loss = float(result["global_loss"].sum()) if parallel_state.is_pipeline_last_stage() else None
    return {"loss": loss, "stepped": result["stepped"]}
