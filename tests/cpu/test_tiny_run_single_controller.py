"""The single-controller tiny recipe (``mmpo_tiny_cpu_single_controller.yaml``): NeMo-RL main's
``setup_single_controller`` and ``SingleControllerActor`` (the streaming loop of
``run_grpo_single_controller.py``) with NeMo-RL's ``TQPolicy`` over its ``MegatronPolicyWorker``
(TP2, the split training API), ``VllmGeneration`` with vLLM's async engine in a cluster of its
own, the collective weight synchronizer and TransferQueue; the CPU rig answers only the clusters,
the engines on them and the dataset (``nemo_mmpo/cpu/answers/single_controller.py``).

The run trains NeMo-RL main with its merged #3773 (issue 69): a copy of the imported NeMo-RL
whose ``setup.py`` builds the estimator in ``_build_advantage_estimator``, which imports grpo's
factory inside its body (``nemo_rl_copies.single_controller_builder_3773``), first on both runs'
``PYTHONPATH``; both runs are subprocesses, as this process imported the snapshot's NeMo-RL.
Main's own shape, setup.py importing the factory, is hooked as before (the adapter tests,
``tests/nemo_rl_adapter/test_single_controller_metrics.py``): one run, the newer shape.

What holds by construction, checked on one run killed with SIGKILL after step 2's checkpoint
and resumed: the trainer is the single controller (its own step metrics, e.g. the prompt groups
it promoted, are logged every step: no other trainer logs them); every step carries our
estimator's ``mmpo/`` metrics, made inside the controller's actor from its streaming chunks and
combined (their success rate is the step's reward, every rollout counted once); the resumed run
starts at the saved step with Adam's state and runs each later step once; every step is
on-policy (the in-order sampler with no lookahead, vLLM sampling from the weights the workers
exported, both float32); the watcher evaluates the controller's Megatron checkpoint (NeMo-RL
refuses validation in the controller). NeMo-RL main only (v0.7.0 has no single controller).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import patience
import pytest
from in_loop_evaluation import HELD_OUT_PROBLEMS, start_watcher
from killed_runs import (
    as_in_nemo_rls_container,
    check_on_policy,
    run_until_step_then_kill,
)
from learning_check import fifty_step_overrides
from nemo_rl_copies import ROOT, nemo_rl_copy, single_controller_builder_3773
from nemo_rl_support import CONFIGS_DIR, Console, import_nemo_rl, nemo_rl_checkout

pytestmark = [pytest.mark.nemo_rl, pytest.mark.main_snapshot, pytest.mark.long_run]
import_nemo_rl("nemo_rl.algorithms.grpo")  # skips the module where NeMo-RL is not importable
if importlib.util.find_spec("nemo_rl.algorithms.single_controller") is None:  # v0.7.0's session
    pytest.skip("this NeMo-RL has no single controller (v0.7.0)", allow_module_level=True)
import_nemo_rl("vllm")
import_nemo_rl("megatron.core")
import_nemo_rl("transfer_queue")
import_nemo_rl("nemo_rl.algorithms.single_controller")

from nemo_mmpo.cpu.rig import driver
from nemo_mmpo.cpu.spread.curves import reward_curve
from nemo_mmpo.recipes import load

RECIPE = "mmpo_tiny_cpu_single_controller.yaml"
STEPS = 4
#: a step metric only the single controller logs (single_controller.py, its step log)
CONTROLLER_METRIC = "train/promoted_prompt_groups"
#: our estimator's success rate, combined over the controller's streaming chunks
MMPO_METRIC = "train/mmpo/success_rate"
#: what the hooked builder of #3773 prints when it builds our estimator (wrappers.py)
BUILT_THROUGH_3773 = (
    "estimator, built through nemo_rl.algorithms.single_controller_utils.setup."
    "_build_advantage_estimator"
)
#: the watcher's samples per held-out problem
WATCH_SAMPLES = 1


def report(request, line: str) -> None:
    """``line`` in the CI log (scripts/test_nemo_rl.sh prints lines starting ``megatron-``)."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        sys.stdout.write(f"\n{line}\n")


def test_single_controller_trains_mmpo_resumes_after_kill_9_and_is_evaluated_by_the_watcher(
    request, tmp_path, tiny_warm_starts, monkeypatch
):
    # NeMo-RL main with #3773's single-controller setup, for both runs (their subprocesses)
    copy = tmp_path / "nemo-rl-3773"
    single_controller_builder_3773(nemo_rl_copy(copy))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(copy), os.environ["PYTHONPATH"]]))
    overrides = [
        *fifty_step_overrides(tmp_path, tiny_warm_starts),
        f"grpo.max_num_steps={STEPS}",
        "checkpointing.save_period=2",
    ]
    checkpoints = tmp_path / "checkpoints"
    # the killed run: a subprocess, as a person runs the recipe (the entry point moves into
    # NeMo-RL's environment and the CPU rig drives the single controller)
    killed = run_until_step_then_kill(
        RECIPE, overrides, tmp_path, STEPS, kill_after=2, until=f"checkpoint {checkpoints}/step_2"
    )
    checkpoint = import_nemo_rl("nemo_rl.utils.checkpoint")
    weights, optimizer = checkpoint.CheckpointManager.get_resume_paths(checkpoints / "step_2")
    assert weights is not None and optimizer is not None, killed[-3000:]

    # the resumed run: the same command, to its end
    uv_run, environment = as_in_nemo_rls_container()
    command = [*uv_run, str(ROOT / "examples" / "run_mmpo_math.py"), "--config"]
    finished = patience.run(
        [*command, str(CONFIGS_DIR / RECIPE), *overrides],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=patience.RUN_S,
    )
    terminal = finished.stdout + finished.stderr
    assert finished.returncode == 0, terminal[-3000:]
    (resumed,) = [line for line in terminal.splitlines() if "resuming from" in line]
    start = int(resumed.rsplit("step_", 1)[1].split()[0].rstrip("/):,."))
    assert start in (2, 3), resumed  # the killed run may have saved nothing after step 2
    assert (checkpoints / f"step_{STEPS}" / "policy" / "weights").is_dir(), terminal[-3000:]
    # both runs built the estimator through the copy's #3773 builder, hooked (NeMo-RL's log)
    nemo_rl_log = (tmp_path / "logs" / "nemo_rl.log").read_text()
    assert nemo_rl_log.count(BUILT_THROUGH_3773) == 2, nemo_rl_log[-3000:]

    logs = tmp_path / "logs"
    rewards = dict(reward_curve(logs, "train/reward"))
    trained = set(rewards)
    assert set(range(start + 1, STEPS + 1)) <= trained
    # every logged step is the controller's, with our metrics combined over its chunks
    assert {step for step, _ in reward_curve(logs, CONTROLLER_METRIC)} == trained
    success = dict(reward_curve(logs, MMPO_METRIC))
    assert set(success) == trained
    for step in trained:  # binary rewards: the success rate over every rollout is the reward
        assert success[step] == pytest.approx(rewards[step], abs=1e-6), step
    check_on_policy(logs, start + 1, STEPS)

    # the watcher on the controller's last checkpoint (NeMo-RL's converter, vLLM)
    watched = watch_once(RECIPE, overrides, tmp_path, STEPS)
    rollouts = (watched / f"step_{STEPS}.jsonl").read_text().splitlines()
    assert len(rollouts) == HELD_OUT_PROBLEMS * WATCH_SAMPLES
    numbers = json.loads((watched / f"step_{STEPS}.json").read_text())
    assert 0.0 <= numbers["average"] <= 1.0

    report(
        request,
        f"megatron-worker {nemo_rl_checkout().name} with #3773's setup "
        "(_build_advantage_estimator): NeMo-RL's single controller "
        f"(setup_single_controller, SingleControllerActor; TQPolicy over MegatronPolicyWorker "
        f"TP2, async vLLM in its own cluster) trained {RECIPE} with mmpo for {STEPS} steps, "
        f"mmpo/ metrics from the controller's chunks at steps {sorted(trained)}, killed with "
        f"SIGKILL and resumed from step {start} (Adam's state found), on-policy at every step; "
        f"the watcher evaluated step {STEPS} (average {numbers['average']:.3f})",
    )


def watch_once(recipe: str, overrides: list[str], tmp_path, step: int):
    """``nemo-mmpo eval watch --backend vllm --every <step>`` on the run's checkpoints, once;
    returns its output folder (``best/``: the best evaluated step's converted weights)."""
    watched = tmp_path / "watched"
    watcher = start_watcher(
        CONFIGS_DIR / recipe,
        ["--backend", "vllm", "--every", str(step)],
        [
            *overrides,
            "evaluation.enabled=true",
            f"evaluation.samples={WATCH_SAMPLES}",
            f"evaluation.output_dir={watched}",
        ],
        tmp_path / "watch.log",
    )
    assert watcher.wait(timeout=patience.RUN_S) == 0, (tmp_path / "watch.log").read_text()[-3000:]
    return watched


# CI time (on request, NEMO_MMPO_BEYOND_CI=1; about 15 minutes each on 2 cores): CI's learning
# check is the Megatron recipe's through grpo_train (test_tiny_run_megatron.py), whose workers,
# vLLM engine, estimator, loss and hyper-parameters these recipes share
@pytest.mark.beyond_ci
@pytest.mark.parametrize("recipe", [RECIPE, "mmpo_tiny_cpu_sync.yaml"])
def test_fifty_steps_of_mains_newer_trainers_raise_the_expected_success(
    recipe, tmp_path, tiny_warm_starts
):
    """The learning check of the Megatron recipe (:func:`learning_check.check_gain`, the same
    margin) on the single controller's and ``grpo_train_sync``'s runs: 50 steps from the shared
    warm start, the step-50 checkpoint converted by the watcher."""
    from learning_check import check_gain

    overrides = fifty_step_overrides(tmp_path, tiny_warm_starts)
    config = load(CONFIGS_DIR / recipe, overrides).config
    summary = driver.run(config, console=Console())
    assert summary["checkpoint"] == str(tmp_path / "checkpoints" / "step_50" / "policy" / "weights")
    watched = watch_once(recipe, overrides, tmp_path, 50)
    assert json.loads((watched / "best" / "nemo_mmpo_best.json").read_text())["step"] == 50
    check_gain(recipe, config, {"checkpoint": str(watched / "best")}, tiny_warm_starts)
