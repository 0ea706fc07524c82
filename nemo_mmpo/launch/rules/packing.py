"""Rules on NeMo-RL's Megatron data path: the padding its fused packed loss needs, and the
temperature its forward step applies at every pipeline stage."""

from __future__ import annotations

from typing import Any

from nemo_mmpo.checkout import find_nemo_rl_root
from nemo_mmpo.launch.rules.registry import Findings, rule
from nemo_mmpo.nemo_rl import versions
from nemo_mmpo.sections import value


def _packed_row_padding(config: dict[str, Any]) -> list[str]:
    """The Megatron settings under which NeMo-RL's packer pads a packed row beyond its
    sequences' own padding, as ``key=value`` (``_get_pack_sequence_parameters_for_megatron``:
    pipeline parallel pads to the longest micro-batch, FP8 and HybridEP token dispatch to a
    multiple of 16 to 128 tokens)."""
    megatron = "policy.megatron_cfg"
    causes = []
    stages = value(config, f"{megatron}.pipeline_model_parallel_size", 1)
    if isinstance(stages, int) and stages > 1:
        causes.append(f"{megatron}.pipeline_model_parallel_size={stages}")
    if value(config, f"{megatron}.fp8_cfg.enabled", False):
        causes.append(f"{megatron}.fp8_cfg.enabled=true")
    dispatcher = value(config, f"{megatron}.moe_token_dispatcher_type")
    backend = value(config, f"{megatron}.moe_flex_dispatcher_backend")
    if dispatcher == "flex" and backend == "hybridep":
        causes.append(
            f"{megatron}.moe_token_dispatcher_type=flex with "
            f"{megatron}.moe_flex_dispatcher_backend=hybridep"
        )
    return causes


@rule
def fused_sequence_packing(config: dict[str, Any], findings: Findings) -> None:
    """``policy.sequence_packing.fuse_loss: true`` with a padded packed row (pipeline parallel,
    FP8, HybridEP) is refused on a NeMo-RL whose fused loss overruns the rows (v0.7.0)."""
    if not (
        value(config, "policy.megatron_cfg.enabled", False)
        and value(config, "policy.sequence_packing.enabled", False)
        and value(config, "policy.sequence_packing.fuse_loss", False)
    ):
        return
    causes = _packed_row_padding(config)
    root = find_nemo_rl_root()
    if not causes or root is None or not versions.fused_packing_overruns_rows(root):
        return
    findings.errors.append(
        f"policy.sequence_packing.fuse_loss=true with {' and '.join(causes)}: NeMo-RL pads "
        "each packed micro-batch (to the longest micro-batch under pipeline parallel, to a "
        "multiple of 16 to 128 tokens under FP8 or HybridEP) into its last sequence, and the "
        f"fused loss of the NeMo-RL at {root} (v0.7.0's _pack_input_ids) copies that padded "
        "length out of the batch's rows: a RuntimeError (shape mismatch) whenever it is longer "
        "than the rows. Set policy.sequence_packing.fuse_loss=false (the per-sequence loss "
        "wrapper: same loss and gradient), or use a NeMo-RL whose _pack_input_ids clamps the "
        "copy to the row (main does)"
    )


def _megatron_trains(config: dict[str, Any]) -> bool:
    """Whether NeMo-RL's Megatron path trains: its GPU workers, or the CPU rig's Megatron
    policy (the rig's own policy reads no ``megatron_cfg``)."""
    cpu = value(config, "cpu_backend") or {}
    if cpu.get("enabled"):
        return cpu.get("policy") == "megatron"
    return bool(value(config, "policy.megatron_cfg.enabled", False))


@rule
def pipeline_temperature(config: dict[str, Any], findings: Findings) -> None:
    """Pipeline parallel with a sampler temperature other than 1, on a NeMo-RL whose Megatron
    forward step divides every stage's output (the hidden state between stages too) by it."""
    stages = value(config, "policy.megatron_cfg.pipeline_model_parallel_size", 1)
    temperature = value(config, "policy.generation.temperature", 1.0)
    if not _megatron_trains(config) or not isinstance(stages, int) or stages < 2:
        return
    if temperature is None or float(temperature) == 1.0:
        return
    root = find_nemo_rl_root()
    if root is None or not versions.pipeline_stages_divided_by_temperature(root):
        return
    findings.warnings.append(
        f"policy.megatron_cfg.pipeline_model_parallel_size={stages} with "
        f"policy.generation.temperature={temperature}: the Megatron forward step of the NeMo-RL "
        f"at {root} (forward_with_post_processing_fn) divides every pipeline stage's output by "
        "the temperature, the hidden state handed to the next stage too, so the log-probs and "
        "the loss are not those of the model vLLM samples from (token_mult_prob_error off 1). "
        "Use policy.generation.temperature=1.0 (the paper's) or pipeline_model_parallel_size=1"
    )
