"""The vLLM tiny recipe (``mmpo_tiny_cpu_vllm.yaml``), shortened: NeMo-RL's ``grpo_train`` with
NeMo-RL's own ``VllmGeneration`` on vLLM's CPU build, colocated, refit after every step.

What holds by construction: the rollouts are on-policy (vLLM samples from the weights the
policy computes log-probs with, both float32, refit before every generation), so NeMo-RL's own
``token_mult_prob_error`` is 1 and ``gen_kl_error`` 0 up to float32 rounding (measured on
v0.7.0: 1 + 1.2e-7 and 2e-9 at each of three steps; the bound 1e-3 is float32 numerics with a
wide margin, not a threshold read off a run);
a second run of the same command resumes at the saved step with vLLM in the loop.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from nemo_rl_support import CONFIGS_DIR, import_nemo_rl

pytestmark = pytest.mark.nemo_rl
import_nemo_rl("vllm")
import_nemo_rl("nemo_rl.algorithms.grpo")

from nemo_mmpo.cpu import driver
from nemo_mmpo.cpu.curves import reward_curve
from nemo_mmpo.recipes import load

#: float32 policy and engine, on-policy: NeMo-RL's errors sit at their ideal values to ~1e-6
ON_POLICY_BOUND = 1e-3


class Console:
    def __init__(self):
        self.lines = []

    def write(self, text):
        self.lines.extend(line for line in text.splitlines() if line)

    def flush(self):
        pass


def recipe(tmp_path, warm_starts, steps):
    overrides = [
        f"grpo.max_num_steps={steps}",
        "checkpointing.save_period=2",
        f"checkpointing.checkpoint_dir={tmp_path / 'checkpoints'}",
        f"logger.log_dir={tmp_path / 'logs'}",
        f"cpu_backend.warm_start_cache={warm_starts}",
    ]
    return load(CONFIGS_DIR / "mmpo_tiny_cpu_vllm.yaml", overrides).config


def test_vllm_recipe_is_on_policy_and_resumes(tmp_path, tiny_warm_starts):
    console = Console()
    first = driver.run(recipe(tmp_path, tiny_warm_starts, 2), console=console)
    assert Path(first["checkpoint"]).parent.parent.name == "step_2"
    progress = [line for line in console.lines if line.startswith("step ")]
    assert [line.split()[1] for line in progress] == ["1/2", "2/2"]

    resumed = Console()
    driver.run(recipe(tmp_path, tiny_warm_starts, 3), console=resumed)
    assert any("resuming from" in line for line in resumed.lines)
    assert [line.split()[1] for line in resumed.lines if line.startswith("step ")] == ["3/3"]

    logs = tmp_path / "logs"
    errors = reward_curve(logs, "train/token_mult_prob_error")
    kl = reward_curve(logs, "train/gen_kl_error")
    assert [step for step, _ in errors] == [1, 2, 3]
    assert all(abs(value - 1.0) < ON_POLICY_BOUND for _, value in errors), errors
    assert all(abs(value) < ON_POLICY_BOUND for _, value in kl), kl
    rewards = [value for _, value in reward_curve(logs, "train/reward")]
    assert len(rewards) == 3 and 0 < sum(rewards) / 3 < 1  # graded samples, mixed outcomes
