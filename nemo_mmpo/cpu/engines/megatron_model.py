"""A tiny real megatron-core ``GPTModel`` on the CPU, its weights by global name, its gradients.

The model is megatron-core's ``GPTModel`` with the local layer spec (no Transformer Engine),
:class:`~nemo_mmpo.cpu.answers.megatron_cpu.CPUCoreAttention` as core attention, float32, untied
output layer, rotary positions. Under tensor and pipeline parallel a rank holds a part of it:
:func:`global_name` names a local parameter as in the one-process model, :func:`load_full`
gives each rank its shard of the one-process weights, :func:`gather_full` rebuilds full
tensors (parameters or gradients) from every rank's shards.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.distributed.finalize_model_grads import finalize_model_grads
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer import TransformerConfig

from nemo_mmpo.cpu.answers.megatron_cpu import CPUCoreAttention

#: The tiny shape: 2 layers (one per pipeline stage at PP=2), 4 heads (2 per rank at TP=2).
TINY = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 128}


def tiny_gpt(vocabulary: int, max_length: int, shape: dict[str, Any] | None = None) -> Any:
    """This rank's part of the tiny model, wrapped in megatron-core's DDP (gradients summed over
    data and context parallel, as NeMo-RL configures it: ``average_in_collective=False``,
    ``calculate_per_token_loss=True``), with megatron-core's ``finalize_model_grads`` as the
    schedule's last step. ``shape``: ``TransformerConfig`` settings and ``rotary_base``
    (default :data:`TINY`).
    Needs ``parallel_state`` initialized."""
    shape = dict(shape or TINY)
    rotary_base = shape.pop("rotary_base", 10000)  # GPTModel's, not TransformerConfig's
    config = TransformerConfig(
        **{"add_bias_linear": False, **shape},
        tensor_model_parallel_size=parallel_state.get_tensor_model_parallel_world_size(),
        pipeline_model_parallel_size=parallel_state.get_pipeline_model_parallel_world_size(),
        context_parallel_size=parallel_state.get_context_parallel_world_size(),
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        pipeline_dtype=torch.float32,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        calculate_per_token_loss=True,
        perform_initialization=True,
        variable_seq_lengths=True,  # packed micro-batches differ in length
        moe_token_dispatcher_type="alltoall",  # the only one allowing that (no MoE here)
    )
    spec = get_gpt_layer_local_spec(normalization=shape.get("normalization"))
    spec.submodules.self_attention.submodules.core_attention = CPUCoreAttention
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=vocabulary,
        max_sequence_length=max_length,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=False,
        position_embedding_type="rope",
        rotary_base=rotary_base,
    )
    ddp = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=False,
        use_distributed_optimizer=False,
        average_in_collective=False,
        check_for_nan_in_grad=True,
    )
    wrapped = DistributedDataParallel(config=config, ddp_config=ddp, module=model)
    config.finalize_model_grads_func = finalize_model_grads
    return wrapped


def global_name(model: Any, name: str) -> str:
    """``name`` of a local parameter as the one-process model names it (pipeline stages number
    their layers from 0; ``layer_number`` is global, from 1)."""
    match = re.search(r"decoder\.layers\.(\d+)\.", name)
    if match is None:
        return name.removeprefix("module.")
    layers = model.module.decoder.layers
    number = layers[int(match.group(1))].layer_number - 1
    return name.removeprefix("module.").replace(match.group(0), f"decoder.layers.{number}.", 1)


#: the split of a gated linear unit's ``linear_fc1`` (gate then up, each split across ranks)
GATED = "gated"


def _shard(model: Any, name: str, parameter: torch.Tensor) -> int | str | None:
    """The dimension a tensor-parallel parameter is split along, :data:`GATED` for a gated
    MLP's ``linear_fc1`` (each rank holds its part of the gate, then its part of up), or None
    if replicated."""
    if not getattr(parameter, "tensor_model_parallel", False):
        return None
    if name.endswith("mlp.linear_fc1.weight") and model.module.config.gated_linear_unit:
        return GATED
    return parameter.partition_dim


def _split(tensor: torch.Tensor, dim: int | str, parts: int, part: int) -> torch.Tensor:
    if dim == GATED:
        return torch.cat([half.chunk(parts)[part] for half in tensor.chunk(2)])
    return tensor.chunk(parts, dim=dim)[part]


def _join(shards: list[torch.Tensor], dim: int | str) -> torch.Tensor:
    if dim == GATED:
        halves = [shard.chunk(2) for shard in shards]
        return torch.cat([half[0] for half in halves] + [half[1] for half in halves])
    return torch.cat(shards, dim)


@torch.no_grad()
def load_full(model: Any, full: dict[str, torch.Tensor]) -> None:
    """Copy into each local parameter its shard of the one-process weights ``full``."""
    tp = parallel_state.get_tensor_model_parallel_world_size()
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    for name, parameter in model.named_parameters():
        tensor = full[global_name(model, name)]
        dim = _shard(model, name, parameter)
        if dim is not None:
            tensor = _split(tensor, dim, tp, tp_rank)
        parameter.copy_(tensor)


def local_pieces(model: Any, which: str) -> dict[str, tuple[torch.Tensor, Any, int]]:
    """``{global name: (tensor, split dim, tensor-parallel rank)}`` of this rank's ``which``:
    ``"param"`` or ``"grad"`` (megatron-core's DDP keeps gradients in ``main_grad``)."""
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    pieces = {}
    for name, parameter in model.named_parameters():
        tensor = parameter.detach() if which == "param" else parameter.main_grad
        pieces[global_name(model, name)] = (tensor.clone(), _shard(model, name, parameter), tp_rank)
    return pieces


def gather_full(pieces: list[dict[str, tuple[torch.Tensor, Any, int]]]) -> dict:
    """Full tensors by global name from the pieces of the ranks of one data/context replica."""
    by_name: dict[str, dict[int, tuple[torch.Tensor, Any]]] = {}
    for rank_pieces in pieces:
        for name, (tensor, dim, tp_rank) in rank_pieces.items():
            by_name.setdefault(name, {})[tp_rank] = (tensor, dim)
    full = {}
    for name, shards in by_name.items():
        ordered = [shards[rank] for rank in sorted(shards)]
        dim = ordered[0][1]
        full[name] = ordered[0][0] if dim is None else _join([t for t, _ in ordered], dim)
    return full
