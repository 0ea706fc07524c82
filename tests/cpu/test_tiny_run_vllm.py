"""The vLLM tiny recipes, shortened: ``mmpo_tiny_cpu_vllm.yaml`` (NeMo-RL's ``grpo_train`` with
NeMo-RL's own ``VllmGeneration`` on vLLM's CPU build, colocated, refit after every step) and
``mmpo_tiny_cpu_async_vllm.yaml`` (``async_grpo_train`` with vLLM's ``AsyncLLM`` as the separate
engine, its engine core in a process vLLM spawns outside Ray).

What holds by construction: the rollouts are on-policy (vLLM samples from the weights the
policy computes log-probs with, both float32, refit before every generation), so NeMo-RL's own
``token_mult_prob_error`` is 1 and ``gen_kl_error`` 0 up to float32 rounding (measured on
v0.7.0: 1 + 1.2e-7 and 2e-9 at each of three steps; the bound 1e-3 is float32 numerics with a
wide margin, not a threshold read off a run);
a second run of the same command resumes at the saved step with vLLM in the loop; the paper's
evaluation inside the loop (through the same engine, at its own sampler) logs what
``nemo-mmpo eval report`` computes from its rollouts, and the checkpoint records it.
"""

from __future__ import annotations

import copy

import pytest
import torch
from in_loop_evaluation import check_in_loop_evaluations
from killed_runs import (
    ON_POLICY_BOUND,
    check_on_policy,
    check_resumed,
    check_terminal_shows_our_lines_only,
    run_until_step_then_kill,
)
from learning_check import check_fifty_steps_learn
from nemo_rl_support import CONFIGS_DIR, Console, import_nemo_rl

pytestmark = pytest.mark.nemo_rl
import_nemo_rl("vllm")
import_nemo_rl("nemo_rl.algorithms.grpo")

from nemo_mmpo.cpu.engines.policy import CPUPolicy
from nemo_mmpo.cpu.engines.sampling import token_logprobs
from nemo_mmpo.cpu.rig import driver
from nemo_mmpo.cpu.spread.curves import reward_curve
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.recipes import load

#: the killed run's length: step 3's print comes long before its end on any machine
STEPS = 8
#: the paper's evaluation every 4 steps (and at step 0), 4 samples per held-out problem
EVALUATION = ["grpo.val_period=4", "evaluation.samples=4"]


def overrides(tmp_path, warm_starts, steps):
    return [
        f"grpo.max_num_steps={steps}",
        "checkpointing.save_period=2",
        f"checkpointing.checkpoint_dir={tmp_path / 'checkpoints'}",
        f"logger.log_dir={tmp_path / 'logs'}",
        f"cpu_backend.warm_start_cache={warm_starts}",
        *EVALUATION,
    ]


# CI time: on request (NEMO_MMPO_BEYOND_CI=1). In CI, NeMo-RL's colocated VllmGeneration is
# refit after every step in the Megatron recipe's runs (killed and resumed on main, evaluated
# in the loop on v0.7.0) and samples our policy's weights in test_vllm_generation.py
@pytest.mark.one_snapshot
@pytest.mark.beyond_ci
def test_vllm_recipe_is_on_policy_and_resumes_after_kill_9(tmp_path, tiny_warm_starts):
    """Killed once step 3 is printed, with 8 steps to go: the kill lands after step 2's
    checkpoint and long before the end (how many steps finish between the print and the kill
    depends on the machine's speed), and the same command resumes from the newest checkpoint
    it finds and finishes."""
    killed = run_until_step_then_kill(
        "mmpo_tiny_cpu_vllm.yaml",
        overrides(tmp_path, tiny_warm_starts, STEPS),
        tmp_path,
        steps=STEPS,
        kill_after=3,
    )
    assert "step    2/8" in killed
    check_terminal_shows_our_lines_only(killed, tmp_path / "logs", printed_steps=3)
    assert (tmp_path / "checkpoints" / "step_2").is_dir()
    assert not (tmp_path / "checkpoints" / f"step_{STEPS}").exists()

    console = Console()
    overridden = overrides(tmp_path, tiny_warm_starts, STEPS)
    resumed = driver.run(
        load(CONFIGS_DIR / "mmpo_tiny_cpu_vllm.yaml", overridden).config, console=console
    )
    start = check_resumed(console.lines, resumed, STEPS)
    logs = tmp_path / "logs"
    check_on_policy(logs, start + 1, STEPS)
    rewards = [value for _, value in reward_curve(logs, "train/reward")]
    assert 0 < sum(rewards) / len(rewards) < 1  # graded samples, mixed outcomes
    # the last evaluation (the resumed run's) through vLLM at the paper's sampler
    check_in_loop_evaluations(tmp_path, steps=(STEPS,), samples=4)
    assert any(f"evaluation at step {STEPS}:" in line for line in console.lines)


#: the async run's length and evaluation period (evaluations at steps 0, 2 and 4)
ASYNC_STEPS = 4


# CI time (on request, NEMO_MMPO_BEYOND_CI=1; 217 s of main's session): in CI, vLLM's AsyncLLM
# sampling every rollout from the weights the Megatron workers sent into its engine core
# (on-policy at every step, weight syncs with rollouts in flight) is asserted by the single
# controller's run (test_tiny_run_single_controller.py), async_grpo_train's loop with our
# estimator and loss by tests/nemo_rl_adapter/test_trainer_loop.py (both snapshots) and with the
# CPU engine's separate refitted copy by test_tiny_run.py (v0.7.0)
@pytest.mark.main_snapshot
@pytest.mark.beyond_ci
def test_async_vllm_recipe_samples_every_rollout_from_a_policy_version(
    tmp_path, tiny_warm_starts, monkeypatch
):
    """``mmpo_tiny_cpu_async_vllm.yaml``: NeMo-RL's collector samples through vLLM's
    ``AsyncLLM`` while the policy trains on trajectories at most one step old. What holds by
    construction: every batch the policy trains on was sampled from the exact weights of one
    of the policy's versions (vLLM's processed log-probs equal that version's, float32 on both
    sides, :data:`ON_POLICY_BOUND`): the refit reaches the engine core vLLM spawned outside Ray,
    whole; step 1's batch from the starting weights (refit before NeMo-RL's collector starts;
    vLLM starts from dummy weights), and a later batch from weights trained here (the refit after
    an optimizer step); the paper's evaluation through the same engine logs what ``nemo-mmpo
    eval report`` computes from its rollouts."""
    versions, batches = [], []
    train = CPUPolicy.train

    def recording_train(self, data, *args, **kwargs):
        versions.append(copy.deepcopy(self.model.state_dict()))
        batches.append(
            {key: data[key].clone() for key in ("input_ids", "generation_logprobs", "token_mask")}
        )
        batches[-1]["lengths"] = data["input_lengths"].clone()
        batches[-1]["model"] = self.model
        return train(self, data, *args, **kwargs)

    monkeypatch.setattr(CPUPolicy, "train", recording_train)
    recipe = CONFIGS_DIR / "mmpo_tiny_cpu_async_vllm.yaml"
    console = Console()
    steps = [
        f"grpo.max_num_steps={ASYNC_STEPS}",
        "grpo.val_period=2",
        "evaluation.samples=4",
        "checkpointing.save_period=2",
        f"checkpointing.checkpoint_dir={tmp_path / 'checkpoints'}",
        f"logger.log_dir={tmp_path / 'logs'}",
        f"cpu_backend.warm_start_cache={tiny_warm_starts}",
        "cpu_backend.stall_timeout_s=300",
    ]
    summary = driver.run(load(recipe, steps).config, console=console)
    assert summary["checkpoint"].endswith(f"step_{ASYNC_STEPS}/policy/weights")
    assert len(batches) == ASYNC_STEPS
    sampled_from = []
    for batch in batches:
        mask = batch["token_mask"].bool()
        mask[:, 0] = False
        gaps = []
        for state in versions:
            model = copy.deepcopy(batch["model"])
            model.load_state_dict(state)
            with torch.no_grad():
                ours = token_logprobs(model, batch["input_ids"], batch["lengths"], 1.0)
            gaps.append(float((ours - batch["generation_logprobs"])[mask].abs().max()))
        sampled_from.append(min(range(len(gaps)), key=gaps.__getitem__))
        assert min(gaps) < ON_POLICY_BOUND, gaps
    assert sampled_from[0] == 0
    assert max(sampled_from) >= 1, sampled_from
    # at most one step old (max_trajectory_age_steps: 1)
    assert all(step - 1 <= version + 1 for step, version in enumerate(sampled_from, 1))
    check_in_loop_evaluations(tmp_path, steps=(0, 2, ASYNC_STEPS), samples=4)


@pytest.mark.parametrize(
    "grpo, colocated, async_engine",
    [
        ({"async_grpo": {"enabled": True}}, True, True),
        ({"async_grpo": {"enabled": True}}, False, False),
        ({}, False, False),
        ({}, True, True),
    ],
    ids=["async-colocated", "async-llm-engine", "not-colocated", "grpo_train-async-engine"],
)
def test_vllm_engine_in_an_untried_layout_is_refused_by_name(grpo, colocated, async_engine):
    generation = {"colocated": {"enabled": colocated}, "vllm_cfg": {"async_engine": async_engine}}
    master = {"grpo": grpo, "policy": {"generation": generation}}
    with pytest.raises(MMPOInputError, match=r"cpu_backend\.engine=vllm.*it is"):
        driver._vllm_engine(None, master)


@pytest.mark.one_snapshot
@pytest.mark.beyond_ci  # CI: the Megatron recipe's 50 steps learn with this vLLM engine
def test_fifty_vllm_steps_raise_the_expected_success_of_the_training_problems(
    tmp_path, tiny_warm_starts
):
    """The transformers engine's learning check (``tests/learning_check.py``), with NeMo-RL's
    vLLM generation sampling the rollouts; its margin holds over the vLLM spread's seeds
    (docs/cpu-rig-runs.md). Not in CI (``beyond_ci``): CI's learning checks are the transformers
    recipe's (``test_tiny_learning.py``) and the Megatron recipe's, whose rollouts this same
    vLLM engine samples (``test_tiny_run_megatron.py``); ``NEMO_MMPO_BEYOND_CI=1 bash
    scripts/test_nemo_rl.sh`` runs it."""
    check_fifty_steps_learn("mmpo_tiny_cpu_vllm.yaml", tmp_path, tiny_warm_starts)
