"""Rules on our config sections: settings nothing reads, ``cpu_backend`` and ``evaluation``."""

from __future__ import annotations

from typing import Any

from nemo_mmpo.cpu.rig.rig_settings import (
    Layout,
    TinySettings,
    unread_cpu_settings,
    vllm_engine_problem,
)
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.eval.prompts import format_problem
from nemo_mmpo.eval.protocol import answer_room_problem, read_settings, unread_evaluation_settings
from nemo_mmpo.launch import trainers
from nemo_mmpo.launch.rules.registry import Findings, rule
from nemo_mmpo.nemo_rl.dmpo_batch_terms import (
    unread_dmpo_settings,
)
from nemo_mmpo.nemo_rl.estimator_settings import (
    is_our_estimator,
    unread_estimator_settings,
)
from nemo_mmpo.sections import value


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
        lambda: unread_evaluation_settings(
            value(config, "evaluation"), value(config, "policy.generation.max_new_tokens")
        ),
        lambda: unread_cpu_settings(
            value(config, "cpu_backend"), asynchronous, trainers.is_single_controller(config)
        ),
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
    """The tiny CPU rig's ``cpu_backend`` section (typed) when it is enabled; the vLLM engine
    outside colocated ``grpo_train`` (:func:`~nemo_mmpo.cpu.rig.rig_settings.vllm_engine_problem`;
    not for the single controller's own engine);
    a Megatron layout that does not divide ``megatron_ranks``; the recipe's own problems in the
    single controller (its rig trains the additions only)."""
    section = value(config, "cpu_backend")
    if not section or not section.get("enabled"):
        return
    settings = TinySettings.from_config(section)
    if settings.policy == "megatron":
        Layout.from_config(value(config, "policy") or {}, settings.megatron_ranks)
    # the single controller's vLLM engine is its own (async, in its own cluster): the rule
    # single_controller checks that recipe
    single_controller = trainers.is_single_controller(config)
    problem = vllm_engine_problem(config) if settings.engine == "vllm" else None
    if problem and not single_controller:
        findings.errors.append(problem)
    if settings.problems == "recipe" and single_controller:
        findings.errors.append(
            "cpu_backend.problems=recipe (the recipe's own data) is not wired into the CPU rig's "
            "single controller, which trains the rig's additions: set cpu_backend.problems="
            "addition, or train the recipe with grpo_train (no async_rl section)"
        )


@rule
def evaluation(config: dict[str, Any], findings: Findings) -> None:
    """The paper's evaluation (typed): inside the loop only where the engine can sample with
    its own settings (the CPU engines), and then at a positive ``grpo.val_period``."""
    section = value(config, "evaluation")
    if section is None:
        return
    settings = read_settings(section)
    if settings.enabled:
        problem = format_problem(config, settings.template)
        if problem:
            findings.errors.append(problem)
    if settings.enabled and not settings.in_loop:
        problem = answer_room_problem(config, settings)
        if problem:
            findings.errors.append(problem)
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
