"""Rules on the cluster and the parallel layout that the plan, and NeMo-RL's setup, divide by."""

from __future__ import annotations

from typing import Any

from nemo_mmpo.launch.rules.registry import Findings, rule
from nemo_mmpo.sections import value


def _is_count(number: Any) -> bool:
    return isinstance(number, int) and not isinstance(number, bool) and number >= 1


def layout_keys(config: dict[str, Any]) -> list[str]:
    """The keys of the training backend's parallel sizes: Megatron's tensor, pipeline and
    context; DTensor's tensor and context (it has no pipeline parallel)."""
    if value(config, "policy.megatron_cfg.enabled", False):
        megatron = "policy.megatron_cfg"
        return [
            f"{megatron}.tensor_model_parallel_size",
            f"{megatron}.pipeline_model_parallel_size",
            f"{megatron}.context_parallel_size",
        ]
    dtensor = "policy.dtensor_cfg"
    return [f"{dtensor}.tensor_parallel_size", f"{dtensor}.context_parallel_size"]


def counts_problems(
    config: dict[str, Any], keys: list[str], optional: tuple[str, ...] = ()
) -> list[str]:
    """``key=value: give an integer >= 1`` for each of ``keys`` that is set and is not one
    (those in ``optional`` may also be null)."""
    problems = []
    for key in keys:
        number = value(config, key, 1)
        if number is None and key in optional:
            continue
        if not _is_count(number):
            problems.append(f"{key}={number!r}: give an integer >= 1")
    return problems


@rule
def parallel_layout(config: dict[str, Any], findings: Findings) -> None:
    """The cluster, the batch sizes and the training backend's parallel sizes are integers
    >= 1, and the training GPUs are a multiple of tensor x pipeline x context parallel (what
    NeMo-RL's workers assert at setup, after the job waited in the queue)."""
    sizes = layout_keys(config)
    keys = [
        "policy.train_global_batch_size",
        "policy.train_micro_batch_size",
        "policy.generation.vllm_cfg.tensor_parallel_size",
        *sizes,
    ]
    cpu = bool(value(config, "cpu_backend.enabled", False))
    separate = not cpu and not value(config, "policy.generation.colocated.enabled", True)
    resources = "policy.generation.colocated.resources"
    if not cpu:
        keys = ["cluster.num_nodes", "cluster.gpus_per_node", *keys]
    if separate:
        keys += [f"{resources}.num_nodes", f"{resources}.gpus_per_node"]
    problems = counts_problems(config, keys, optional=(f"{resources}.num_nodes",))
    if problems:
        findings.errors.extend(problems)
        return
    if cpu:
        return  # the CPU rig's own layout rule (cpu_backend) divides its ranks
    gpus = value(config, "cluster.num_nodes", 1) * value(config, "cluster.gpus_per_node", 1)
    training = gpus
    if separate:
        generation = (value(config, f"{resources}.num_nodes") or 1) * value(
            config, f"{resources}.gpus_per_node", 1
        )
        training = gpus - generation
        if training < 1:
            findings.errors.append(
                f"{resources} takes {generation} of the cluster's {gpus} GPU(s) for generation, "
                "leaving none to train: raise cluster.num_nodes or cluster.gpus_per_node"
            )
            return
    model_parallel = 1
    for key in sizes:
        model_parallel *= value(config, key, 1)
    if training % model_parallel:
        findings.errors.append(
            f"{training} training GPU(s) is not a multiple of tensor x pipeline x context "
            f"parallel = {' x '.join(f'{key}={value(config, key, 1)}' for key in sizes)} = "
            f"{model_parallel}: change those sizes or cluster.num_nodes/cluster.gpus_per_node"
        )
