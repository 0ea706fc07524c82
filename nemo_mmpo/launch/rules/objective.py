"""Rules on the objective: the batch's shape, the advantage estimator, the loss and DMPO."""

from __future__ import annotations

from typing import Any

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.launch.rules.registry import Findings, group_sizes, rule
from nemo_mmpo.losses import all_loss_names, loss_entry
from nemo_mmpo.nemo_rl.dmpo_batch_terms import (
    dmpo_name,
    is_dmpo_loss,
    read_dmpo_settings,
    refuse_misspelt_dmpo_key,
)
from nemo_mmpo.nemo_rl.estimator_settings import (
    advantage_clip_warning,
    group_size_problem,
    read_estimator_settings,
)
from nemo_mmpo.nemo_rl.names import NEMO_RL_ESTIMATORS, near_miss
from nemo_mmpo.nemo_rl.paper_settings import paper_setting_deviations
from nemo_mmpo.sections import value


@rule
def batch_shape(config: dict[str, Any], findings: Findings) -> None:
    """Prompts and generations per step are positive integers; the optimizer's global batch
    divides the rollouts of a step."""
    prompts, group_size = group_sizes(config)
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
    NeMo-RL's advantage clipping after our estimator (warned)."""
    estimator = value(config, "grpo.adv_estimator") or {}
    name = estimator.get("name")
    if name is None:
        raise MMPOInputError("grpo.adv_estimator.name is missing")
    if name in NEMO_RL_ESTIMATORS:
        return  # NeMo-RL's own estimator: NeMo-RL validates it
    settings = read_estimator_settings(estimator)  # unknown names: both lists named
    _, group_size = group_sizes(config)
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
    clipping = advantage_clip_warning(settings, value(config, "grpo"))
    if clipping is not None:
        findings.warnings.append(clipping)


@rule
def loss_function(config: dict[str, Any], findings: Findings) -> None:
    """``loss_fn.name`` (matched exactly); DMPO's keys spelt right whatever the loss; non-paper
    settings of ours (warned); async needs importance sampling; ``force_on_policy_ratio`` needs
    one optimizer step per batch; an unused reference pass."""
    loss_config = value(config, "loss_fn") or {}
    loss_name = loss_config.get("name")
    names = all_loss_names()
    if loss_name not in (None, *names):
        spelling = near_miss(loss_name, names)
        hint = f"did you mean {spelling!r}? (names are matched exactly) " if spelling else ""
        raise MMPOInputError(
            f"loss_fn.name={loss_name!r}: {hint}use one of {', '.join(names)} (the last: "
            "NeMo-RL's ClippedPGLossFn as configured; see docs/own-objective.md to add one)"
        )
    refuse_misspelt_dmpo_key(loss_config)
    entry = loss_entry(loss_name)
    if entry is not None and entry.batch_terms is None:
        findings.warnings.extend(
            f"{deviation}: loss_fn.name={loss_name} computes NeMo-RL's loss with this value"
            for deviation in paper_setting_deviations(loss_config)
        )
    if entry is not None and entry.needs_prev_logprobs and loss_config.get("force_on_policy_ratio"):
        findings.errors.append(
            f"loss_fn.name={loss_name} needs the log-probabilities NeMo-RL computes before "
            "training (prev_logprobs), which loss_fn.force_on_policy_ratio=true skips: set "
            "loss_fn.force_on_policy_ratio=false"
        )
    if (
        entry is not None
        and entry.batch_terms is not None
        and value(config, "data_plane.enabled", False)
    ):
        findings.errors.append(
            f"loss_fn.name={loss_name} runs in NeMo-RL's grpo_train and async_grpo_train; "
            "data_plane.enabled=true selects grpo_train_sync, which nemo-mmpo cannot reach "
            "with the loss's per-batch terms: set data_plane.enabled=false"
        )
    if value(config, "grpo.async_grpo.enabled", False) and not loss_config.get(
        "use_importance_sampling_correction", False
    ):
        findings.errors.append(
            "grpo.async_grpo.enabled=true needs loss_fn.use_importance_sampling_correction=true "
            "(NeMo-RL's async trainer asserts it: rollouts come from an older policy)"
        )
    prompts, group_size = group_sizes(config)
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
        f"{deviation}: loss_fn.name={dmpo_name()} trains with this value"
        for deviation in paper_setting_deviations(loss_config) + settings.deviations()
    )
    prompts, group_size = group_sizes(config)
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
