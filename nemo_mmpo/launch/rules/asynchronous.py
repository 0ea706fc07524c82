"""Rules on an asynchronous run: data enough for its batches, a resume that cannot stall, and
what NeMo-RL's single controller cannot run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nemo_mmpo.checkout import find_nemo_rl_root
from nemo_mmpo.cpu.rig.single_controller import problem as single_controller_cpu_problem
from nemo_mmpo.data import BENCHMARKS
from nemo_mmpo.launch import trainers
from nemo_mmpo.launch.rules.registry import Findings, group_sizes, rule
from nemo_mmpo.nemo_rl import versions
from nemo_mmpo.sections import value


def training_prompts(config: dict[str, Any]) -> tuple[int, str] | None:
    """How many prompts ``data.train.data_path`` holds: counted when the file exists, else the
    MATH train size for the file ``--prepare-data`` writes; None when neither is known."""
    data_path = value(config, "data.train.data_path")
    if not isinstance(data_path, str):
        return None
    path = Path(data_path)  # relative: to the working directory, as NeMo-RL reads it
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
    prompts, _ = group_sizes(config)
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


@rule
def single_controller(config: dict[str, Any], findings: Findings) -> None:
    """A single-controller recipe (:mod:`nemo_mmpo.launch.trainers`) with what its entry point
    or setup refuses, or what it never runs, is refused, each named with the fix."""
    if not trainers.is_single_controller(config):
        return
    where = trainers.SINGLE_CONTROLLER
    if value(config, "cpu_backend.enabled", False):
        cpu_problem = single_controller_cpu_problem(
            value(config, "cpu_backend.policy", "transformers"),
            value(config, "cpu_backend.engine", "transformers"),
        )
        if cpu_problem:
            findings.errors.append(cpu_problem)
    if value(config, "grpo.async_grpo") is not None:
        findings.errors.append(
            f"grpo.async_grpo is set: {where} refuses it (its asynchrony is async_rl's); "
            "set grpo.async_grpo=null"
        )
    if not value(config, "data_plane.enabled", False):
        findings.errors.append(
            f"data_plane.enabled=false: {where} runs on NeMo-RL's data plane only; set "
            "data_plane.enabled=true"
        )
    validation = [
        f"grpo.{key}={value(config, f'grpo.{key}')!r}"
        for key, off in (("val_period", 0), ("val_at_start", False), ("val_at_end", False))
        if value(config, f"grpo.{key}", off) not in (off, None)
    ]
    if validation:
        findings.errors.append(
            f"{', '.join(validation)}: {where} refuses validation "
            f"({trainers.VALIDATION_REFUSED_AT}); set grpo.val_period=0, val_at_start=false, "
            "val_at_end=false, and evaluate its checkpoints with the watcher "
            "(nemo-mmpo eval watch)"
        )
    if value(config, "evaluation.enabled", False) and value(config, "evaluation.in_loop", False):
        findings.errors.append(
            f"evaluation.in_loop=true: {where} never calls NeMo-RL's validation, where the "
            "in-loop evaluation runs; set evaluation.in_loop=false and evaluate its "
            "checkpoints with the watcher (nemo-mmpo eval watch)"
        )
