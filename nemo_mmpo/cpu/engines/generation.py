"""CPU generation engines: NeMo-RL's ``GenerationInterface`` on ``model.generate``.

- :class:`CPUGeneration`: sampling on the policy's own model in the driver (colocated; a
  refit is a no-op).
- :class:`SeparateCPUGeneration`: sampling in a CPU Ray actor with its own copy of the
  weights, refit from the policy (non-colocated: the layout NeMo-RL's async trainer needs).

Both subclass NeMo-RL's abstract interface, so a method NeMo-RL adds fails at construction.
The returned ``logprobs`` are the sampling model's for the sampled tokens at the sampling
temperature (:func:`nemo_mmpo.cpu.engines.sampling.sample_batch`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import torch
from nemo_rl.distributed.batched_data_dict import BatchedDataDict
from nemo_rl.models.generation.interfaces import GenerationInterface

from nemo_mmpo.cpu.engines.policy import CPUPolicy
from nemo_mmpo.cpu.engines.sampling import sample_batch, sample_texts


def sample_with_own_seed(model: Any, tokenizer: Any, seed: int, **settings: Any) -> list[list[str]]:
    """:func:`~nemo_mmpo.cpu.engines.sampling.sample_texts` from its own seeded random state,
    leaving the caller's untouched (an evaluation must not change what training samples next)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return sample_texts(model, tokenizer, **settings)


def sample(
    model: Any, tokenizer: Any, data: Any, generation_config: dict[str, Any], greedy: bool
) -> BatchedDataDict:
    """:func:`~nemo_mmpo.cpu.engines.sampling.sample_batch` on NeMo-RL's ``BatchedDataDict``."""
    return BatchedDataDict(
        sample_batch(
            model, tokenizer, data["input_ids"], data["input_lengths"], generation_config, greedy
        )
    )


def _rows(outputs: Any):
    """``(row, one-row batch)`` pairs, as vLLM's ``generate_async`` yields them."""
    for row in range(outputs["output_ids"].shape[0]):
        yield row, outputs.slice(row, row + 1)


class DriverSideEngine(GenerationInterface):
    """NeMo-RL's generation interface with what it calls on a vLLM engine around sampling
    (wake, sleep, refits, metrics) as no-ops. Subclasses implement ``generate`` (and
    ``generate_async`` for NeMo-RL's async rollouts); an engine with its own weights
    implements the refit calls."""

    def init_collective(self, *args: Any, **kwargs: Any) -> list:
        return []

    def prepare_for_generation(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def finish_generation(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def prepare_refit_info(self, *args: Any, **kwargs: Any) -> None:
        return None

    def update_weights_via_ipc_zmq(self, *args: Any, **kwargs: Any) -> list:
        return []  # an engine on the policy's own model has nothing to receive

    def update_weights_from_collective(self, *args: Any, **kwargs: Any) -> list:
        return []

    def snapshot_step_metrics(self) -> None:
        return None

    def get_step_metrics(self) -> dict:
        return {}

    def get_logger_metrics(self) -> dict:
        return {}

    def clear_logger_metrics(self) -> None:
        return None

    def invalidate_kv_cache(self) -> bool:
        return True

    def blocks_training(self) -> bool:
        return False

    def shutdown(self) -> bool:
        return True


class CPUGeneration(DriverSideEngine):
    """Sampling on the policy's model, in the driver (colocated: nothing to refit)."""

    def __init__(self, policy: CPUPolicy, generation_config: dict[str, Any]) -> None:
        self.policy = policy
        self.cfg = generation_config

    def generate(self, data: Any, greedy: bool = False) -> Any:
        return sample(self.policy.model, self.policy.tokenizer, data, self.cfg, greedy)

    def sample_texts(self, prompts: list[str], samples: int, seed: int, **sampler: Any) -> list:
        """``samples`` texts per prompt at the given sampler settings (``temperature``,
        ``top_p``, ``max_new_tokens``), for an evaluation inside NeMo-RL's loop."""
        return sample_with_own_seed(
            self.policy.model,
            self.policy.tokenizer,
            seed,
            prompts=prompts,
            samples=samples,
            **sampler,
        )

    async def generate_async(self, data: Any, greedy: bool = False) -> Any:
        for item in _rows(self.generate(data, greedy)):
            yield item


def _concatenate_prompts(batches: list[Any]) -> BatchedDataDict:
    """One ``input_ids``/``input_lengths`` batch from several, right-padded to the widest."""
    width = max(int(batch["input_ids"].shape[1]) for batch in batches)
    rows = []
    for batch in batches:
        ids = batch["input_ids"]
        padding = torch.zeros((ids.shape[0], width - ids.shape[1]), dtype=ids.dtype)
        rows.append(torch.cat([ids, padding], dim=1))
    return BatchedDataDict(
        {
            "input_ids": torch.cat(rows),
            "input_lengths": torch.cat([batch["input_lengths"] for batch in batches]),
        }
    )


class GenerationWorker:
    """A generation engine's own copy of the model, in its own process (an async CPU Ray actor).

    NeMo-RL's async rollouts send one request per sample, concurrently; like vLLM's continuous
    batching, requests that arrive together are sampled as one batch (each row is sampled as it
    would be alone; only the order of random draws depends on the grouping). A refit waits for
    the batch in flight.
    """

    def __init__(
        self, model: Any, tokenizer: Any, generation_config: dict[str, Any], seed: int
    ) -> None:
        torch.manual_seed(seed)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.cfg = generation_config
        self.refits = 0
        self.batch_sizes: list[int] = []
        self._pending: list[tuple[Any, bool, Any]] = []
        self._batcher: Any = None
        self._model_lock = asyncio.Lock()

    async def generate(self, data: Any, greedy: bool = False) -> Any:
        future = asyncio.get_running_loop().create_future()
        self._pending.append((data, greedy, future))
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.ensure_future(self._sample_pending())
        return await future

    async def _sample_pending(self) -> None:
        while self._pending:
            await asyncio.sleep(0.005)  # let requests sent together arrive together
            requests, self._pending = self._pending, []
            for greedy in (False, True):
                chosen = [request for request in requests if request[1] == greedy]
                if not chosen:
                    continue
                try:
                    merged = _concatenate_prompts([data for data, _, _ in chosen])
                    async with self._model_lock:
                        outputs = await asyncio.to_thread(
                            sample, self.model, self.tokenizer, merged, self.cfg, greedy
                        )
                except Exception as error:  # every waiting request gets the error
                    for _, _, future in chosen:
                        future.set_exception(error)
                    continue
                self.batch_sizes.append(int(merged["input_ids"].shape[0]))
                start = 0
                for data, _, future in chosen:
                    rows = int(data["input_ids"].shape[0])
                    future.set_result(outputs.slice(start, start + rows))
                    start += rows

    async def load_weights(self, state_dict: dict[str, torch.Tensor]) -> bool:
        async with self._model_lock:
            self.model.load_state_dict(state_dict)
            self.refits += 1
        return True

    async def sample_texts(
        self, prompts: list[str], samples: int, seed: int, sampler: dict[str, Any]
    ) -> list:
        async with self._model_lock:
            return await asyncio.to_thread(
                sample_with_own_seed,
                self.model,
                self.tokenizer,
                seed,
                prompts=prompts,
                samples=samples,
                **sampler,
            )

    def weights(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def refit_count(self) -> int:
        return self.refits

    def sampled_batch_sizes(self) -> list[int]:
        return list(self.batch_sizes)


class SeparateCPUGeneration(DriverSideEngine):
    """A separate engine: a CPU Ray actor with its own copy of the weights, refit from the
    policy after every optimizer step, as NeMo-RL's non-colocated vLLM is. NeMo-RL's
    ``async_grpo_train`` needs this layout: its trajectory collector (a Ray actor) holds a
    copy of this object and samples through the actor while the driver trains.

    A refit sends the policy's ``state_dict`` through Ray's object store
    (``update_weights_from_collective``, where vLLM receives an NCCL broadcast). The returned
    ``logprobs`` are the engine's, computed with the weights that sampled the tokens.

    Args:
        options: Ray actor options for the engine (for example a custom resource that places
            it on another node).
    """

    def __init__(
        self,
        policy: CPUPolicy,
        generation_config: dict[str, Any],
        seed: int,
        options: dict[str, Any] | None = None,
    ) -> None:
        import ray

        self.policy: CPUPolicy | None = policy
        self.cfg = generation_config
        actor = ray.remote(num_cpus=0)(GenerationWorker)
        if options:
            actor = actor.options(**options)
        # Ray pickles the arguments when the call is submitted: the actor gets its own copy
        self.worker = actor.remote(policy.model, policy.tokenizer, generation_config, seed)

    def __getstate__(self) -> dict[str, Any]:
        # the collector's copy samples through the actor; weights come from the driver's policy
        return {**self.__dict__, "policy": None}

    def generate(self, data: Any, greedy: bool = False) -> Any:
        import ray

        return ray.get(self.worker.generate.remote(data, greedy))

    async def generate_async(self, data: Any, greedy: bool = False) -> Any:
        outputs = await self.worker.generate.remote(data, greedy)
        for item in _rows(outputs):
            yield item

    def _send_weights(self) -> list:
        if self.policy is None:
            raise RuntimeError(
                "a refit must be started from the driver's generation object (it holds the policy)"
            )
        # serialised when the call is submitted, so later optimizer steps do not reach it
        return [self.worker.load_weights.remote(self.policy.model.state_dict())]

    def update_weights_from_collective(self, *args: Any, **kwargs: Any) -> list:
        return self._send_weights()

    def update_weights_via_ipc_zmq(self, *args: Any, **kwargs: Any) -> list:
        return self._send_weights()

    def sample_texts(self, prompts: list[str], samples: int, seed: int, **sampler: Any) -> list:
        """As :meth:`CPUGeneration.sample_texts`, on the engine's own weights."""
        import ray

        return ray.get(self.worker.sample_texts.remote(prompts, samples, seed, sampler))

    def weights(self) -> dict[str, torch.Tensor]:
        import ray

        return ray.get(self.worker.weights.remote())

    def refit_count(self) -> int:
        import ray

        return ray.get(self.worker.refit_count.remote())

    def sampled_batch_sizes(self) -> list[int]:
        """Rows of each batch the engine sampled (requests that arrived together)."""
        import ray

        return ray.get(self.worker.sampled_batch_sizes.remote())

    def shutdown(self) -> bool:
        """Stop the engine's actor (NeMo-RL's async trainer calls this, and so does our driver).
        Idempotent."""
        import ray

        if self.worker is not None:
            ray.kill(self.worker)
            self.worker = None
        return True
