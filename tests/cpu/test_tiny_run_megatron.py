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

import pytest
from killed_runs import check_on_policy, check_resumed, run_until_step_then_kill
from learning_check import check_gain, fifty_step_overrides
from nemo_rl_support import CONFIGS_DIR, Console, import_nemo_rl

pytestmark = [pytest.mark.nemo_rl, pytest.mark.one_snapshot]
import_nemo_rl("vllm")
import_nemo_rl("megatron.core")
import_nemo_rl("nemo_rl.algorithms.grpo")

from nemo_mmpo.cpu import driver
from nemo_mmpo.recipes import load

RECIPE = "mmpo_tiny_cpu_megatron.yaml"
STEPS = 50


def test_megatron_recipe_is_on_policy_resumes_after_kill_9_and_learns(tmp_path, tiny_warm_starts):
    overrides = [*fifty_step_overrides(tmp_path, tiny_warm_starts), "checkpointing.save_period=2"]
    killed = run_until_step_then_kill(RECIPE, overrides, tmp_path, steps=STEPS, kill_after=3)
    assert "step    2/50" in killed
    assert (tmp_path / "checkpoints" / "step_2").is_dir()

    console = Console()
    config = load(CONFIGS_DIR / RECIPE, overrides).config
    summary = driver.run(config, console=console)
    start = check_resumed(console.lines, summary, STEPS)
    check_on_policy(tmp_path / "logs", start + 1, STEPS)
    check_gain(RECIPE, config, summary, tiny_warm_starts)
