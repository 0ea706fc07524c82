"""The CPU policy: NeMo-RL's ``ColocatablePolicyInterface`` on one ``transformers`` causal LM.

NeMo-RL's ``grpo_train`` drives a policy that normally lives in GPU Ray workers
(Megatron/DTensor): log-probabilities, training with the loss it is given, checkpoints, weight
refits. :class:`CPUPolicy` does that in the driver process, subclassing NeMo-RL's own abstract
interface, so a method NeMo-RL adds to it fails at construction (``TypeError``), not mid-run.

Conventions are NeMo-RL's: ``logprobs[:, t]`` is ``log p(token_t | tokens_<t)`` with column 0
zero; the loss gets next-token log-probabilities ``[rows, seq_len - 1]``; losses over the
micro-batches of one global batch are normalised by that batch's valid sequences and tokens;
log-probabilities use the generation temperature (as NeMo-RL's workers do, to match vLLM).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from nemo_rl.distributed.batched_data_dict import BatchedDataDict
from nemo_rl.models.policy.interfaces import ColocatablePolicyInterface

from nemo_mmpo.cpu.answers import vllm_refit
from nemo_mmpo.cpu.engines.sampling import token_logprobs


class SingleRank:
    """A policy's sharding: one rank on every axis (data parallel size 1)."""

    def get_axis_size(self, name: str) -> int:
        return 1


class DriverSidePolicy(ColocatablePolicyInterface):
    """NeMo-RL's policy interface with what GPU workers do around training (placement,
    offloading, weight streaming, asynchronous saves, FP8 calibration) as no-ops, for a policy
    driven from the driver process; the reference policy's log-probs are the policy's.
    Subclasses implement ``get_logprobs``, ``train`` and ``save_checkpoint``."""

    sharding_annotations = SingleRank()

    def get_reference_policy_logprobs(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        """The reference policy is the policy (no KL term is computed against another)."""
        return BatchedDataDict({"reference_logprobs": self.get_logprobs(data)["logprobs"]})

    def get_topk_logits(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("a driver-side policy serves no top-k logits (distillation)")

    def prepare_for_training(self, *args: Any, **kwargs: Any) -> None:
        return None

    def prepare_for_lp_inference(self, *args: Any, **kwargs: Any) -> None:
        return None

    def finish_training(self, *args: Any, **kwargs: Any) -> None:
        return None

    def finalize_async_save(self) -> None:
        return None

    def calibrate_qkv_fp8_scales(self, *args: Any, **kwargs: Any) -> dict:
        return {}

    def init_collective(self, *args: Any, **kwargs: Any) -> list:
        return []

    def offload_before_refit(self) -> None:
        return None

    def offload_after_refit(self) -> None:
        return None

    def prepare_refit_info(self) -> dict[str, Any] | None:
        return None

    def get_free_memory_bytes(self) -> int:
        return 1 << 40

    def stream_weights_via_ipc_zmq(self, *args: Any, **kwargs: Any) -> list:
        return []  # a colocated engine shares this model; a separate one is sent the weights

    def broadcast_weights_for_collective(self, *args: Any, **kwargs: Any) -> list:
        return []

    def invalidate_kv_cache(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def shutdown(self) -> bool:
        return True


class CPUPolicy(DriverSidePolicy):
    """The policy in the driver process: AdamW, gradient clipping, Hugging Face checkpoints.

    Args:
        model: a causal LM (float32); trained in place.
        tokenizer: saved beside the weights, so checkpoints are complete HF directories.
        policy_config: NeMo-RL's ``policy`` section (batch sizes, ``max_grad_norm``,
            ``generation.temperature``) with ``optimizer.kwargs.lr``.
    """

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
        #: The :class:`~nemo_mmpo.cpu.answers.vllm_refit.WeightMailbox` when the engine is NeMo-RL's
        #: vLLM generation: refits publish the weights there, through Ray's object store.
        self.weight_mailbox: Any = None

    # --- refit: NeMo-RL's calls; the weights go through Ray's object store ----------------
    def prepare_refit_info(self) -> dict[str, Any]:
        """``{name: (shape, dtype)}`` of the weights a refit sends (NeMo-RL's format)."""
        return {
            name: (tuple(tensor.shape), tensor.dtype)
            for name, tensor in self.model.state_dict().items()
        }

    def stream_weights_via_ipc_zmq(self, *args: Any, **kwargs: Any) -> list:
        """Colocated refit: publish the weights (a vLLM engine), or nothing (an engine on
        this model)."""
        if self.weight_mailbox is None:
            return []
        return vllm_refit.publish(self.model, self.weight_mailbox)

    def broadcast_weights_for_collective(self, *args: Any, **kwargs: Any) -> list:
        """Non-colocated refit (NCCL on a GPU node): the same publication."""
        return self.stream_weights_via_ipc_zmq()

    # --- log-probabilities -----------------------------------------------------------------
    def get_logprobs(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        with torch.no_grad():
            values = token_logprobs(
                self.model, data["input_ids"], data["input_lengths"], self.temperature
            )
        return BatchedDataDict({"logprobs": values})

    # --- training --------------------------------------------------------------------------
    def train(
        self,
        data: Any,
        loss_fn: Any,
        eval_mode: bool = False,
        *,
        gbs: int | None = None,
        mbs: int | None = None,
        timer: Any = None,
        **kwargs: Any,
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

    # --- checkpoints -----------------------------------------------------------------------
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
