"""Stand-ins for Megatron-core and Megatron-Bridge, which cannot be installed on a CPU machine.

NeMo-RL's Megatron training step (``nemo_rl/models/megatron/train.py`` and ``data.py``) imports
``megatron.*`` at module level, but the part that turns logits into a loss calls Megatron for
very little: which process groups and ranks to use (``parallel_state``), a record of the
packed-sequence boundaries (``PackedSeqParams``), and the schedule that runs forward and
backward over the micro-batches (``get_forward_backward_func``). :func:`install` puts a
``megatron`` package on ``sys.meta_path`` that answers exactly those, written here (nothing is
taken from Megatron):

- ``megatron.core.parallel_state``: the tensor-, context- and data-parallel gloo groups that
  :func:`set_groups` was given;
- ``megatron.core.packed_seq_params.PackedSeqParams``: holds the keyword arguments it is built
  with (NeMo-RL reads ``cu_seqlens_q`` and ``cu_seqlens_q_padded`` back);
- ``megatron.core.pipeline_parallel.get_forward_backward_func``: Megatron's schedule without
  pipeline stages as it treats a loss function returning ``(loss, metrics)``: each
  micro-batch's loss is multiplied by the context-parallel size and divided by the number of
  micro-batches (its legacy averaging, which NeMo-RL's ``LossPostProcessor`` counteracts), then
  back-propagated;
- ``megatron.training.utils.get_ltor_masks_and_position_ids``: no masks (the stand-in models
  the tests use read neither).

Any other name imported from ``megatron`` is an inert placeholder class: NeMo-RL's modules
import many (``GPTModel``, ``MegatronModule``, ...) that the loss path never calls, and a
placeholder that is called or instantiated raises, naming itself, so a path that needs more of
Megatron than the above fails loudly instead of running on a stand-in.

:func:`cpu_tensors_for_cuda` makes NeMo-RL's ``.cuda()``, ``.to("cuda")``, ``device="cuda"``
and ``pin_memory=True`` keep tensors on the CPU, in the process that calls it (the tests call
both in worker processes of their own, never in pytest's).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from types import ModuleType
from typing import Any

import torch

_GROUPS: dict[str, Any] = {}


def set_groups(tensor: Any, context: Any, data: Any) -> None:
    """The process groups ``parallel_state`` answers with from now on (one layout at a time)."""
    _GROUPS.update(tensor=tensor, context=context, data=data)


def _rank(name: str) -> int:
    return torch.distributed.get_rank(_GROUPS[name])


def _size(name: str) -> int:
    return torch.distributed.get_world_size(_GROUPS[name])


_PARALLEL_STATE = {
    "get_tensor_model_parallel_group": lambda *args, **kwargs: _GROUPS["tensor"],
    "get_tensor_model_parallel_rank": lambda: _rank("tensor"),
    "get_tensor_model_parallel_world_size": lambda: _size("tensor"),
    "get_context_parallel_group": lambda *args, **kwargs: _GROUPS["context"],
    "get_context_parallel_rank": lambda: _rank("context"),
    "get_context_parallel_world_size": lambda: _size("context"),
    "get_data_parallel_group": lambda *args, **kwargs: _GROUPS["data"],
    "get_data_parallel_rank": lambda *args, **kwargs: _rank("data"),
    "get_data_parallel_world_size": lambda *args, **kwargs: _size("data"),
    "get_pipeline_model_parallel_world_size": lambda: 1,
    "is_pipeline_last_stage": lambda *args, **kwargs: True,
    "is_pipeline_first_stage": lambda *args, **kwargs: True,
}


class PackedSeqParams:
    """Megatron's record of packed-sequence boundaries: the keyword arguments, as attributes."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


def forward_backward_no_pipelining(
    *,
    forward_step_func: Any,
    data_iterator: Any,
    model: Any,
    num_microbatches: int,
    forward_only: bool = False,
    **unused: Any,
) -> list[dict[str, Any]]:
    """Megatron's one-stage schedule for a loss function that returns ``(loss, metrics)``."""
    metrics_per_microbatch = []
    for _ in range(num_microbatches):
        output_tensor, loss_func = forward_step_func(data_iterator, model)
        loss, metrics = loss_func(output_tensor)
        loss = loss * _size("context") / num_microbatches
        metrics_per_microbatch.append(metrics)
        if not forward_only:
            loss.backward()
    return metrics_per_microbatch


_EXPLICIT: dict[str, dict[str, Any]] = {
    "megatron.core.parallel_state": _PARALLEL_STATE,
    "megatron.core.packed_seq_params": {"PackedSeqParams": PackedSeqParams},
    "megatron.core.pipeline_parallel": {
        "get_forward_backward_func": lambda *args, **kwargs: forward_backward_no_pipelining
    },
    "megatron.training.utils": {
        "get_ltor_masks_and_position_ids": lambda *args, **kwargs: (None, None, None)
    },
}
#: Names imported with ``from megatron.x import name`` that are modules, not placeholders.
_SUBMODULES = {"parallel_state", "tensor_parallel", "pipeline_parallel", "utils", "training"}


class _Placeholder(type):
    """Metaclass of the placeholders: any attribute read is another placeholder."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"{cls.__qualname__} is a Megatron stand-in that cannot run on this machine; the "
            "path under test needs more of Megatron than tests/megatron_standins.py provides"
        )


def _placeholder(qualified_name: str) -> type:
    return _Placeholder(qualified_name, (), {"__qualname__": qualified_name})


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name == "megatron" or name.startswith("megatron."):
            return importlib.util.spec_from_loader(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        module.__path__ = []
        module.__dict__.update(_EXPLICIT.get(module.__name__, {}))

        def __getattr__(name: str) -> Any:
            if name.startswith("__"):
                raise AttributeError(name)
            if name in _SUBMODULES:
                return importlib.import_module(f"{module.__name__}.{name}")
            return _placeholder(f"{module.__name__}.{name}")

        module.__getattr__ = __getattr__


def install() -> None:
    """Answer ``import megatron...`` with the stand-ins (idempotent; this process only)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def _is_cuda(device: Any) -> bool:
    return (isinstance(device, str) and device.startswith("cuda")) or (
        isinstance(device, torch.device) and device.type == "cuda"
    )


def cpu_tensors_for_cuda() -> None:
    """``.cuda()``, ``.to("cuda")``, ``torch.tensor(device="cuda")``, ``pin_memory``: the CPU."""
    to, tensor = torch.Tensor.to, torch.tensor

    def to_cpu(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        args = tuple("cpu" if _is_cuda(arg) else arg for arg in args)
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        return to(self, *args, **kwargs)

    def tensor_on_cpu(*args: Any, device: Any = None, pin_memory: bool = False, **kwargs: Any):
        return tensor(*args, device=None if _is_cuda(device) else device, **kwargs)

    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    torch.Tensor.pin_memory = lambda self, *args, **kwargs: self
    torch.Tensor.to = to_cpu
    torch.tensor = tensor_on_cpu
