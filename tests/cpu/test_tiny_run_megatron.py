"""The Megatron tiny recipe (``mmpo_tiny_cpu_megatron.yaml``): NeMo-RL's ``grpo_train`` with
NeMo-RL's own ``Policy`` -> ``MegatronPolicyWorker`` actors (tensor parallel 2, the model
imported from the warm start's Hugging Face folder by Megatron-Bridge) and NeMo-RL's
``VllmGeneration`` on vLLM's CPU build, refit from the workers' export after every step.

What holds by construction: every step is on-policy (vLLM samples from the weights the workers
export, both float32, so NeMo-RL's ``token_mult_prob_error`` is 1 and ``gen_kl_error`` 0 up to
float32 rounding; a wrong name, shard or refit would put them far off); a run killed with
SIGKILL resumes from the workers' own Megatron checkpoint (``torch_dist``) at the saved step
and runs every later step once. What is measured over seeds: the learning check
(``tests/learning_check.py``'s margin) on the release snapshot, 50 steps; the other snapshot
runs six steps with DMPO's loss.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from killed_runs import check_on_policy, check_resumed, run_until_step_then_kill
from learning_check import check_gain, fifty_step_overrides
from nemo_rl_support import CONFIGS_DIR, Console, import_nemo_rl, nemo_rl_checkout

pytestmark = pytest.mark.nemo_rl
import_nemo_rl("vllm")
import_nemo_rl("megatron.core")
import_nemo_rl("nemo_rl.algorithms.grpo")

from nemo_mmpo.cpu.engines import megatron_policy
from nemo_mmpo.cpu.rig import driver
from nemo_mmpo.recipes import load

RECIPE = "mmpo_tiny_cpu_megatron.yaml"
STEPS = 50
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


def kill_and_resume(recipe_overrides: list[str], tmp_path, steps: int) -> tuple[list, dict, int]:
    """The recipe killed with SIGKILL once step 3 is printed (after step 2's checkpoint), then
    the same command resumed to ``steps``: ``(printed lines, summary, step resumed from)``."""
    killed = run_until_step_then_kill(RECIPE, recipe_overrides, tmp_path, steps, kill_after=3)
    assert f"step    2/{steps}" in killed
    assert (tmp_path / "checkpoints" / "step_2" / "policy" / "weights").is_dir()
    console = Console()
    config = load(CONFIGS_DIR / RECIPE, recipe_overrides).config
    summary = driver.run(config, console=console)
    start = check_resumed(console.lines, summary, steps)
    check_on_policy(tmp_path / "logs", start + 1, steps)
    return console.lines, summary, start


@pytest.mark.one_snapshot
def test_megatron_recipe_is_on_policy_resumes_after_kill_9_and_learns(
    request, tmp_path, tiny_warm_starts
):
    overrides = [*fifty_step_overrides(tmp_path, tiny_warm_starts), "checkpointing.save_period=2"]
    _, summary, start = kill_and_resume(overrides, tmp_path, STEPS)
    config = load(CONFIGS_DIR / RECIPE, overrides).config
    # the worker's Megatron checkpoint, converted by NeMo-RL's own converter
    exported = megatron_policy.export_hugging_face(
        Path(summary["checkpoint"]), tmp_path / "checkpoints" / "hf_start", tmp_path / "hf_50"
    )
    check_gain(RECIPE, config, {"checkpoint": str(exported)}, tiny_warm_starts)
    report(
        request,
        f"megatron-worker {nemo_rl_checkout().name}: NeMo-RL's MegatronPolicyWorker (TP2) trained "
        f"{RECIPE} with mmpo for {STEPS} steps, killed and resumed from its Megatron checkpoint "
        f"of step {start}, on-policy at every step, learned",
    )


def test_megatron_recipe_with_dmpo_is_on_policy_and_resumes_after_kill_9(
    request, tmp_path, tiny_warm_starts
):
    """Six steps with DMPO's loss on the snapshot the 50-step test does not run on."""
    if nemo_rl_checkout().name.endswith("v0.7.0"):
        pytest.skip("the release snapshot runs the 50-step test above (mmpo) instead")
    steps = 6
    overrides = [
        *fifty_step_overrides(tmp_path, tiny_warm_starts),
        f"grpo.max_num_steps={steps}",
        "checkpointing.save_period=2",
        *DMPO,
    ]
    _, _, start = kill_and_resume(overrides, tmp_path, steps)
    report(
        request,
        f"megatron-worker {nemo_rl_checkout().name}: NeMo-RL's MegatronPolicyWorker (TP2) trained "
        f"{RECIPE} with dmpo for {steps} steps, killed and resumed from its Megatron checkpoint "
        f"of step {start}, on-policy at every step",
    )
