"""NeMo-RL's Megatron training step on gloo ranks: the loss it reports and its logits gradient.

``tests/nemo_rl_adapter/test_parallel_loss.py`` writes a spec (with ``torch.save``) and runs
:func:`main` in a fresh interpreter: ``python -c "from parallel_loss_ranks import main; main()"
SPEC OUT``. That process puts in the Megatron stand-ins (:mod:`megatron_standins`), imports
NeMo-RL once, then for each launch of the spec forks its ranks, which meet over gloo on
127.0.0.1, each layout of the launch on ranks ``0 .. tensor x context x data - 1``. Rank 0
writes ``OUT/launch-<i>.pt``: for each layout and loss, the ``loss`` NeMo-RL's worker reports,
the gradient of what it back-propagates with respect to the whole batch's logits
(``[batch, seq_len, vocab]``), and what each rank's model was given, micro-batch by micro-batch.

A rank does what NeMo-RL's ``Policy.train`` and ``MegatronPolicyWorker.train`` do for one step:
``Policy._shard_for_train`` (data-parallel shards; dynamic batching or sequence packing as
configured), then ``process_global_batch`` (the valid-token counts all-reduced over data
parallel), ``get_microbatch_iterator`` (micro-batches, dynamic shapes or packing with
context-parallel sharding), ``LossPostProcessor`` (``SequencePackingLossWrapper``,
``SequencePackingFusionLossWrapper`` or the unpacked wrapper, over ``prepare_loss_input`` and
``DistributedLogprob``) through ``megatron_forward_backward``, and
``aggregate_training_statistics``. Only the model, Megatron's schedule
(:mod:`megatron_standins`) and its gradient reduction are stood in for:

- :class:`StandInModel` returns, for each token it is given, that token's row of the whole
  batch's logits (its vocabulary shard under tensor parallel), so the gradient lands on the
  full logits. It finds each token's place in the batch in ``mtp_loss_mask``, which NeMo-RL
  packs and context-parallel-shards exactly as it packs ``input_ids`` and hands to the model
  as ``loss_mask`` (for Multi-Token Prediction); the batch carries each token's place there
  (:data:`PLACE_KEY`), and the model checks the tokens it gets are the ones at those places.
- Megatron's DDP sums gradients over data and context parallel (NeMo-RL sets
  ``calculate_per_token_loss=True``, ``average_in_collective=False``), and under tensor
  parallel each rank owns its vocabulary shard: the full gradient is the sum of the ranks'
  gradients, all-reduced here.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import megatron_standins
import torch
import torch.distributed as dist

#: Where the batch carries each token's place in the whole batch (``row * seq_len + pos + 1``;
#: 0 is padding). NeMo-RL packs this key as it packs the tokens and gives it to the model.
PLACE_KEY = "mtp_loss_mask"
#: Seconds a rank waits in a collective before gloo gives up (a hang fails instead of waiting).
COLLECTIVE_TIMEOUT = 120


def token_places(input_ids: torch.Tensor) -> torch.Tensor:
    """``[batch, seq_len]`` each token's place in the flattened batch, plus one."""
    return torch.arange(1, input_ids.numel() + 1).reshape(input_ids.shape)


class StandInModel(torch.nn.Module):
    """Logits looked up in the whole batch's logits by each token's place (see module doc)."""

    def __init__(self, logits: torch.Tensor, input_ids: torch.Tensor, tp_rank: int, tp_size: int):
        super().__init__()
        self.logits = torch.nn.Parameter(logits.clone())
        self.tokens = input_ids.reshape(-1)
        width = logits.shape[-1] // tp_size
        self.vocabulary = slice(tp_rank * width, (tp_rank + 1) * width)
        self.calls: list[dict[str, Any]] = []

    def forward(self, input_ids, position_ids=None, attention_mask=None, **kwargs):
        places = kwargs["loss_mask"].long()
        real = places > 0
        if not torch.equal(self.tokens[places[real] - 1], input_ids[real]):
            raise AssertionError("the token places are not laid out as the tokens")
        table = self.logits.reshape(-1, self.logits.shape[-1])[:, self.vocabulary]
        table = torch.cat([table.new_zeros(1, table.shape[1]), table])
        self.calls.append(
            {
                "shape": tuple(input_ids.shape),
                "packed": kwargs.get("packed_seq_params") is not None,
                "places": sorted(places[real].tolist()),
            }
        )
        return table[places]


def policy_sharding(cfg: dict[str, Any], dp_size: int) -> SimpleNamespace:
    """What ``Policy._shard_for_train`` reads: the attributes ``Policy.__init__`` sets."""
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


def train_step(layout, loss_fn, train_data, logits, groups) -> dict[str, Any]:
    """One ``Policy.train`` step of NeMo-RL's Megatron worker on this rank (see module doc)."""
    from nemo_rl.models.megatron.data import get_microbatch_iterator, process_global_batch
    from nemo_rl.models.megatron.train import (
        LossPostProcessor,
        aggregate_training_statistics,
        megatron_forward_backward,
    )
    from nemo_rl.models.policy.lm_policy import Policy

    cfg = layout["policy"]
    gbs, mbs = cfg["train_global_batch_size"], cfg["train_micro_batch_size"]
    dp_group = groups["data"]
    dp_size, dp_rank = dist.get_world_size(dp_group), dist.get_rank(dp_group)
    shards = Policy._shard_for_train(policy_sharding(cfg, dp_size), train_data, gbs)
    data = shards[dp_rank]
    model = StandInModel(
        logits,
        train_data["input_ids"],
        dist.get_rank(groups["tensor"]),
        dist.get_world_size(groups["tensor"]),
    )
    local_gbs = gbs // dp_size
    num_global_batches = train_data.size // gbs  # the worker all-reduces its shard's size
    all_mb_metrics, losses = [], []
    for gb_idx in range(num_global_batches):
        gb_result = process_global_batch(
            data, loss_fn=loss_fn, dp_group=dp_group, batch_idx=gb_idx, batch_size=local_gbs
        )
        iterator, num_microbatches, micro_batch_size, _, padded_seq_length = (
            get_microbatch_iterator(gb_result["batch"], cfg, mbs, straggler_timer=None)
        )
        post_processor = LossPostProcessor(
            loss_fn=loss_fn, cfg=cfg, num_microbatches=num_microbatches
        )
        losses_reduced = megatron_forward_backward(
            model=model,
            data_iterator=iterator,
            num_microbatches=num_microbatches,
            seq_length=padded_seq_length,
            mbs=micro_batch_size,
            post_processing_fn=post_processor,
            global_valid_seqs=gb_result["global_valid_seqs"],
            global_valid_toks=gb_result["global_valid_toks"],
        )
        # the worker: per-micro-batch metrics over the global batches, summed losses
        gb_metrics = [
            {
                key: value if ("_min" in key or "_max" in key) else value / num_global_batches
                for key, value in metrics.items()
            }
            for metrics in losses_reduced
        ]
        all_mb_metrics.extend(gb_metrics)
        losses.append(torch.tensor([metrics["loss"] for metrics in gb_metrics]).sum().item())
    _, global_loss = aggregate_training_statistics(all_mb_metrics, losses, dp_group)
    gradient = model.logits.grad.clone()
    dist.all_reduce(gradient, group=groups["all"])
    calls = [None] * dist.get_world_size(groups["all"])
    dist.all_gather_object(calls, model.calls, group=groups["all"])
    return {"loss": float(global_loss.sum()), "gradient": gradient, "calls_per_rank": calls}


def layout_groups(layout: dict[str, Any], rank: int) -> dict[str, Any] | None:
    """This rank's tensor-, context-, data-parallel and all-ranks groups for ``layout`` (None if
    it has no part in it). Megatron's rank order: tensor fastest, then context, then data.
    Every rank creates every group, in the same order (``new_group`` is collective)."""
    tp, cp, dp = layout["tensor"], layout["context"], layout["data"]
    size = tp * cp * dp

    def ranks(kind: str) -> list[list[int]]:
        coordinates = {r: (r % tp, r // tp % cp, r // (tp * cp)) for r in range(size)}
        axis = {"tensor": 0, "context": 1, "data": 2}[kind]
        sets: dict[tuple[int, ...], list[int]] = {}
        for member, coordinate in coordinates.items():
            rest = coordinate[:axis] + coordinate[axis + 1 :]
            sets.setdefault(rest, []).append(member)
        return list(sets.values())

    mine = {}
    for kind in ("tensor", "context", "data"):
        for members in ranks(kind):
            group = dist.new_group(members)
            if rank in members:
                mine[kind] = group
    group = dist.new_group(list(range(size)))
    if rank < size:
        mine["all"] = group
    return mine or None


def run_rank(rank: int, world: int, port: int, launch: dict, spec: dict, out: Path) -> None:
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=COLLECTIVE_TIMEOUT),
        )
        groups = [layout_groups(layout, rank) for layout in launch["layouts"]]
        results: dict[tuple[str, str], Any] = {}
        for layout, mine in zip(launch["layouts"], groups, strict=True):
            if mine is None:
                continue
            megatron_standins.set_groups(mine["tensor"], mine["context"], mine["data"])
            for loss_name, (loss_fn, train_data) in spec["losses"].items():
                try:
                    result = train_step(layout, loss_fn, train_data, spec["logits"], mine)
                except Exception as error:
                    if not layout.get("may_fail"):
                        raise
                    frames = traceback.extract_tb(error.__traceback__)
                    result = {
                        "error": f"{type(error).__name__}: {error}",
                        "raised_in": [(Path(f.filename).name, f.name) for f in frames],
                    }
                results[(layout["name"], loss_name)] = result
        if rank == 0:
            torch.save(results, out / f"launch-{launch['index']}.pt")
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_launch(launch: dict, spec: dict, out: Path, target: Any = None) -> None:
    """Fork ``launch['world']`` ranks running ``target`` (:func:`run_rank` unless given) and
    wait; if one fails, stop the others and fail."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    port = free_port()
    ranks = [
        context.Process(
            target=target or run_rank, args=(rank, launch["world"], port, launch, spec, out)
        )
        for rank in range(launch["world"])
    ]
    for process in ranks:
        process.start()
    while any(process.is_alive() for process in ranks):
        if any(process.exitcode not in (None, 0) for process in ranks):
            for process in ranks:
                if process.is_alive():
                    process.terminate()
            break
        time.sleep(0.05)
    for process in ranks:
        process.join()
    failed = [rank for rank, process in enumerate(ranks) if process.exitcode != 0]
    if failed:
        raise SystemExit(f"launch {launch['index']}: rank(s) {failed} failed (see above)")


def main() -> None:
    spec_path, out = Path(sys.argv[1]), Path(sys.argv[2])
    torch.set_num_threads(1)  # ranks share two cores; and fork before any thread pool starts
    megatron_standins.install()
    megatron_standins.cpu_tensors_for_cuda()
    # import NeMo-RL once, before forking: the ranks inherit it
    import nemo_rl.models.megatron.data
    import nemo_rl.models.megatron.train
    import nemo_rl.models.policy.lm_policy  # noqa: F401

    spec = torch.load(spec_path, weights_only=False)
    for launch in spec["launches"]:
        run_launch(launch, spec, out)
