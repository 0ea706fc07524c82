"""The refit's weight transport on CPU: the policy's state dict through Ray's object store.

On a GPU node NeMo-RL's ``refit_policy_generation`` has the policy stream its weights (CUDA
IPC handles over ZMQ, colocated; NCCL broadcast, separate) while the vLLM worker receives them
(``update_weights_via_ipc_zmq`` / ``update_weights_from_collective``). Here the same two calls
meet at a named Ray actor, :class:`WeightMailbox`:

- policy side, :func:`publish`: ``ray.put`` of the state dict (``{name: tensor}``, Hugging Face
  names, CPU float32), its reference posted to the mailbox as version ``n + 1``;
- vLLM side, :func:`receive_and_load` (installed as the worker extension's two update methods
  by :mod:`nemo_mmpo.cpu.answers.vllm_shims`): waits for a version newer than the last it loaded,
  reads the state dict from the object store and loads it with vLLM's layer-wise reload
  (``model_runner.reload_weights``), the whole dict at once (a fused q/k/v group must arrive
  whole).
"""

from __future__ import annotations

import asyncio
import time
import traceback
from typing import Any

import ray
import torch

#: The mailbox's Ray actor name (one per Ray namespace: one rig run at a time).
MAILBOX = "nemo_mmpo_weight_mailbox"
#: How long a vLLM worker waits for the policy's weights before the refit fails.
RECEIVE_TIMEOUT_S = 600.0


@ray.remote(num_cpus=0)
class WeightMailbox:
    """The newest published state dict's object reference, with a version number."""

    def __init__(self) -> None:
        self.version = 0
        self.refs: list[Any] = []
        self.changed = asyncio.Event()

    async def post(self, refs: list[Any]) -> int:
        """Keep ``refs`` (a one-element list, so Ray passes the reference, not the value)."""
        self.version += 1
        self.refs = refs
        self.changed.set()
        return self.version

    async def newer_than(self, version: int, timeout_s: float) -> tuple[int, list[Any]]:
        """``(version, refs)`` once a version newer than ``version`` is posted."""
        deadline = time.monotonic() + timeout_s
        while self.version <= version:
            self.changed.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"no weights newer than version {version} were published in {timeout_s:g} s"
                )
            try:
                await asyncio.wait_for(self.changed.wait(), remaining)
            except TimeoutError:
                continue
        return self.version, self.refs


def start_mailbox() -> Any:
    """The run's :class:`WeightMailbox` (the caller holds it: it lives as long as the handle)."""
    return WeightMailbox.options(name=MAILBOX, get_if_exists=True).remote()


def state_dict_for_refit(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached copy of ``model``'s weights, Hugging Face names (tied weights once)."""
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def publish(model: torch.nn.Module, box: Any) -> list[Any]:
    """Post ``model``'s weights to ``box``; returns the futures NeMo-RL's refit waits for."""
    return publish_state(state_dict_for_refit(model), box)


def publish_state(weights: dict[str, torch.Tensor], box: Any) -> list[Any]:
    """Post ``weights`` (``{Hugging Face name: tensor}``) to ``box``; returns the futures."""
    return [box.post.remote([ray.put(wire_safe(weights))])]


def wire_safe(weights: dict[str, torch.Tensor]) -> dict[str, tuple[Any, str, tuple[int, ...]]]:
    """``weights`` as ``{name: (bytes as a numpy array, dtype name, shape)}``.

    Importing megatron-core replaces ``torch.storage._load_from_bytes`` with a function of its
    own, so a tensor pickled in a Megatron worker unpickles only where megatron-core imports;
    in NeMo-RL's layout the vLLM worker's environment has none (NeMo-RL main's
    ``make_nccl_reshard_refit_info_wire_safe`` says the same of vLLM's processes). On a GPU
    the refit sends CUDA IPC handles, not pickled tensors; here the bytes travel as numpy
    arrays, which pickle without torch's storage (and keep bfloat16, which numpy lacks)."""
    return {
        name: (
            tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy(),
            str(tensor.dtype).removeprefix("torch."),
            tuple(tensor.shape),
        )
        for name, tensor in weights.items()
    }


def from_wire(weights: dict[str, tuple[Any, str, tuple[int, ...]]]) -> dict[str, torch.Tensor]:
    """The tensors :func:`wire_safe` packed."""
    return {
        name: torch.from_numpy(data).view(getattr(torch, dtype)).reshape(shape)
        for name, (data, dtype, shape) in weights.items()
    }


def receive_and_load(self: Any, *args: Any, **kwargs: Any) -> bool:
    """The vLLM worker extension's weight update (``self`` is vLLM's worker): the next
    published state dict, loaded with layer-wise reload. True on success; on an error prints
    it and returns False, as NeMo-RL's own transports do (its refit then raises)."""
    try:
        seen = getattr(self, "_nemo_mmpo_weights_version", 0)
        version, refs = ray.get(ray.get_actor(MAILBOX).newer_than.remote(seen, RECEIVE_TIMEOUT_S))
        weights = from_wire(ray.get(refs[0]))
        self.model_runner.reload_weights(
            weights_iterator=iter(weights.items()), is_checkpoint_format=True
        )
        self._nemo_mmpo_weights_version = version
        return True
    except Exception as error:
        print(f"Error in nemo-mmpo's CPU weight update: {error}\n{traceback.format_exc()}")
        return False
