"""What ``--dry-run`` checks before anything is queued: rules that each return errors and warnings.

Each rule takes the resolved config (:class:`~nemo_mmpo.recipes.LoadedConfig`'s plain
dicts) and returns :class:`Findings`; :func:`check` runs every rule in :data:`RULES` and
collects all findings, so a recipe with three mistakes is told about all three. Settings
sections are read by their typed models (:mod:`nemo_mmpo.settings`), so a bad value is named
the same way everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_mmpo.checkout import REPO_ROOT, find_nemo_rl_root
from nemo_mmpo.cpu.rig_settings import TinySettings, unread_cpu_settings
from nemo_mmpo.data import BENCHMARKS
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.eval.protocol import read_settings, unread_evaluation_settings
from nemo_mmpo.nemo_rl import versions
from nemo_mmpo.nemo_rl.dmpo_batch_terms import (
    is_dmpo_loss,
    read_dmpo_settings,
    unread_dmpo_settings,
)
from nemo_mmpo.nemo_rl.estimator_settings import (
    group_size_problem,
    is_our_estimator,
    read_estimator_settings,
    unread_estimator_settings,
)
from nemo_mmpo.nemo_rl.names import LOSS_NAMES, MMPO_LOSS, NEMO_RL_ESTIMATORS
from nemo_mmpo.nemo_rl.paper_settings import paper_setting_deviations
from nemo_mmpo.nemo_rl.sections import value


@dataclass
class Findings:
    """What one rule (or all of them) found."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def extend(self, other: Findings) -> None:
        self.errors.extend(other.errors)
        self.warnings.extend(other.warnings)


Rule = Callable[[dict[str, Any]], Findings]
RULES: list[Rule] = []


def rule(function: Callable[[dict[str, Any], Findings], None]) -> Rule:
    """Register a check ``(config, findings) -> None``; an ``MMPOInputError`` it raises is an
    error finding."""

    def run(config: dict[str, Any]) -> Findings:
        findings = Findings()
        try:
            function(config, findings)
        except MMPOInputError as error:
            findings.errors.append(str(error))
        return findings

    run.__name__ = run.__qualname__ = function.__name__
    run.__doc__ = function.__doc__
    RULES.append(run)
    return run


def _group_sizes(config: dict[str, Any]) -> tuple[int, int]:
    prompts = value(config, "grpo.num_prompts_per_step")
    group_size = value(config, "grpo.num_generations_per_prompt")
    for key, number in (
        ("num_prompts_per_step", prompts),
        ("num_generations_per_prompt", group_size),
    ):
        if isinstance(number, bool) or not isinstance(number, int) or number < 1:
            raise MMPOInputError(f"grpo.{key}={number!r}: give an integer >= 1")
    return prompts, group_size


@rule
def batch_shape(config: dict[str, Any], findings: Findings) -> None:
    """Prompts and generations per step are positive integers; the optimizer's global batch
    divides the rollouts of a step."""
    prompts, group_size = _group_sizes(config)
    global_batch = value(config, "policy.train_global_batch_size")
    rollouts = prompts * group_size
    if isinstance(global_batch, int) and global_batch > 0 and rollouts % global_batch:
        raise MMPOInputError(
            f"policy.train_global_batch_size={global_batch} must divide the rollouts per step "
            f"(num_prompts_per_step x num_generations_per_prompt = {rollouts})"
        )


@rule
def advantage_estimator(config: dict[str, Any], findings: Findings) -> None:
    """Our estimators' settings (typed), the group size each estimator declared it needs
    (the unbiased estimator's 2 <= G and T <= G, pass@k's k <= G), binary rewards, and
    advantage clipping that would cut MMPO's weights."""
    estimator = value(config, "grpo.adv_estimator") or {}
    name = estimator.get("name")
    if name is None:
        raise MMPOInputError("grpo.adv_estimator.name is missing")
    if name in NEMO_RL_ESTIMATORS:
        return  # NeMo-RL's own estimator: NeMo-RL validates it
    settings = read_estimator_settings(estimator)  # unknown names: both lists named
    _, group_size = _group_sizes(config)
    problem = group_size_problem(settings, group_size)
    if problem is not None:
        findings.errors.append(problem)
    scaling = bool(value(config, "grpo.reward_scaling.enabled", False))
    shaping = bool(value(config, "grpo.reward_shaping.enabled", False))
    if (scaling or shaping) and settings.reward_threshold is None:
        findings.errors.append(
            "grpo.reward_scaling.enabled or grpo.reward_shaping.enabled is true, so rewards "
            "will not be 0/1, but MMPO needs binary rewards. Set both to false or set "
            "grpo.adv_estimator.reward_threshold"
        )
    clip_high = value(config, "grpo.advantage_clip_high")
    if clip_high is not None and settings.objective.name.startswith("mmpo"):
        weight_max = sum(settings.objective.weight_coefficients())
        findings.warnings.append(
            f"grpo.advantage_clip_high={clip_high} clips MMPO advantages, whose weight "
            f"reaches {weight_max:g} at f = 1"
        )


@rule
def loss_function(config: dict[str, Any], findings: Findings) -> None:
    """``loss_fn.name``; non-paper settings of ours (warned); async needs importance sampling;
    ``force_on_policy_ratio`` needs one optimizer step per batch; an unused reference pass."""
    loss_config = value(config, "loss_fn") or {}
    loss_name = loss_config.get("name")
    if loss_name not in (None, *LOSS_NAMES):
        raise MMPOInputError(
            f"loss_fn.name={loss_name!r}: use 'mmpo' (NeMo-RL's clipped surrogate, reporting "
            "non-paper settings), 'dmpo' (the surrogate plus DMPO's penalty) or 'clipped_pg' "
            "(NeMo-RL's ClippedPGLossFn as configured)"
        )
    if loss_name == MMPO_LOSS:
        findings.warnings.extend(
            f"{deviation}: loss_fn.name=mmpo computes NeMo-RL's loss with this value"
            for deviation in paper_setting_deviations(loss_config)
        )
    if value(config, "grpo.async_grpo.enabled", False) and not loss_config.get(
        "use_importance_sampling_correction", False
    ):
        findings.errors.append(
            "grpo.async_grpo.enabled=true needs loss_fn.use_importance_sampling_correction=true "
            "(NeMo-RL's async trainer asserts it: rollouts come from an older policy)"
        )
    prompts, group_size = _group_sizes(config)
    global_batch = value(config, "policy.train_global_batch_size")
    if loss_config.get("force_on_policy_ratio") and global_batch != prompts * group_size:
        findings.errors.append(
            f"loss_fn.force_on_policy_ratio=true needs policy.train_global_batch_size="
            f"{prompts * group_size} (one optimizer step per rollout batch), not {global_batch}"
        )
    kl = loss_config.get("reference_policy_kl_penalty") or 0
    if kl == 0 and value(config, "grpo.skip_reference_policy_logprobs_calculation") is False:
        findings.warnings.append(
            "loss_fn.reference_policy_kl_penalty=0 but "
            "grpo.skip_reference_policy_logprobs_calculation=false: the reference log-probs "
            "are computed every step and unused"
        )


@rule
def dmpo(config: dict[str, Any], findings: Findings) -> None:
    """DMPO's settings (typed); what it cannot train with; non-paper values (warned)."""
    loss_config = value(config, "loss_fn") or {}
    if not is_dmpo_loss(loss_config):
        return
    settings = read_dmpo_settings(loss_config)
    findings.warnings.extend(
        f"{deviation}: loss_fn.name=dmpo trains with this value"
        for deviation in paper_setting_deviations(loss_config) + settings.deviations()
    )
    if loss_config.get("force_on_policy_ratio"):
        findings.errors.append(
            "loss_fn.name=dmpo needs the log-probabilities NeMo-RL computes before training "
            "(prev_logprobs), which loss_fn.force_on_policy_ratio=true skips: set "
            "loss_fn.force_on_policy_ratio=false"
        )
    if value(config, "data_plane.enabled", False):
        findings.errors.append(
            "loss_fn.name=dmpo runs in NeMo-RL's grpo_train and async_grpo_train; "
            "data_plane.enabled=true selects grpo_train_sync, which nemo-mmpo cannot reach "
            "with DMPO's batch terms: set data_plane.enabled=false"
        )
    prompts, group_size = _group_sizes(config)
    rollouts = prompts * group_size
    global_batch = value(config, "policy.train_global_batch_size")
    if isinstance(global_batch, int) and 0 < global_batch < rollouts:
        findings.warnings.append(
            f"policy.train_global_batch_size={global_batch} < {rollouts} rollouts: "
            f"{rollouts // global_batch} optimizer steps per batch; DMPO's penalty is exact at "
            "the first and first-order (linearised at the batch's start) at the others"
        )
    if value(config, "grpo.adv_estimator.name") != "grpo":
        findings.warnings.append(
            f"grpo.adv_estimator.name={value(config, 'grpo.adv_estimator.name')!r}: DMPO's "
            "target is the softmax of these advantages; the paper's DMPO uses GRPO's"
        )


def training_prompts(config: dict[str, Any]) -> tuple[int, str] | None:
    """How many prompts ``data.train.data_path`` holds: counted when the file exists, else the
    MATH train size for the file ``--prepare-data`` writes; None when neither is known."""
    data_path = value(config, "data.train.data_path")
    if not isinstance(data_path, str):
        return None
    path = Path(data_path) if Path(data_path).is_absolute() else REPO_ROOT / data_path
    if path.is_file():
        with path.open(encoding="utf-8") as handle:
            return sum(1 for line in handle if line.strip()), data_path
    if path.name == "math_train.jsonl":
        size = BENCHMARKS["math_train"].expected_size
        return size, f"{data_path} (MATH train as --prepare-data writes it)"
    return None


@rule
def async_training_data(config: dict[str, Any], findings: Findings) -> None:
    """An async run the training set cannot feed is refused
    (:func:`~nemo_mmpo.nemo_rl.versions.async_batches_needed`)."""
    if not value(config, "grpo.async_grpo.enabled", False):
        return
    if value(config, "cpu_backend.enabled", False):
        return  # the tiny CPU driver lays the epochs it needs into one pass
    known = training_prompts(config)
    max_steps = value(config, "grpo.max_num_steps")
    if known is None or not isinstance(max_steps, int):
        return
    prompts, _ = _group_sizes(config)
    size, source = known
    batches = size // prompts
    if versions.async_batches_needed(max_steps) > batches:
        findings.errors.append(
            f"grpo.max_num_steps={max_steps} with grpo.async_grpo.enabled=true: NeMo-RL's "
            f"async trainer reads the training set once (grpo.max_num_epochs does not apply) "
            f"and needs one batch beyond the last step (at the dataloader's end its collector "
            f"stops and drops the generation in flight); {source} holds {size} prompts = "
            f"{batches} batches of {prompts}, so at step {min(max_steps, batches)} NeMo-RL "
            f"v0.7.0 waits forever (main stops with an error). Set "
            f"grpo.max_num_steps={max(batches - 1, 0)} or fewer"
        )


@rule
def async_resume(config: dict[str, Any], findings: Findings) -> None:
    """An async run on a NeMo-RL whose first step after a start can wait forever (v0.7.0) is
    warned about: after a resume, and at a fresh start with ``grpo.val_at_start=true``."""
    if not value(config, "grpo.async_grpo.enabled", False):
        return
    root = find_nemo_rl_root()
    if root is None or not versions.async_resume_can_stall(root):
        return
    findings.warnings.append(
        f"grpo.async_grpo.enabled=true with the NeMo-RL at {root}: resumed from a checkpoint, "
        "its async trainer can skip the step after the one it resumes at and then wait "
        "forever (the replay buffer restored with step N complete; the trajectory collector "
        f"moves on to N+2). Resume with a NeMo-RL that has {versions.ASYNC_RESUME_FIX} (main "
        "does); a run that stalls right after resuming is this"
    )
    # the CPU rig evaluates step 0 before NeMo-RL's loop, so its collector is never paused
    if value(config, "grpo.val_at_start", False) and not value(
        config, "cpu_backend.enabled", False
    ):
        findings.warnings.append(
            f"grpo.async_grpo.enabled=true and grpo.val_at_start=true with the NeMo-RL at "
            f"{root}: it pauses its trajectory collector for the step-0 validation while step "
            "0's trajectories finish and resumes it as the trainer takes them; the collector "
            "can then generate step 0 again instead of step 1, and the trainer waits forever "
            "for step 1 (seen on the CPU rig with v0.7.0). Set grpo.val_at_start=false "
            f"(evaluate the starting checkpoint with `nemo-mmpo eval`), or use a NeMo-RL with "
            f"{versions.ASYNC_RESUME_FIX}, which waits for step 1 before training step 0 "
            "(main does)"
        )


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


@rule
def unread_settings(config: dict[str, Any], findings: Findings) -> None:
    """Settings that validate but that nothing reads in this configuration (warned, naming who
    reads them): estimator options of another estimator, DMPO's keys under another loss, the
    keys of a disabled ``evaluation`` or ``cpu_backend`` section, async-only CPU settings.
    A section that does not validate is left to its own rule, which names the error once."""
    estimator = value(config, "grpo.adv_estimator") or {}
    asynchronous = bool(value(config, "grpo.async_grpo.enabled", False))
    reports = [
        lambda: unread_dmpo_settings(value(config, "loss_fn")),
        lambda: unread_evaluation_settings(value(config, "evaluation")),
        lambda: unread_cpu_settings(value(config, "cpu_backend"), asynchronous),
    ]
    if is_our_estimator(estimator.get("name")):
        reports.insert(0, lambda: unread_estimator_settings(estimator))
    for report in reports:
        try:
            findings.warnings.extend(report())
        except MMPOInputError:
            continue


@rule
def cpu_backend(config: dict[str, Any], findings: Findings) -> None:
    """The tiny CPU rig's ``cpu_backend`` section (typed) when it is enabled."""
    section = value(config, "cpu_backend")
    if not section or not section.get("enabled"):
        return
    TinySettings.from_config(section)


@rule
def evaluation(config: dict[str, Any], findings: Findings) -> None:
    """The paper's evaluation (typed): inside the loop only where the engine can sample with
    its own settings (the CPU engines), and then at a positive ``grpo.val_period``."""
    section = value(config, "evaluation")
    if section is None:
        return
    settings = read_settings(section)
    if not (settings.enabled and settings.in_loop):
        return
    if not value(config, "cpu_backend.enabled", False):
        findings.errors.append(
            "evaluation.in_loop=true: NeMo-RL's vLLM engines sample with the training settings "
            "fixed at start-up, so the paper's sampler cannot run inside the loop. Set "
            "evaluation.in_loop=false and run `nemo-mmpo eval watch` beside the training"
        )
    if not value(config, "grpo.val_period", 0) and not value(config, "grpo.val_at_start", False):
        findings.warnings.append(
            "evaluation.in_loop=true but grpo.val_period=0 and grpo.val_at_start=false: "
            "nothing will be evaluated"
        )


@rule
def nemo_rl_master_config(config: dict[str, Any], findings: Findings) -> None:
    """Where NeMo-RL's trainer imports (its own environment), the config builds its
    ``MasterConfig`` as ``run_grpo.py`` will build it: its types and required keys."""
    import importlib.util

    if importlib.util.find_spec("nemo_rl") is None:
        return  # a login node: NeMo-RL's loader has read the config, its types are not here
    try:
        from nemo_rl.algorithms.grpo import MasterConfig
    except Exception:
        return  # NeMo-RL's trainer does not import here (no GPU libraries): types unchecked
    from pydantic import ValidationError

    nemo_rl_sections = {key: item for key, item in config.items() if key != "cpu_backend"}
    try:
        MasterConfig(**nemo_rl_sections)
    except ValidationError as error:
        for item in error.errors()[:5]:
            key = ".".join(str(part) for part in item["loc"])
            findings.errors.append(
                f"{key}={item.get('input')!r}: NeMo-RL's MasterConfig refuses it ({item['msg']})"
            )


def check(config: dict[str, Any]) -> Findings:
    """Every rule's findings on ``config``."""
    findings = Findings()
    for run in RULES:
        findings.extend(run(config))
    return findings
