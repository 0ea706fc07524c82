"""Real megatron-core on the CPU for the parallel-loss tests' own gloo ranks
(``tests/parallel_loss_ranks.py``): the few CUDA assumptions it makes, answered on the CPU.
NeMo-RL's own Megatron worker (the recipes, ``tests/cpu/test_megatron_policy.py``) gets its
answers from :mod:`nemo_mmpo.cpu.answers.megatron_shims` instead.

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
NeMo-RL's modules import only for type hints and which these ranks never run (importing it
needs the worker's answers): :func:`stub_megatron_bridge`.
"""

from __future__ import annotations

import contextlib
import sys
from types import ModuleType, SimpleNamespace
from typing import Any

import torch
from megatron.core.optimizer import clip_grads
from megatron.core.optimizer import optimizer as megatron_optimizer
from megatron.core.tensor_parallel import random as megatron_random

from nemo_mmpo.cpu.answers.megatron_attention import CPUCoreAttention, packed_token_places  # noqa: F401

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
            f"{qualified_name} is a type-hint stub for Megatron-Bridge in the parallel-loss "
            "ranks (nemo_mmpo/cpu/answers/megatron_cpu.py); this path needs NeMo-RL's worker"
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
