"""The Megatron tiny recipe (``mmpo_tiny_cpu_megatron.yaml``): NeMo-RL's ``grpo_train`` with
the policy in megatron-core (tensor parallel 2 over two rank actors, NeMo-RL's Megatron train
step) and NeMo-RL's ``VllmGeneration`` on vLLM's CPU build, refit from the Megatron weights.

One run, 50 steps, killed with SIGKILL once step 3 is printed and resumed by the same recipe;
what holds by construction: every step is on-policy (vLLM samples from the gathered Megatron
weights under Hugging Face names, both float32, so NeMo-RL's ``token_mult_prob_error`` is 1 and
``gen_kl_error`` 0 up to float32 rounding; a wrong name, shard or refit would put them far
off), the resumed run continues from the newest checkpoint to the end. What is measured over
seeds: the learning check (``tests/learning_check.py``'s margin; the Megatron recipe's spread
over other seeds, uninterrupted, is in docs/cpu-rig.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from killed_runs import run_until_step_then_kill
from learning_check import check_gain, fifty_step_overrides
from nemo_rl_support import CONFIGS_DIR, Console, import_nemo_rl

pytestmark = [pytest.mark.nemo_rl, pytest.mark.one_snapshot]
import_nemo_rl("vllm")
import_nemo_rl("megatron.core")
import_nemo_rl("nemo_rl.algorithms.grpo")

from nemo_mmpo.cpu import driver
from nemo_mmpo.cpu.curves import reward_curve
from nemo_mmpo.recipes import load

RECIPE = "mmpo_tiny_cpu_megatron.yaml"
STEPS = 50
#: float32 policy and engine, on-policy: NeMo-RL's errors sit at their ideal values to ~1e-6
ON_POLICY_BOUND = 1e-3


def test_megatron_recipe_is_on_policy_resumes_after_kill_9_and_learns(tmp_path, tiny_warm_starts):
    overrides = [*fifty_step_overrides(tmp_path, tiny_warm_starts), "checkpointing.save_period=2"]
    killed = run_until_step_then_kill(RECIPE, overrides, tmp_path, steps=STEPS, kill_after=3)
    assert "step    2/50" in killed
    assert (tmp_path / "checkpoints" / "step_2").is_dir()

    console = Console()
    config = load(CONFIGS_DIR / RECIPE, overrides).config
    summary = driver.run(config, console=console)
    (resume_line,) = [line for line in console.lines if "resuming from" in line]
    start = int(resume_line.rsplit("step_", 1)[1].split()[0].rstrip("/):,."))
    assert start >= 2 and start % 2 == 0, resume_line
    progress = [line.split()[1] for line in console.lines if line.startswith("step ")]
    assert progress == [f"{step}/{STEPS}" for step in range(start + 1, STEPS + 1)]
    assert Path(summary["checkpoint"]).parent.parent.name == f"step_{STEPS}"

    logs = tmp_path / "logs"
    errors = dict(reward_curve(logs, "train/token_mult_prob_error"))
    kl = dict(reward_curve(logs, "train/gen_kl_error"))
    assert set(range(start + 1, STEPS + 1)) <= set(errors)
    assert all(abs(value - 1.0) < ON_POLICY_BOUND for value in errors.values()), errors
    assert all(abs(value) < ON_POLICY_BOUND for value in kl.values()), kl
    check_gain(RECIPE, config, summary, tiny_warm_starts)
