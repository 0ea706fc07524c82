"""The vLLM tiny recipe (``mmpo_tiny_cpu_vllm.yaml``), shortened: NeMo-RL's ``grpo_train`` with
NeMo-RL's own ``VllmGeneration`` on vLLM's CPU build, colocated, refit after every step.

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

import pytest
from in_loop_evaluation import check_in_loop_evaluations
from killed_runs import check_on_policy, check_resumed, run_until_step_then_kill
from learning_check import check_fifty_steps_learn
from nemo_rl_support import CONFIGS_DIR, Console, import_nemo_rl

pytestmark = pytest.mark.nemo_rl
import_nemo_rl("vllm")
import_nemo_rl("nemo_rl.algorithms.grpo")

from nemo_mmpo.cpu import driver
from nemo_mmpo.cpu.curves import reward_curve
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


@pytest.mark.parametrize(
    "grpo, colocated",
    [({"async_grpo": {"enabled": True}}, True), ({}, False)],
    ids=["async", "not-colocated"],
)
def test_vllm_engine_outside_colocated_grpo_train_is_refused_by_name(grpo, colocated):
    master = {"grpo": grpo, "policy": {"generation": {"colocated": {"enabled": colocated}}}}
    with pytest.raises(MMPOInputError, match=r"cpu_backend\.engine=vllm"):
        driver._vllm_engine(None, master)


@pytest.mark.one_snapshot
def test_fifty_vllm_steps_raise_the_expected_success_of_the_training_problems(
    tmp_path, tiny_warm_starts
):
    """The transformers engine's learning check (``tests/learning_check.py``), with NeMo-RL's
    vLLM generation sampling the rollouts; its margin holds over the vLLM spread's seeds
    (docs/cpu-rig.md)."""
    check_fifty_steps_learn("mmpo_tiny_cpu_vllm.yaml", tmp_path, tiny_warm_starts)
