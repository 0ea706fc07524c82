"""CPU policy and generation for NeMo-RL's GRPO loop, around one small ``transformers`` model.

NeMo-RL's ``grpo_train`` drives a policy (log-probabilities, training with the loss it is
given, checkpoints) and a generation engine (sampling, weight refits) that normally live in
GPU Ray workers (Megatron/DTensor, vLLM). These classes implement the methods ``grpo_train``
and ``async_grpo_train`` call on them, on one causal LM, so that NeMo-RL's own loop (data
processing, environment, advantages, loss, logging, checkpointing) runs on a laptop:

- ``CPUPolicy``: the policy, in the driver process;
- ``CPUGeneration``: sampling on the policy's own model (colocated; a refit is a no-op);
- ``SeparateCPUGeneration``: sampling in a CPU Ray actor with its own copy of the weights,
  refit from the policy (non-colocated, the layout NeMo-RL's async trainer needs).

Conventions are NeMo-RL's: ``logprobs[:, t]`` is ``log p(token_t | tokens_<t)`` with column 0
zero; the loss gets next-token log-probabilities ``[rows, seq_len - 1]``; losses over the
micro-batches of one global batch are normalised by that batch's valid sequences and tokens;
log-probabilities use the generation temperature (as NeMo-RL's workers do, to match vLLM).

The one-command run around them is :mod:`nemo_mmpo.nemo_rl.tiny_cpu`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import torch


def _batched(data: dict[str, Any]) -> Any:
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict

    return BatchedDataDict(data)


def token_logprobs(
    model: Any, input_ids: torch.Tensor, lengths: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """``[rows, seq_len]``: ``log p(token_t | tokens_<t)`` at ``t >= 1`` (0 at 0 and padding)."""
    positions = torch.arange(input_ids.shape[1])
    attention = (positions[None, :] < lengths[:, None]).long()
    logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    picked = logprobs.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    picked = picked * attention[:, 1:]
    return torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)


class SingleRank:
    """A policy's sharding: one rank on every axis (data parallel size 1)."""

    def get_axis_size(self, name: str) -> int:
        return 1


class PolicyLifecycle:
    """The policy calls ``grpo_train`` makes for GPU workers (placement, offloading, weight
    streaming, asynchronous saves), as no-ops for a policy that lives in the driver process."""

    sharding_annotations = SingleRank()

    def finalize_async_save(self) -> None:
        return None

    def prepare_for_training(self, *args: Any, **kwargs: Any) -> None:
        return None

    def prepare_for_lp_inference(self, *args: Any, **kwargs: Any) -> None:
        return None

    def finish_training(self, *args: Any, **kwargs: Any) -> None:
        return None

    def offload_before_refit(self) -> None:
        return None

    def offload_after_refit(self) -> None:
        return None

    def get_free_memory_bytes(self) -> int:
        return 1 << 40

    def stream_weights_via_ipc_zmq(self, *args: Any, **kwargs: Any) -> list:
        return []  # the generation engine shares this model: nothing to send

    def broadcast_weights_for_collective(self, *args: Any, **kwargs: Any) -> list:
        return []

    def invalidate_kv_cache(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def shutdown(self) -> bool:
        return True


class GenerationLifecycle:
    """The generation calls ``grpo_train`` makes for vLLM workers (refits, KV cache, metrics),
    as no-ops for an engine in the driver process that shares the policy's weights."""

    def prepare_for_generation(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def finish_generation(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def update_weights_via_ipc_zmq(self, *args: Any, **kwargs: Any) -> list:
        return []  # shares the policy's model

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


class CPUPolicy(PolicyLifecycle):
    """NeMo-RL's policy interface on one ``transformers`` causal LM (AdamW, grad clipping)."""

    def __init__(self, model: Any, tokenizer: Any, policy_config: dict[str, Any]) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.cfg = policy_config
        optimizer = (policy_config.get("optimizer") or {}).get("kwargs", {})
        self.optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=float(optimizer.get("lr", 1e-4)),
            weight_decay=float(optimizer.get("weight_decay", 0.0)),
        )
        self.temperature = float((policy_config.get("generation") or {}).get("temperature", 1.0))
        self.steps = 0

    # --- log-probabilities -------------------------------------------------------------
    def get_logprobs(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        with torch.no_grad():
            values = token_logprobs(
                self.model, data["input_ids"], data["input_lengths"], self.temperature
            )
        return _batched({"logprobs": values})

    def get_reference_policy_logprobs(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        return _batched({"reference_logprobs": self.get_logprobs(data)["logprobs"]})

    # --- training ----------------------------------------------------------------------
    def train(
        self,
        data: Any,
        loss_fn: Any,
        eval_mode: bool = False,
        *,
        gbs: int | None = None,
        mbs: int | None = None,
        timer: Any = None,
    ) -> dict[str, Any]:
        global_batch = gbs or self.cfg["train_global_batch_size"]
        micro_batch = mbs or self.cfg["train_micro_batch_size"]
        max_grad_norm = self.cfg.get("max_grad_norm")
        losses, norms = [], []
        metrics: dict[str, list] = {}
        self.model.train(not eval_mode)
        for start in range(0, data.size, global_batch):
            batch = data.slice(start, min(start + global_batch, data.size))
            sample_mask = batch["sample_mask"]
            global_valid_seqs = sample_mask.sum()
            global_valid_toks = (batch["token_mask"][:, 1:] * sample_mask[:, None]).sum()
            self.optimizer.zero_grad(set_to_none=True)
            total = torch.zeros(())
            for micro_start in range(0, batch.size, micro_batch):
                piece = batch.slice(micro_start, min(micro_start + micro_batch, batch.size))
                current = token_logprobs(
                    self.model, piece["input_ids"], piece["input_lengths"], self.temperature
                )[:, 1:]
                loss, piece_metrics = loss_fn(current, piece, global_valid_seqs, global_valid_toks)
                if not eval_mode:
                    loss.backward()
                total = total + loss.detach()
                for key, value in piece_metrics.items():
                    metrics.setdefault(key, []).append(value)
                metrics.setdefault("global_valid_seqs", []).append(float(global_valid_seqs))
                metrics.setdefault("global_valid_toks", []).append(float(global_valid_toks))
                metrics.setdefault("lr", []).append(self.optimizer.param_groups[0]["lr"])
            if eval_mode:
                norms.append(torch.zeros(()))
            else:
                parameters = [p for p in self.model.parameters() if p.grad is not None]
                norm = torch.nn.utils.clip_grad_norm_(
                    parameters, max_grad_norm if max_grad_norm else float("inf")
                )
                self.optimizer.step()
                self.steps += 1
                norms.append(norm.detach())
            losses.append(total)
        self.model.eval()
        return {
            "loss": torch.stack(losses),
            "grad_norm": torch.stack(norms),
            "all_mb_metrics": metrics,
        }

    # --- checkpoints ----------------------------------------------------------------------
    def save_checkpoint(
        self,
        weights_path: str,
        optimizer_path: str | None = None,
        tokenizer_path: str | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        self.model.save_pretrained(weights_path)
        self.tokenizer.save_pretrained(weights_path)  # a complete HF checkpoint for evaluation
        if optimizer_path is not None:
            Path(optimizer_path).mkdir(parents=True, exist_ok=True)
            state = {"optimizer": self.optimizer.state_dict(), "steps": self.steps}
            torch.save(state, Path(optimizer_path) / "optimizer.pt")
        if tokenizer_path is not None:
            self.tokenizer.save_pretrained(tokenizer_path)

    def load_optimizer(self, optimizer_path: str | Path) -> None:
        state = torch.load(Path(optimizer_path) / "optimizer.pt", weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state["steps"])


def sample(
    model: Any,
    tokenizer: Any,
    data: Any,
    generation_config: dict[str, Any],
    logprob_temperature: float,
    greedy: bool = False,
) -> Any:
    """NeMo-RL's generation output for ``data`` (``input_ids``, ``input_lengths``), sampled with
    ``model.generate``: ``output_ids`` (prompt + response, right-padded), the response tokens'
    ``logprobs`` at ``logprob_temperature``, ``generation_lengths``, ``unpadded_sequence_lengths``.

    Settings from ``policy.generation``: ``temperature`` (0: greedy), ``top_p``,
    ``max_new_tokens``; sampling draws from torch's global RNG (seeded by the driver).
    """
    input_ids, input_lengths = data["input_ids"], data["input_lengths"]
    rows = input_ids.shape[0]
    width = int(input_lengths.max())
    pad = tokenizer.pad_token_id
    left = torch.full((rows, width), pad, dtype=torch.long)
    for row in range(rows):  # generate() wants left padding
        length = int(input_lengths[row])
        left[row, width - length :] = input_ids[row, :length]
    attention = (torch.arange(width)[None, :] >= (width - input_lengths)[:, None]).long()
    temperature = float(generation_config.get("temperature", 1.0))
    options: dict[str, Any] = {"max_new_tokens": int(generation_config["max_new_tokens"])}
    if greedy or temperature == 0:
        options["do_sample"] = False
    else:
        options.update(
            do_sample=True,
            temperature=temperature,
            top_p=float(generation_config.get("top_p") or 1.0),
            top_k=0,
        )
    with torch.no_grad():
        output = model.generate(
            input_ids=left,
            attention_mask=attention,
            pad_token_id=pad,
            eos_token_id=tokenizer.eos_token_id,
            **options,
        )
    new = output[:, width:]
    lengths = []
    for row in range(rows):
        tokens = new[row].tolist()
        end = len(tokens)
        if tokenizer.eos_token_id in tokens:
            end = tokens.index(tokenizer.eos_token_id) + 1
        lengths.append(end)
    total = int(input_lengths.max()) + max(max(lengths), 1)
    output_ids = torch.full((rows, total), pad, dtype=torch.long)
    for row in range(rows):
        length = int(input_lengths[row])
        output_ids[row, :length] = input_ids[row, :length]
        output_ids[row, length : length + lengths[row]] = new[row, : lengths[row]]
    generation_lengths = torch.tensor(lengths)
    unpadded = input_lengths + generation_lengths
    with torch.no_grad():
        logprobs = token_logprobs(model, output_ids, unpadded, logprob_temperature)
    positions = torch.arange(total)
    response = (positions[None, :] >= input_lengths[:, None]) & (
        positions[None, :] < unpadded[:, None]
    )
    return _batched(
        {
            "output_ids": output_ids,
            "logprobs": logprobs * response,
            "generation_lengths": generation_lengths,
            "unpadded_sequence_lengths": unpadded,
        }
    )


def _rows(outputs: Any):
    """``(row, one-row batch)`` pairs, as vLLM's ``generate_async`` yields them."""
    for row in range(outputs["output_ids"].shape[0]):
        yield row, outputs.slice(row, row + 1)


class CPUGeneration(GenerationLifecycle):
    """NeMo-RL's generation interface: ``model.generate`` sampling on the policy's model
    (colocated, in the driver: a refit is a no-op).

    The returned ``logprobs`` are the policy's (same temperature) for the sampled tokens, so
    NeMo-RL's generation-vs-training error metrics read 1.0.
    """

    def __init__(self, policy: CPUPolicy, generation_config: dict[str, Any]) -> None:
        self.policy = policy
        self.cfg = generation_config

    def generate(self, data: Any, greedy: bool = False) -> Any:
        return sample(
            self.policy.model,
            self.policy.tokenizer,
            data,
            self.cfg,
            self.policy.temperature,
            greedy,
        )

    async def generate_async(self, data: Any, greedy: bool = False) -> Any:
        for item in _rows(self.generate(data, greedy)):
            yield item


def _concatenate_prompts(batches: list[Any]) -> Any:
    """One ``input_ids``/``input_lengths`` batch from several, right-padded to the widest."""
    width = max(int(batch["input_ids"].shape[1]) for batch in batches)
    rows = []
    for batch in batches:
        ids = batch["input_ids"]
        padding = torch.zeros((ids.shape[0], width - ids.shape[1]), dtype=ids.dtype)
        rows.append(torch.cat([ids, padding], dim=1))
    return _batched(
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
        self,
        model: Any,
        tokenizer: Any,
        generation_config: dict[str, Any],
        logprob_temperature: float,
        seed: int,
    ) -> None:
        torch.manual_seed(seed)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.cfg = generation_config
        self.logprob_temperature = logprob_temperature
        self.refits = 0
        self.batch_sizes: list[int] = []
        self._pending: list[tuple[Any, bool, Any]] = []
        self._batcher: Any = None
        self._model_lock = asyncio.Lock()  # binds to the actor's loop at first use

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
                            sample,
                            self.model,
                            self.tokenizer,
                            merged,
                            self.cfg,
                            self.logprob_temperature,
                            greedy,
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

    def weights(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def refit_count(self) -> int:
        return self.refits

    def sampled_batch_sizes(self) -> list[int]:
        return list(self.batch_sizes)


class SeparateCPUGeneration(GenerationLifecycle):
    """NeMo-RL's generation interface on a separate engine: a CPU Ray actor with its own copy
    of the weights, refit from the policy after every optimizer step, as NeMo-RL's
    non-colocated vLLM is. NeMo-RL's ``async_grpo_train`` needs this layout: its trajectory
    collector (a Ray actor) holds a copy of this object and samples through the actor while the
    driver trains.

    A refit sends the policy's ``state_dict`` through Ray's object store
    (``update_weights_from_collective``, where vLLM receives an NCCL broadcast). The returned
    ``logprobs`` are the engine's, computed with the weights that sampled the tokens.
    """

    def __init__(self, policy: CPUPolicy, generation_config: dict[str, Any], seed: int) -> None:
        import ray

        self.policy: CPUPolicy | None = policy
        self.cfg = generation_config
        actor = ray.remote(num_cpus=0)(GenerationWorker)
        self.worker = actor.remote(  # Ray pickles the arguments: the actor gets its own copy
            policy.model,
            policy.tokenizer,
            generation_config,
            policy.temperature,
            seed,
        )

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
        """Stop the engine's actor (NeMo-RL's async trainer calls this, and so does our driver)."""
        import ray

        if self.worker is not None:
            ray.kill(self.worker)
            self.worker = None
        return True
