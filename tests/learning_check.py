"""The tiny run's learning check, for either generation engine: 50 of a tiny recipe's GRPO
steps raise the policy's expected success on the first 512 training problems by more than
:data:`MARGIN`.

Expected success (:func:`nemo_mmpo.cpu.rig.measure.expected_success`) is the probability that one
sample is exactly the correct answer, computed from the policy's log-probabilities: it has no
sampling noise, so what varies between machines is only the run itself. The margin comes from
the spread of that gain over 13 runs of the transformers engine: 5 seeds with the default
numerics, and seeds 0 and 1 with AVX2 kernels, a float64 warm start, a warm start by Python
3.11's torch 2.13, and one thread (``nemo-mmpo cpu spread``, docs/cpu-rig.md, "It learns on any
machine", 2026-11-23): the smallest gain at step 50 there (default, seed 4), divided by
:data:`SAFETY`. The vLLM engine's spread over five other seeds is in the same section.
"""

from __future__ import annotations

import json
from pathlib import Path

from nemo_rl_support import CONFIGS_DIR

#: The smallest gain at step 50 over the spread's 13 runs, on the first 512 training problems.
SMALLEST_SPREAD_GAIN = 0.014
SAFETY = 2.0
MARGIN = SMALLEST_SPREAD_GAIN / SAFETY


class Quiet:
    def write(self, text):
        pass

    def flush(self):
        pass


def fifty_step_overrides(tmp_path: Path, warm_starts: Path) -> list[str]:
    """A tiny recipe's overrides for the check: 50 steps, no evaluation, a checkpoint at the
    end, seed 0 from the shared warm-start cache."""
    return [
        "grpo.max_num_steps=50",
        "grpo.val_period=0",
        "grpo.val_at_start=false",
        "evaluation.enabled=false",
        "checkpointing.save_period=50",
        "checkpointing.metric_name=null",
        f"checkpointing.checkpoint_dir={tmp_path / 'checkpoints'}",
        f"logger.log_dir={tmp_path / 'logs'}",
        f"cpu_backend.warm_start_cache={warm_starts}",
    ]


def check_fifty_steps_learn(recipe: str, tmp_path: Path, warm_starts: Path) -> None:
    """Run ``recipe`` (a file of ``examples/configs``) for 50 steps, seed 0, from the shared
    warm-start cache, and check the gain in expected success."""
    from nemo_mmpo.cpu.rig import driver
    from nemo_mmpo.recipes import load

    config = load(CONFIGS_DIR / recipe, fifty_step_overrides(tmp_path, warm_starts)).config
    summary = driver.run(config, console=Quiet())
    check_gain(recipe, config, summary, warm_starts)


def check_gain(recipe: str, config: dict, summary: dict, warm_starts: Path) -> None:
    """The run's last checkpoint (``summary``, from the driver) beats its warm start's
    expected success on the first 512 training problems by more than :data:`MARGIN`."""
    from transformers import LlamaForCausalLM

    from nemo_mmpo.cpu.rig.measure import expected_success
    from nemo_mmpo.cpu.rig.model import char_tokenizer
    from nemo_mmpo.cpu.rig.rig_settings import TinySettings
    from nemo_mmpo.cpu.rig.task import AdditionTask

    settings = TinySettings.from_config(config["cpu_backend"])
    spec = settings.warm_start_spec(config["policy"]["generation"])
    info = Path(warm_starts) / spec.key() / "warm_start.json"
    tokenizer = char_tokenizer()
    problems = AdditionTask().split()[0][:512]
    before = LlamaForCausalLM.from_pretrained(info.parent).float().eval()
    after = LlamaForCausalLM.from_pretrained(summary["checkpoint"]).float().eval()
    gain = expected_success(after, tokenizer, problems) - expected_success(
        before, tokenizer, problems
    )
    record = json.loads(info.read_text())["result"]
    assert gain > MARGIN, (
        f"{recipe}: 50 steps raised the expected success by {gain:+.4f}, not more than "
        f"{MARGIN:.4f} (warm start: {record['steps']} steps, sampled success "
        f"{record['success']:.3f})"
    )
