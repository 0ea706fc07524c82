"""The tiny run learns, on any machine: 50 of the recipe's GRPO steps raise the policy's
expected success on the training problems by at least :data:`MARGIN`.

Expected success (:func:`nemo_mmpo.cpu.measure.expected_success`) is the probability that one
sample is exactly the correct answer, computed from the policy's log-probabilities: it has no
sampling noise, so what varies between machines is only the run itself. The margin comes from
the spread of that gain over 13 runs: 5 seeds with the default numerics, and seeds 0 and 1 with
AVX2 kernels, a float64 warm start, a warm start by Python 3.11's torch 2.13, and one thread
(``nemo-mmpo cpu spread``, README, "It learns on any machine", 2026-11-23): the smallest gain
at step 50 there (default, seed 4), divided by :data:`SAFETY`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from nemo_rl_support import CONFIGS_DIR, import_nemo_rl

pytestmark = [pytest.mark.nemo_rl, pytest.mark.one_snapshot]
import_nemo_rl("nemo_rl.algorithms.grpo")

from nemo_mmpo.cpu import driver
from nemo_mmpo.cpu.measure import expected_success
from nemo_mmpo.cpu.model import char_tokenizer
from nemo_mmpo.cpu.rig_settings import TinySettings
from nemo_mmpo.cpu.task import AdditionTask
from nemo_mmpo.recipes import load

#: The smallest gain at step 50 over the spread's 13 runs, on the first 512 training problems.
SMALLEST_SPREAD_GAIN = 0.014
SAFETY = 2.0
MARGIN = SMALLEST_SPREAD_GAIN / SAFETY


class Quiet:
    def write(self, text):
        pass

    def flush(self):
        pass


def test_fifty_steps_raise_the_expected_success_of_the_training_problems(
    ray_cluster, tmp_path, tiny_warm_starts
):
    from transformers import LlamaForCausalLM

    config = load(
        CONFIGS_DIR / "mmpo_tiny_cpu.yaml",
        [
            "grpo.max_num_steps=50",
            "grpo.val_period=0",
            "grpo.val_at_start=false",
            "evaluation.enabled=false",
            "checkpointing.save_period=50",
            "checkpointing.metric_name=null",
            f"checkpointing.checkpoint_dir={tmp_path / 'checkpoints'}",
            f"logger.log_dir={tmp_path / 'logs'}",
            f"cpu_backend.warm_start_cache={tiny_warm_starts}",
        ],
    ).config
    summary = driver.run(config, console=Quiet())
    settings = TinySettings.from_config(config["cpu_backend"])
    spec = settings.warm_start_spec(config["policy"]["generation"])
    info = Path(tiny_warm_starts) / spec.key() / "warm_start.json"
    tokenizer = char_tokenizer()
    problems = AdditionTask().split()[0][:512]
    before = LlamaForCausalLM.from_pretrained(info.parent).float().eval()
    after = LlamaForCausalLM.from_pretrained(summary["checkpoint"]).float().eval()
    gain = expected_success(after, tokenizer, problems) - expected_success(
        before, tokenizer, problems
    )
    record = json.loads(info.read_text())["result"]
    assert gain > MARGIN, (
        f"50 steps raised the expected success by {gain:+.4f}, not more than {MARGIN:.4f} "
        f"(warm start: {record['steps']} steps, sampled success {record['success']:.3f})"
    )
