"""The Megatron tiny recipe (``mmpo_tiny_cpu_megatron.yaml``): NeMo-RL's ``grpo_train`` with
NeMo-RL's own ``Policy`` -> ``MegatronPolicyWorker`` actors (tensor parallel 2, the model
imported from the warm start's Hugging Face folder by Megatron-Bridge) and NeMo-RL's
``VllmGeneration`` on vLLM's CPU build, refit from the workers' export after every step.

What holds by construction: every step is on-policy (vLLM samples from the weights the workers
export, both float32, so NeMo-RL's ``token_mult_prob_error`` is 1 and ``gen_kl_error`` 0 up to
float32 rounding; a wrong name, shard or refit would put them far off); a run killed with
SIGKILL resumes from the workers' own Megatron checkpoint (``torch_dist``) at the saved step
and runs every later step once (on main, ``grpo_train_sync``'s test, ``test_tiny_run_sync.py``;
here, on request, main trains four steps with DMPO's loss); the terminal shows our lines only.
What is measured over seeds: the learning check (``tests/learning_check.py``'s margin) on the
release snapshot, 50 steps without a break.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import in_loop_evaluation
import patience
import pytest
import torch
from in_loop_evaluation import HELD_OUT_PROBLEMS
from killed_runs import check_on_policy, check_resumed
from learning_check import check_gain, fifty_step_overrides
from nemo_rl_support import CONFIGS_DIR, Console, import_nemo_rl, nemo_rl_checkout

pytestmark = pytest.mark.nemo_rl
import_nemo_rl("vllm")
import_nemo_rl("megatron.core")
import_nemo_rl("nemo_rl.algorithms.grpo")

from nemo_mmpo.cpu.rig import driver
from nemo_mmpo.cpu.spread.curves import reward_curve
from nemo_mmpo.recipes import load

RECIPE = "mmpo_tiny_cpu_megatron.yaml"
STEPS = 50
#: the paper's evaluation inside the loop at step 50 only, 2 samples per held-out problem
IN_LOOP_SAMPLES = 2
IN_LOOP_AT_50 = [
    "evaluation.enabled=true",
    f"grpo.val_period={STEPS}",
    f"evaluation.samples={IN_LOOP_SAMPLES}",
]
#: DMPO's settings (examples/configs/dmpo_math_qwen3_1.7b.yaml: GRPO's estimator, DMPO's loss)
DMPO = [
    "grpo.normalize_rewards=true",
    "grpo.adv_estimator.name=grpo",
    "loss_fn.name=dmpo",
    "++loss_fn.dmpo_weight=2.0",
    "++loss_fn.dmpo_temperature=0.06666666666666667",
    "++loss_fn.dmpo_filter_zero_signal=true",
]


def report(request, line: str) -> None:
    """``line`` in the CI log (scripts/test_nemo_rl.sh prints lines starting ``megatron-``)."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        sys.stdout.write(f"\n{line}\n")


@pytest.mark.one_snapshot
@pytest.mark.long_run
def test_megatron_recipe_is_on_policy_and_learns(request, tmp_path, tiny_warm_starts):
    """Fifty steps without a break (the kill and resume of the workers' checkpoint: on main,
    whose NeMo-RL restores the optimizer's state from it, ``test_tiny_run_sync.py``; v0.7.0
    starts a fresh Adam with megatron-core 0.19.2, docs/cpu-answers.md). Also the checkpoint
    path a GPU user meets: the watcher converts the step-50 Megatron checkpoint and evaluates
    it with vLLM (see :func:`check_watcher_equals_in_loop`)."""
    overrides = [
        *fifty_step_overrides(tmp_path, tiny_warm_starts),
        *IN_LOOP_AT_50,
    ]
    console = Console()
    summary = driver.run(load(CONFIGS_DIR / RECIPE, overrides).config, console=console)
    progress = [line.split()[1] for line in console.lines if line.startswith("step ")]
    assert progress == [f"{step}/{STEPS}" for step in range(1, STEPS + 1)]
    check_on_policy(tmp_path / "logs", 1, STEPS)
    config = load(CONFIGS_DIR / RECIPE, overrides).config
    watched = check_watcher_equals_in_loop(tmp_path, overrides)
    report(
        request,
        f"megatron-watch {nemo_rl_checkout().name}: nemo-mmpo eval watch converted the workers' "
        f"step-{STEPS} Megatron checkpoint with NeMo-RL's converter and evaluated it with vLLM, "
        "killed with SIGKILL mid-step and resumed: every sample equals the in-loop evaluation's",
    )
    # the learning check on the same conversion (the watcher keeps the best step's weights)
    assert json.loads((watched / "best" / "nemo_mmpo_best.json").read_text())["step"] == STEPS
    assert Path(summary["checkpoint"]).parent.parent.name == f"step_{STEPS}"
    check_gain(RECIPE, config, {"checkpoint": str(watched / "best")}, tiny_warm_starts)
    report(
        request,
        f"megatron-worker {nemo_rl_checkout().name}: NeMo-RL's MegatronPolicyWorker (TP2) trained "
        f"{RECIPE} with mmpo for {STEPS} steps, on-policy at every step, learned",
    )


def start_watcher(tmp_path: Path, overrides: list[str], out: Path) -> subprocess.Popen:
    """``nemo-mmpo eval watch --backend vllm`` on the run's checkpoints, into ``out``."""
    return in_loop_evaluation.start_watcher(
        CONFIGS_DIR / RECIPE,
        ["--backend", "vllm"],
        [*overrides, f"evaluation.output_dir={out}"],
        tmp_path / "watch.log",
    )


def check_watcher_equals_in_loop(tmp_path: Path, overrides: list[str]) -> Path:
    """The watcher on the finished run's checkpoints, killed with SIGKILL once it has written
    some of step 50's samples and started again: NeMo-RL's converter (Megatron-Bridge, the
    workers' CPU answers) makes a Hugging Face folder of the workers' ``torch_dist``
    checkpoint; vLLM samples it with the in-loop evaluation's sampler and per-row seeds, in the
    same calls (an interrupted call is asked again whole). What holds by construction: the
    converted weights are the ones the workers exported to vLLM at the refit before the
    in-loop evaluation, so every (problem, sample) is drawn alike, once, and the step's numbers
    are equal. Returns the watcher's output folder."""
    watched = tmp_path / "watched"
    rollouts, numbers = watched / f"step_{STEPS}.jsonl", watched / f"step_{STEPS}.json"
    watcher = start_watcher(tmp_path, overrides, watched)
    deadline, killed = time.monotonic() + patience.RUN_S, False
    try:
        while watcher.poll() is None and time.monotonic() < deadline:
            if rollouts.is_file() and rollouts.stat().st_size > 0 and not numbers.exists():
                os.killpg(watcher.pid, signal.SIGKILL)
                watcher.wait()
                killed = True
                break
            time.sleep(0.05)
        assert killed, (tmp_path / "watch.log").read_text()[-3000:]
        watcher = start_watcher(tmp_path, overrides, watched)
        assert watcher.wait(timeout=patience.RUN_S) == 0, (tmp_path / "watch.log").read_text()[
            -3000:
        ]
    finally:
        if watcher.poll() is None:
            os.killpg(watcher.pid, signal.SIGKILL)
    in_loop = tmp_path / "logs" / "evaluation"
    ours, theirs = samples_of(rollouts), samples_of(in_loop / f"step_{STEPS}.jsonl")
    assert len(ours) == HELD_OUT_PROBLEMS * IN_LOOP_SAMPLES  # none lost, none twice
    assert ours == theirs
    mine, loop = json.loads(numbers.read_text()), json.loads((in_loop / numbers.name).read_text())
    for key in ("average", "accuracy", "never_solved", "gini", "benchmarks", "first_success"):
        assert mine[key] == loop[key], key
    return watched


def samples_of(rollouts: Path) -> dict[tuple[str, int], tuple[str, bool]]:
    """``{(problem, sample): (response, correct)}``; a (problem, sample) twice is an error."""
    found = {}
    for line in rollouts.read_text().splitlines():
        record = json.loads(line)
        key = (record["problem_id"], record["sample"])
        assert key not in found, f"{key} twice in {rollouts}"
        found[key] = (record["response"], record["correct"])
    return found


# CI time (on request, NEMO_MMPO_BEYOND_CI=1): in CI, DMPO's loss and batch terms go through
# NeMo-RL's Policy and MegatronPolicyWorker in every layout (test_megatron_layouts.py, both
# snapshots), grpo_train attaches the terms and logs dmpo/ (test_trainer_loop.py), and main's
# Megatron worker with vLLM and Ray is trained by grpo_train_sync's test (test_tiny_run_sync.py)
@pytest.mark.main_snapshot
@pytest.mark.beyond_ci
def test_megatron_recipe_trains_dmpo_on_policy(request, tmp_path, tiny_warm_starts):
    """Four steps with DMPO's loss on the snapshot the 50-step test does not run on (main):
    NeMo-RL's worker trains DMPO's penalty terms, which ``install()``'s hook attaches to
    ``grpo_train``'s batch (their ``dmpo/`` metrics logged at every step), on-policy. The kill
    and resume from the workers' Megatron checkpoint on main is ``grpo_train_sync``'s test
    (``test_tiny_run_sync.py``: the same worker, checkpoint and resume path)."""
    steps = 4
    overrides = [
        *fifty_step_overrides(tmp_path, tiny_warm_starts),
        f"grpo.max_num_steps={steps}",
        *DMPO,
    ]
    console = Console()
    driver.run(load(CONFIGS_DIR / RECIPE, overrides).config, console=console)
    progress = [line.split()[1] for line in console.lines if line.startswith("step ")]
    assert progress == [f"{step}/{steps}" for step in range(1, steps + 1)]
    check_on_policy(tmp_path / "logs", 1, steps)
    penalised = {step for step, _ in reward_curve(tmp_path / "logs", "train/dmpo/penalty")}
    assert penalised == set(range(1, steps + 1))
    report(
        request,
        f"megatron-worker {nemo_rl_checkout().name}: NeMo-RL's MegatronPolicyWorker (TP2) trained "
        f"{RECIPE} with dmpo for {steps} steps (dmpo/ metrics at every step), on-policy",
    )


#: one of the step metrics our estimator reports every step (``mmpo/``, in NeMo-RL's logger)
MMPO_METRIC = "train/mmpo/success_rate"
#: what NeMo-RL logs per step that is wall-clock, not training: left out of the comparison
WALL_CLOCK = ("timing/", "performance/")


def step_scalars(log_dir: Path, step: int) -> dict[str, float]:
    """Every scalar NeMo-RL's logger wrote to TensorBoard at ``step`` under ``log_dir``, but
    the wall-clock ones (:data:`WALL_CLOCK`)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found = {}
    for events in sorted((log_dir / "tensorboard").rglob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
        accumulator.Reload()
        for tag in accumulator.Tags().get("scalars", []):
            for event in accumulator.Scalars(tag):
                if event.step == step and not tag.startswith(WALL_CLOCK):
                    found[tag] = event.value
    return found


def workers_checkpoint(step_folder: Path, out: Path) -> dict:
    """The workers' ``torch_dist`` checkpoint of ``step_folder`` (every rank's shards: the
    weights, Adam's moments and its parameter copy, its param groups), read with torch's
    ``dcp_to_torch_save``."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    (iteration,) = (step_folder / "policy" / "weights").glob("iter_*")
    dcp_to_torch_save(iteration, out)
    return torch.load(out, weights_only=False)


def same(first, second) -> bool:
    """``first`` and ``second`` hold the same values, tensors bit for bit."""
    if isinstance(first, torch.Tensor):
        return isinstance(second, torch.Tensor) and torch.equal(first, second)
    if isinstance(first, dict):
        return (
            isinstance(second, dict)
            and first.keys() == second.keys()
            and all(same(value, second[key]) for key, value in first.items())
        )
    if isinstance(first, (list, tuple)):
        return (
            type(first) is type(second)
            and len(first) == len(second)
            and all(map(same, first, second))
        )
    return first == second


@pytest.mark.main_snapshot
@pytest.mark.long_run
def test_a_resumed_run_takes_the_uninterrupted_runs_next_step(tmp_path, tiny_warm_starts):
    """NeMo-RL main's ``grpo_train`` with its Megatron worker, three steps with a checkpoint at
    step 2 (and the last); then a run resumed from that checkpoint alone (``step_2`` and the
    start folder copied into a new ``checkpoint_dir``, a new ``log_dir``) takes step 3. Both
    with ``cpu_backend.seeded_rollouts``: vLLM's engine is new in the resumed run, so without
    per-rollout seeds its step-3 rollouts are other draws than the uninterrupted run's.

    What holds by construction (same layout, TP2; same process, so the same thread counts;
    float32; the workers' checkpoint restores weights, Adam and its step, NeMo-RL's dataloader
    state the batch) and is asserted exactly equal at step 3: every rollout, reward, advantage,
    vLLM's and the worker's log-probs of the training batch (``train_data_step3.jsonl``); every
    scalar NeMo-RL logs but the wall-clock ones (loss, grad_norm, reward, our ``mmpo/``
    metrics, ``token_mult_prob_error``...); and the step-3 checkpoint's weights and Adam state
    (moments, parameter copy, param groups with the step): the log-probs after Adam are the
    same function of the same weights. A fresh Adam (v0.7.0's resume, docs/cpu-answers.md)
    gives the same step-3 loss but other weights after it."""
    import shutil

    from nemo_mmpo.cpu.engines.megatron_policy import START_FOLDER

    checkpoint = import_nemo_rl("nemo_rl.utils.checkpoint")
    steps = 3

    def overrides(run: str) -> list[str]:
        return [
            *fifty_step_overrides(tmp_path / run, tiny_warm_starts),
            f"grpo.max_num_steps={steps}",
            "checkpointing.save_period=2",
            "cpu_backend.seeded_rollouts=true",
        ]

    driver.run(load(CONFIGS_DIR / RECIPE, overrides("straight")).config, console=Console())
    saved, copied = tmp_path / "straight" / "checkpoints", tmp_path / "resumed" / "checkpoints"
    for folder in ("step_2", START_FOLDER):
        shutil.copytree(saved / folder, copied / folder)
    # NeMo-RL main's resume finds Adam's state in the workers' checkpoint
    _, optimizer = checkpoint.CheckpointManager.get_resume_paths(copied / "step_2")
    assert optimizer is not None, "a fresh Adam on resume"
    console = Console()
    summary = driver.run(load(CONFIGS_DIR / RECIPE, overrides("resumed")).config, console=console)
    assert check_resumed(console.lines, summary, steps) == 2

    logs = {run: tmp_path / run / "logs" for run in ("straight", "resumed")}
    batches = {
        run: [json.loads(line) for line in (log / f"train_data_step{steps}.jsonl").open()]
        for run, log in logs.items()
    }
    assert batches["resumed"] == batches["straight"]
    rollouts = {str(row["content"]) for row in batches["straight"]}
    assert len(rollouts) > 8  # 8 prompts x 8 rollouts: a prompt's rollouts are its own draws
    scalars = {run: step_scalars(log, steps) for run, log in logs.items()}
    assert {"train/loss", "train/grad_norm", "train/reward", MMPO_METRIC} <= set(scalars["resumed"])
    assert {"train/token_mult_prob_error", "train/gen_kl_error"} <= set(scalars["resumed"])
    assert scalars["resumed"] == scalars["straight"]

    after = {
        run: workers_checkpoint(
            tmp_path / run / "checkpoints" / f"step_{steps}", tmp_path / f"{run}_step_{steps}.pt"
        )
        for run in ("straight", "resumed")
    }
    adam = [name for name in after["straight"] if name.endswith((".exp_avg", ".exp_avg_sq"))]
    assert adam and set(after["resumed"]) == set(after["straight"])
    for name, value in after["straight"].items():
        # the weights, Adam's moments and parameter copy; its param groups, the step among them
        if isinstance(value, torch.Tensor) or ".optimizer/" in name:
            assert same(after["resumed"][name], value), name
