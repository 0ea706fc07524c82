"""Real megatron-core on the CPU: the few CUDA assumptions it makes, answered on the CPU.

megatron-core 0.19.2 (PyPI) runs its ``GPTModel`` (local layer spec), parallel state, schedules,
DDP and optimizer over gloo once the CUDA-only calls below are answered. Each shim is one named
function, with the megatron-core or NeMo-RL line it answers; :func:`install` applies them all,
in the calling process only (a rank, never pytest's own process). Measured in
``/work/shared/notes/real-engines-on-cpu.md`` ("megatron-core from PyPI").

Wrappers are module-level (``torch.tensor = ...``), not a ``TorchFunctionMode``: NeMo-RL calls
``pin_memory=True).cuda()`` inside autograd's backward (``nemo_rl/distributed/model_utils.py``
1364-1365 in v0.7.0), where a mode is switched off.

What stays stood in: Transformer Engine's core attention, where megatron-core would need it
(context parallel, packed THD input): :class:`CPUCoreAttention`; Megatron-Bridge, whose classes
NeMo-RL's modules import only for type hints: :func:`stub_megatron_bridge`.
"""

from __future__ import annotations

import contextlib
import copy
import sys
from types import ModuleType, SimpleNamespace
from typing import Any

import torch
from megatron.core import parallel_state
from megatron.core.optimizer import clip_grads
from megatron.core.optimizer import optimizer as megatron_optimizer
from megatron.core.tensor_parallel import random as megatron_random
from megatron.core.transformer.dot_product_attention import DotProductAttention

_FACTORIES = ("tensor", "zeros", "ones", "empty", "full", "arange", "randn", "rand")
_INSTALLED: list[str] = []


def _is_cuda(device: Any) -> bool:
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, int)  # a CUDA device index


class CPURNGStatesTracker(megatron_random.CudaRNGStatesTracker):
    """Megatron's RNG tracker on the CPU generator (``tensor_parallel/random.py:303``: ``add``
    and ``fork`` read and set ``torch.cuda`` RNG states)."""

    def add(self, name: str, seed: int) -> None:
        self._is_initialized = True
        if name in self.states_:
            raise ValueError(f"RNG state {name!r} is already tracked")
        self.seeds_.add(seed)
        self.states_[name] = torch.Generator().manual_seed(seed).get_state()

    @contextlib.contextmanager
    def fork(self, name: str = megatron_random._MODEL_PARALLEL_RNG_TRACKER_NAME):
        if name not in self.states_:
            raise ValueError(f"RNG state {name!r} is not tracked; call cpu_rng_tracker(seed)")
        outer = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outer)


def cpu_rng_tracker(seed: int) -> None:
    """Seed megatron-core's model-parallel RNG states on the CPU generator (what
    ``model_parallel_cuda_manual_seed`` does on CUDA, ``tensor_parallel/random.py:446``)."""
    tracker = CPURNGStatesTracker()
    megatron_random._CUDA_RNG_STATE_TRACKER = tracker
    megatron_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    torch.manual_seed(seed)
    tracker.add(megatron_random._MODEL_PARALLEL_RNG_TRACKER_NAME, seed + 2718)
    tracker.add(megatron_random._DATA_PARALLEL_RNG_TRACKER_NAME, seed)
    tracker.add(megatron_random._EXPERT_PARALLEL_RNG_TRACKER_NAME, seed + 100)


def cpu_current_device() -> None:
    """``torch.cuda.current_device()`` is the CPU (``rotary_pos_embedding.py:162``; the global
    memory buffer, ``utils.py:715``, from ``dot_product_attention.py:189``)."""
    torch.cuda.current_device = lambda: "cpu"


def cpu_tensor_factories() -> None:
    """``device="cuda"`` and ``pin_memory=True`` in tensor factories, ``.cuda()``,
    ``.to("cuda")`` and ``.pin_memory()`` keep tensors on the CPU (megatron-core
    ``schedules.py:749, 2292``, ``clip_grads.py:96``, ``optimizer.py:690``; NeMo-RL
    ``data.py:116, 657``, ``train.py:757``, ``model_utils.py:1364-1365``)."""
    for name in _FACTORIES:
        factory = getattr(torch, name)

        def on_cpu(*args: Any, _factory: Any = factory, **kwargs: Any) -> torch.Tensor:
            if _is_cuda(kwargs.get("device")):
                kwargs["device"] = "cpu"
            kwargs.pop("pin_memory", None)
            return _factory(*args, **kwargs)

        setattr(torch, name, on_cpu)
    to = torch.Tensor.to

    def to_cpu(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        args = tuple("cpu" if _is_cuda(arg) else arg for arg in args)
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        return to(self, *args, **kwargs)

    torch.Tensor.to = to_cpu
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    torch.Tensor.pin_memory = lambda self, *args, **kwargs: self


def cpu_streams() -> None:
    """``torch.cuda.current_stream()``, synchronize and the cache calls do nothing on the CPU
    (``param_and_grad_buffer.py:632``, ``distributed_data_parallel.py:649``)."""
    stream = SimpleNamespace(wait_event=lambda event: None, synchronize=lambda: None)
    torch.cuda.current_stream = lambda *args, **kwargs: stream
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.cuda.empty_cache = lambda: None


def cpu_grads_in_clip_grads() -> None:
    """Gradient clipping accepts CPU float32 gradients (``clip_grads.py:174`` asserts
    ``param.grad.type() == 'torch.cuda.FloatTensor'``): while it runs, a CPU float32 tensor's
    ``type()`` names the CUDA type; every other line of the clipping is megatron-core's."""
    clip = clip_grads.clip_grad_by_total_norm_fp32

    def clip_on_cpu(*args: Any, **kwargs: Any) -> Any:
        tensor_type = torch.Tensor.type

        def cuda_name(self: torch.Tensor, *type_args: Any, **type_kwargs: Any) -> Any:
            name = tensor_type(self, *type_args, **type_kwargs)
            return "torch.cuda.FloatTensor" if name == "torch.FloatTensor" else name

        torch.Tensor.type = cuda_name
        try:
            return clip(*args, **kwargs)
        finally:
            torch.Tensor.type = tensor_type

    clip_grads.clip_grad_by_total_norm_fp32 = clip_on_cpu
    megatron_optimizer.clip_grad_by_total_norm_fp32 = clip_on_cpu


def _stub_class(qualified_name: str) -> type:
    def refuse(self: Any, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(
            f"{qualified_name} is a type-hint stub for Megatron-Bridge, which does not install "
            "here (nemo_mmpo/cpu/megatron_cpu.py); this path needs the real Megatron-Bridge"
        )

    return type(qualified_name.rpartition(".")[2], (), {"__init__": refuse})


def _refused_function(qualified_name: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"{qualified_name} is a Megatron-Bridge stub; it cannot run here")

    return refuse


#: Megatron-Bridge names NeMo-RL's Megatron modules import at module level (v0.7.0
#: ``models/megatron/config.py:18-19``; main ``config.py:19-21`` and ``data.py:20``, used there
#: only for MoE router replay).
BRIDGE_NAMES = {
    "megatron.bridge.training.config": {"ConfigContainer": _stub_class},
    "megatron.bridge.training.state": {"GlobalState": _stub_class},
    "megatron.bridge.models.model_provider": {"ModelProviderMixin": _stub_class},
    "megatron.bridge.training.utils.packed_seq_utils": {
        "get_packed_seq_cp_partition_indices": _refused_function
    },
}


def stub_megatron_bridge() -> None:
    """Modules ``megatron.bridge...`` holding the :data:`BRIDGE_NAMES`, each refusing to run."""
    for module_name, names in BRIDGE_NAMES.items():
        parts = module_name.split(".")
        for depth in range(2, len(parts) + 1):
            name = ".".join(parts[:depth])
            if name not in sys.modules:
                module = ModuleType(name)
                module.__path__ = []
                sys.modules[name] = module
                setattr(sys.modules[".".join(parts[: depth - 1])], parts[depth - 1], module)
        for name, make in names.items():
            setattr(sys.modules[module_name], name, make(f"{module_name}.{name}"))


def install() -> None:
    """All the shims above except the RNG tracker (seeded per model: :func:`cpu_rng_tracker`);
    idempotent."""
    if _INSTALLED:
        return
    cpu_current_device()
    cpu_tensor_factories()
    cpu_streams()
    cpu_grads_in_clip_grads()
    stub_megatron_bridge()
    _INSTALLED.append("done")


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
    ``:153``: packed THD input). There, queries ``[t, heads, dim]`` attend causally within their
    sequence (``cu_seqlens_q_padded``) to the keys of every context-parallel rank, gathered."""

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
