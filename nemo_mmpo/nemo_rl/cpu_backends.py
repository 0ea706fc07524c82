"""CPU policy and generation for NeMo-RL's GRPO loop, around one small ``transformers`` model.

NeMo-RL's ``grpo_train`` drives a policy (log-probabilities, training with the loss it is
given, checkpoints) and a generation engine (sampling, weight refits) that normally live in
GPU Ray workers (Megatron/DTensor, vLLM). These two classes implement the methods
``grpo_train`` calls on them, in the driver process, on one causal LM, so that NeMo-RL's own
loop (data processing, environment, advantages, loss, logging, checkpointing) runs on a
laptop. Everything else stays NeMo-RL's; the generation engine shares the policy's model, so a
refit is a no-op.

Conventions are NeMo-RL's: ``logprobs[:, t]`` is ``log p(token_t | tokens_<t)`` with column 0
zero; the loss gets next-token log-probabilities ``[rows, seq_len - 1]``; losses over the
micro-batches of one global batch are normalised by that batch's valid sequences and tokens;
log-probabilities use the generation temperature (as NeMo-RL's workers do, to match vLLM).

The one-command run around them is :mod:`nemo_mmpo.nemo_rl.tiny_cpu`.
"""

from __future__ import annotations

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


class CPUGeneration(GenerationLifecycle):
    """NeMo-RL's generation interface: ``model.generate`` sampling on the policy's model.

    Settings from ``policy.generation``: ``temperature`` (0: greedy), ``top_p``,
    ``max_new_tokens``. The returned ``logprobs`` are the policy's (same temperature) for the
    sampled tokens, so NeMo-RL's generation-vs-training error metrics read 1.0.
    """

    def __init__(self, policy: CPUPolicy, generation_config: dict[str, Any]) -> None:
        self.policy = policy
        self.cfg = generation_config

    def generate(self, data: Any, greedy: bool = False) -> Any:
        model, tokenizer = self.policy.model, self.policy.tokenizer
        input_ids, input_lengths = data["input_ids"], data["input_lengths"]
        rows = input_ids.shape[0]
        width = int(input_lengths.max())
        pad = tokenizer.pad_token_id
        left = torch.full((rows, width), pad, dtype=torch.long)
        for row in range(rows):  # generate() wants left padding
            length = int(input_lengths[row])
            left[row, width - length :] = input_ids[row, :length]
        attention = (torch.arange(width)[None, :] >= (width - input_lengths)[:, None]).long()
        temperature = float(self.cfg.get("temperature", 1.0))
        options: dict[str, Any] = {"max_new_tokens": int(self.cfg["max_new_tokens"])}
        if greedy or temperature == 0:
            options["do_sample"] = False
        else:
            options.update(
                do_sample=True,
                temperature=temperature,
                top_p=float(self.cfg.get("top_p") or 1.0),
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
            logprobs = token_logprobs(model, output_ids, unpadded, self.policy.temperature)
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

    async def generate_async(self, data: Any, greedy: bool = False) -> Any:
        outputs = self.generate(data, greedy)
        for row in range(outputs["output_ids"].shape[0]):
            yield row, outputs.slice(row, row + 1)
