"""NeMo-RL's ``MegatronPolicyWorker`` (no Ray) on one GPU: log-probs, then bf16 train steps
with ``loss_fn.name: mmpo`` and with NeMo-RL's ``clipped_pg``; write JSON.

The GPU check's worker part (``benchmarks/gpu_check.sh``). One process is rank 0 of a
world of one (NCCL). The worker is NeMo-RL's own class (``MegatronPolicyWorkerImpl``, the
class ``@ray.remote`` wraps) built from the paper recipe's ``policy`` section
(``examples/configs/mmpo_math_qwen3_1.7b.yaml``, bf16, activation checkpointing) with
these changes, each printed: the model is a tiny Llama built from a config and written as a
Hugging Face folder (no hub), which NeMo-RL imports through Megatron-Bridge's ``AutoBridge``
into a Megatron checkpoint; batch and sequence sizes fit it; ``train_iters`` is set (as
``grpo.py:823`` does); and, because Transformer Engine and Apex are absent on the machine,
Megatron-Bridge's local layer spec (``gpt_provider.local_layer_spec``), no sequence packing
(THD input needs TE's attention), no precision-aware optimizer (TE's FusedAdam), and the TE-
and Apex-only fusions off (RoPE, MoE permutation, masked softmax, persistent layer norm,
gradient accumulation). Each of these stopped a CPU rehearsal of this script until changed.
``benchmarks/gpu_standins.py`` says what stands in for absent packages.

Steps: ``get_logprobs`` on a batch (compared with a float32 ``transformers`` forward of the
same weights: the bf16 gap is reported, not asserted), then train steps on that batch
(on-policy: ``prev_logprobs`` are the worker's own), alternating ``clipped_pg`` and ``mmpo``
(the first of each is the warm-up), each with loss, grad norm and seconds.

Usage: ``python benchmarks/gpu_worker_step.py --work DIR --out result.json [--steps 3]``
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_standins

RECIPE = Path(__file__).resolve().parents[1] / "examples/configs/mmpo_math_qwen3_1.7b.yaml"
BATCH, LENGTH, PROMPT = 8, 64, 16


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def single_rank_environment(work: Path) -> None:
    """What NeMo-RL's Ray worker group sets for a rank, for a world of one."""
    os.environ.update(
        {
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "NRL_MEGATRON_CHECKPOINT_DIR": str(work / "megatron-import"),
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )


def write_tiny_model(folder: Path) -> Any:
    """The tiny Llama and its character tokenizer as a Hugging Face folder; the model."""
    from nemo_mmpo.cpu.rig.model import ModelShape, char_tokenizer, tiny_llama

    tokenizer = char_tokenizer()
    model = tiny_llama(tokenizer, ModelShape(hidden_size=128, num_layers=2, num_heads=4), 0)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


def policy_config(folder: Path) -> tuple[dict[str, Any], list[str]]:
    """The paper recipe's ``policy`` section for the tiny model, and the changes made."""
    from nemo_mmpo import recipes

    policy = recipes.load(RECIPE).config["policy"]
    megatron = policy["megatron_cfg"]
    changes = {
        "model_name": str(folder),
        "tokenizer.name": str(folder),
        "train_global_batch_size": BATCH,
        "train_micro_batch_size": 2,
        "logprob_batch_size": 2,
        "max_total_sequence_length": LENGTH,
        "sequence_packing.enabled": False,  # THD (packed) input needs TE's attention
        "dynamic_batching.enabled": False,
        "megatron_cfg.apply_rope_fusion": False,  # TE's fused RoPE
        "megatron_cfg.gradient_accumulation_fusion": False,  # TE's / Apex's wgrad kernel
        "megatron_cfg.moe_permute_fusion": False,  # TE's (a dense model: unused, validated)
        "megatron_cfg.optimizer.use_precision_aware_optimizer": False,  # TE's FusedAdam
        "megatron_cfg.train_iters": 1000,  # grpo.py:823 sets it from the run's length
        "megatron_cfg.optimizer.lr": 1e-3,  # one step shows in bf16 weights
        "megatron_cfg.optimizer.min_lr": 1e-3,
        "megatron_cfg.scheduler.lr_warmup_init": 1e-3,
    }
    for dotted, value in changes.items():
        *parents, key = dotted.split(".")
        section = policy
        for parent in parents:
            section = section[parent]
        section[key] = value
    assert megatron["enabled"] and policy["precision"] == "bfloat16", policy["precision"]
    return policy, [f"policy.{key}={value}" for key, value in changes.items()]


def local_spec_worker_class() -> type:
    """NeMo-RL's worker class with Megatron-Bridge's local layer spec for the HF import
    (``megatron_policy_worker.py``'s ``_transformer_layer_spec`` hook) and the TE fusions off
    on the provider the import saves (its ``run_config.yaml`` then builds the trained model)."""
    from megatron.bridge.models import gpt_provider
    from megatron.bridge.models.conversion.auto_bridge import AutoBridge
    from nemo_rl.models.policy.workers.megatron_policy_worker import MegatronPolicyWorkerImpl

    to_provider = AutoBridge.to_megatron_provider

    def local_provider(self: Any, *args: Any, **kwargs: Any) -> Any:
        provider = to_provider(self, *args, **kwargs)
        provider.transformer_layer_spec = gpt_provider.local_layer_spec
        provider.masked_softmax_fusion = False  # megatron's fused softmax kernels are not built
        provider.persist_layer_norm = False  # Apex's; torch_norm.py:48 refuses it
        provider.apply_rope_fusion = False
        provider.gradient_accumulation_fusion = False
        return provider

    AutoBridge.to_megatron_provider = local_provider

    class LocalSpecMegatronPolicyWorker(MegatronPolicyWorkerImpl):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._transformer_layer_spec = gpt_provider.local_layer_spec
            super().__init__(*args, **kwargs)

    return LocalSpecMegatronPolicyWorker


def make_batch(vocab: int, seed: int = 0) -> Any:
    """``BATCH`` right-padded sequences: ``PROMPT`` prompt tokens then a response."""
    import torch
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict

    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(LENGTH // 2, LENGTH + 1, (BATCH,), generator=generator)
    input_ids = torch.randint(3, vocab, (BATCH, LENGTH), generator=generator)
    positions = torch.arange(LENGTH).expand(BATCH, LENGTH)
    input_ids[positions >= lengths[:, None]] = 0
    token_mask = ((positions >= PROMPT) & (positions < lengths[:, None])).float()
    rewards = (torch.rand(BATCH, generator=generator) < 0.5).float()
    advantages = (rewards - rewards.mean())[:, None].expand(BATCH, LENGTH).contiguous()
    return BatchedDataDict(
        {
            "input_ids": input_ids,
            "input_lengths": lengths,
            "advantages": advantages,
            "token_mask": token_mask,
            "sample_mask": torch.ones(BATCH),
        }
    )


def hf_logprobs(model: Any, data: Any) -> Any:
    """A float32 ``transformers`` forward of the same weights, NeMo-RL's layout (position 0
    is 0, position i holds log p(token i | tokens < i))."""
    import torch

    model = model.float().cuda().eval()
    ids = data["input_ids"].cuda()
    attention = torch.arange(ids.shape[1], device="cuda") < data["input_lengths"].cuda()[:, None]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention.long()).logits.float()
    picked = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    return torch.nn.functional.pad(picked, (1, 0))


def response_gap(worker_logprobs: Any, reference: Any, data: Any) -> float:
    """Largest |difference| over positions 1..length-1 of each sequence."""
    import torch

    positions = torch.arange(worker_logprobs.shape[1])
    valid = (positions >= 1) & (positions < data["input_lengths"][:, None])
    return (worker_logprobs - reference).abs()[valid].max().item()


def loss_functions() -> dict[str, Any]:
    from nemo_rl.algorithms.loss import ClippedPGLossConfig, ClippedPGLossFn

    from nemo_mmpo.nemo_rl.loss import MMPOClippedPGLossFn
    from nemo_mmpo.nemo_rl.paper_settings import PAPER_LOSS_SETTINGS

    config = ClippedPGLossConfig(name="mmpo", **PAPER_LOSS_SETTINGS)
    return {"clipped_pg": ClippedPGLossFn(config), "mmpo": MMPOClippedPGLossFn(config)}


def timed(function: Any) -> tuple[Any, float]:
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    value = function()
    torch.cuda.synchronize()
    return value, time.perf_counter() - start


def scalar(value: Any) -> float:
    import torch

    if isinstance(value, torch.Tensor):
        return float(value.float().mean())
    if isinstance(value, (list, tuple)):
        return float(statistics.fmean(scalar(item) for item in value))
    return float(value)


def run(work: Path, steps: int) -> dict[str, Any]:
    gpu_standins.install_import_answers()
    single_rank_environment(work)
    started = time.perf_counter()
    import numpy as np
    import torch

    gpu_standins.install_compile_helpers()
    from nemo_rl.distributed.named_sharding import NamedSharding
    from transformers import AutoTokenizer

    worker_class = local_spec_worker_class()
    imports = time.perf_counter() - started
    folder = work / "tiny-llama-hf"
    hf_model = write_tiny_model(folder)
    config, changes = policy_config(folder)
    print("policy from", RECIPE.name, "with", ", ".join(changes), flush=True)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    sharding = NamedSharding(
        layout=np.arange(1).reshape(1, 1, 1, 1),
        names=["pipeline_parallel", "data_parallel", "context_parallel", "tensor_parallel"],
    )
    worker, construct = timed(
        lambda: worker_class(
            config,
            tokenizer,
            init_optimizer=True,
            init_reference_model=False,
            worker_sharding_annotations=sharding,
        )
    )
    print(f"worker constructed in {construct:.1f} s (imports {imports:.1f} s)", flush=True)
    data = make_batch(len(tokenizer))
    logprobs, logprob_seconds = timed(lambda: worker.get_logprobs(data=data)["logprobs"])
    logprobs = logprobs.float().cpu()
    gap = response_gap(logprobs, hf_logprobs(hf_model, data).cpu(), data)
    print(f"get_logprobs {logprob_seconds:.3f} s; max |worker bf16 - HF fp32| = {gap:.3g}")
    for key in ("prev_logprobs", "generation_logprobs", "reference_policy_logprobs"):
        data[key] = logprobs.clone()
    losses = loss_functions()
    step_rows = []
    for step in range(steps):
        for name, loss_fn in losses.items():
            metrics, seconds = timed(lambda f=loss_fn: worker.train(data, f))
            row = {
                "step": step,
                "loss_fn": name,
                "seconds": seconds,
                "loss": scalar(metrics["global_loss"]),
                "grad_norm": scalar(metrics["grad_norm"]),
                "model_dtype": str(metrics["model_dtype"]),
                "metric_names": sorted(metrics["all_mb_metrics"]),
            }
            step_rows.append(row)
            print(json.dumps(row), flush=True)
    warm = {  # steps after each loss's first
        name: statistics.median(
            row["seconds"] for row in step_rows if row["loss_fn"] == name and row["step"]
        )
        for name in (losses if steps > 1 else ())
    }
    return {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "worker": f"{worker_class.__mro__[1].__module__}.{worker_class.__mro__[1].__name__}",
        "layer_spec": "megatron.bridge.models.gpt_provider.local_layer_spec",
        "policy_changes": changes,
        "seconds_imports": imports,
        "seconds_construct": construct,
        "seconds_get_logprobs": logprob_seconds,
        "max_abs_logprob_gap_vs_hf_fp32": gap,
        "train_steps": step_rows,
        "median_warm_step_seconds": warm,
        "ratio_mmpo_over_clipped_pg": (warm["mmpo"] / warm["clipped_pg"]) if warm else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="scratch folder")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--steps", type=int, default=3, help="train steps per loss")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    result = run(args.work, args.steps)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    import torch.distributed

    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
