"""Megatron's core attention on the CPU where it would need Transformer Engine, and the local
(non-TE) layer spec the CPU rig builds NeMo-RL's Megatron model with.

Megatron-Bridge's providers choose Transformer Engine's layer spec (``gpt_provider.py:120``,
``default_layer_spec``); its ``local_layer_spec`` (``gpt_provider.py:83``) is megatron-core's
plain-torch spec, whose ``DotProductAttention`` refuses context parallel
(``dot_product_attention.py:57``) and packed THD input (``:153``), which NeMo-RL's sequence
packing feeds it. These lines are the same in both snapshots' engines: Megatron-Bridge 0.6.2
and megatron-core 0.19.2 (NeMo-RL v0.7.0), Megatron-Bridge 8c46dc42 and megatron-core 0.20.0
(Megatron-LM 14346b65, NeMo-RL main); neither file differs between them.
:class:`CPUCoreAttention` answers both in plain torch; :func:`cpu_layer_spec` is
``local_layer_spec`` with it as the core attention; the CPU answer to
``AutoBridge.to_megatron_provider`` (:mod:`nemo_mmpo.cpu.answers.megatron_shims`, on the CPU
rig only) gives NeMo-RL's Hugging Face import this spec, which it writes into the import's
``run_config.yaml``: the training model is built with the same spec.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from megatron.core import parallel_state
from megatron.core.transformer.dot_product_attention import DotProductAttention


class _AllGather(torch.autograd.Function):
    """``[t, ...]`` from each rank of ``group`` -> ``[ranks x t, ...]``; backward: the summed
    gradient's own rows (all-reduce; gloo has no reduce-scatter)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        parts = [torch.empty_like(tensor) for _ in range(torch.distributed.get_world_size(group))]
        torch.distributed.all_gather(parts, tensor.contiguous(), group=group)
        return torch.cat(parts)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous().clone()
        torch.distributed.all_reduce(grad, group=ctx.group)
        rank = torch.distributed.get_rank(ctx.group)
        rows = grad.shape[0] // torch.distributed.get_world_size(ctx.group)
        return grad[rank * rows : (rank + 1) * rows], None


def packed_token_places(
    cu_seqlens_padded: torch.Tensor, cp_size: int, cp_rank: int
) -> torch.Tensor:
    """``[tokens on this rank, 2]``: each local token's (sequence, position in it), for a packed
    row whose sequences (padded lengths ``cu_seqlens_padded`` diffs, multiples of ``2 x
    cp_size``) are split into ``2 x cp_size`` chunks, rank ``r`` holding chunks ``r`` and
    ``2 cp_size - 1 - r`` (NeMo-RL's and Transformer Engine's load-balanced layout)."""
    places = []
    lengths = (cu_seqlens_padded[1:] - cu_seqlens_padded[:-1]).tolist()
    for sequence, length in enumerate(lengths):
        chunk = length // (2 * cp_size)
        for index in (cp_rank, 2 * cp_size - 1 - cp_rank) if cp_size > 1 else (0,):
            width = chunk if cp_size > 1 else length
            positions = torch.arange(index * width, (index + 1) * width)
            places.append(torch.stack([torch.full_like(positions, sequence), positions], -1))
    return torch.cat(places)


class CPUCoreAttention(DotProductAttention):
    """megatron-core's local ``DotProductAttention``, with a plain-torch causal attention where
    megatron-core needs Transformer Engine's (``dot_product_attention.py:57``: context parallel;
    ``:153``: packed THD input; 0.19.2 and 0.20.0 alike). There, queries ``[t, heads, dim]``
    attend causally within their sequence (``cu_seqlens_q_padded``) to the keys of every
    context-parallel rank, gathered."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        self.cp_size = config.context_parallel_size
        # the local attention's constructor refuses CP > 1 (line 57) and reads nothing else of it
        local = copy.copy(config)
        local.context_parallel_size = 1
        super().__init__(local, *args, **kwargs)
        self.config = config

    def forward(
        self,
        query,
        key,
        value,
        attention_mask,
        attn_mask_type=None,
        attention_bias=None,
        packed_seq_params=None,
    ):
        if packed_seq_params is None and self.cp_size == 1:
            return super().forward(
                query, key, value, attention_mask, attn_mask_type, attention_bias, packed_seq_params
            )
        if packed_seq_params is None or packed_seq_params.qkv_format != "thd":
            raise NotImplementedError("context parallel without packed (THD) input")
        return self.packed_attention(query, key, value, packed_seq_params)

    def packed_attention(self, query, key, value, packed_seq_params) -> torch.Tensor:
        """``query [t, heads, dim]``, ``key``/``value [t, groups, dim]`` -> ``[t, heads x dim]``."""
        cu = packed_seq_params.cu_seqlens_q_padded
        cp_rank = parallel_state.get_context_parallel_rank() if self.cp_size > 1 else 0
        mine = packed_token_places(cu, self.cp_size, cp_rank)
        if mine.shape[0] != query.shape[0]:
            raise ValueError(
                f"cu_seqlens_q_padded {cu.tolist()} covers {mine.shape[0]} tokens per rank at "
                f"CP={self.cp_size}, the packed row has {query.shape[0]}: the last sequence must "
                "absorb the row's padding (as NeMo-RL's packer does)"
            )
        if self.cp_size > 1:
            group = parallel_state.get_context_parallel_group()
            key = _AllGather.apply(key, group)
            value = _AllGather.apply(value, group)
            theirs = torch.cat(
                [packed_token_places(cu, self.cp_size, r) for r in range(self.cp_size)]
            )
        else:
            theirs = mine
        repeat = query.shape[1] // key.shape[1]
        key = key.repeat_interleave(repeat, dim=1)
        value = value.repeat_interleave(repeat, dim=1)
        allowed = (mine[:, None, 0] == theirs[None, :, 0]) & (
            theirs[None, :, 1] <= mine[:, None, 1]
        )
        scores = torch.einsum("qhd,khd->hqk", query.float(), key.float()) * self.softmax_scale
        scores = scores.masked_fill(~allowed, float("-inf"))
        out = torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), value.float())
        return out.to(query.dtype).reshape(out.shape[0], -1)


def cpu_layer_spec(config: Any) -> Any:
    """Megatron-Bridge's ``local_layer_spec(config)`` (``gpt_provider.py:83``, 0.6.2 and
    8c46dc42) with :class:`CPUCoreAttention` as every layer's core attention."""
    from megatron.bridge.models.gpt_provider import local_layer_spec

    spec = local_layer_spec(config)
    spec.submodules.self_attention.submodules.core_attention = CPUCoreAttention
    return spec
