"""The checkpoint watcher on a live tiny run, killed and restarted: it evaluates each checkpoint
once, as it appears, and loses and repeats no sample.

A tiny CPU run trains in one process (NeMo-RL's ``grpo_train``, a checkpoint every 5 steps, no
in-loop evaluation); ``nemo-mmpo eval watch --follow --backend hf`` starts beside it before the
first checkpoint exists, and is killed with SIGKILL in the middle of its work (a step's rollouts
half written) and started again, twice. At the end every checkpoint's step is evaluated exactly
once: every (problem, sample) of each step appears once, each step's numbers equal what the
report computes from its rollouts, TensorBoard has each step, and ``best/`` holds the weights of
the step the paper's rule selects.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import in_loop_evaluation
import patience
import pytest
from nemo_rl_support import CONFIGS_DIR, import_nemo_rl

pytestmark = pytest.mark.nemo_rl
import_nemo_rl("nemo_rl.algorithms.grpo")

from nemo_mmpo.cpu.spread.curves import reward_curve
from nemo_mmpo.eval.protocol import read_steps
from nemo_mmpo.eval.rollouts import load_run

ROOT = CONFIGS_DIR.parents[1]
PROBLEMS, SAMPLES, STEPS = 240, 2, 15


def overrides(tmp_path: Path, warm_starts: Path) -> list[str]:
    return [
        f"grpo.max_num_steps={STEPS}",
        "grpo.val_period=0",
        "grpo.val_at_start=false",
        "evaluation.in_loop=false",
        f"evaluation.samples={SAMPLES}",
        f"evaluation.output_dir={tmp_path / 'evaluation'}",
        "checkpointing.save_period=5",
        "checkpointing.keep_top_k=1000",
        "checkpointing.metric_name=null",
        f"checkpointing.checkpoint_dir={tmp_path / 'checkpoints'}",
        f"logger.log_dir={tmp_path / 'logs'}",
        f"cpu_backend.warm_start_cache={warm_starts}",
    ]


def start_watcher(tmp_path: Path, warm_starts: Path) -> subprocess.Popen:
    """The watcher as a user starts it beside a live run: following its checkpoints."""
    follow = ["--backend", "hf", "--follow", "--poll-seconds", "0.5", "--idle-seconds", "600"]
    recipe = CONFIGS_DIR / "mmpo_tiny_cpu.yaml"
    return in_loop_evaluation.start_watcher(
        recipe, follow, overrides(tmp_path, warm_starts), tmp_path / "watch.log"
    )


def half_written_step(evaluation: Path) -> int | None:
    """A step whose rollouts have lines but whose numbers are not written yet."""
    for rollouts in evaluation.glob("step_*.jsonl"):
        step = int(rollouts.stem.removeprefix("step_"))
        if rollouts.stat().st_size > 0 and not (evaluation / f"step_{step}.json").exists():
            return step
    return None


@pytest.mark.one_snapshot
# CI time: in CI the watcher is killed mid-step and resumed on the Megatron recipe's NeMo-RL
# checkpoint with vLLM (tests/cpu/test_tiny_run_megatron.py), and its follow loop runs on
# recorded engines (tests/eval/test_watch_engines.py); this live run on request
@pytest.mark.beyond_ci
def test_the_watcher_survives_kill_9_and_evaluates_every_checkpoint_once(
    tmp_path, tiny_warm_starts
):
    evaluation = tmp_path / "evaluation"
    watcher = start_watcher(tmp_path, tiny_warm_starts)  # before training: nothing to evaluate
    training = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "examples" / "run_mmpo_math.py"),
            "--config",
            str(CONFIGS_DIR / "mmpo_tiny_cpu.yaml"),
            *overrides(tmp_path, tiny_warm_starts),
        ],
        cwd=ROOT,
        env=in_loop_evaluation.user_environment(),
        stdout=open(tmp_path / "training.log", "w"),
        stderr=subprocess.STDOUT,
    )
    kills, deadline = [], time.monotonic() + patience.RUN_S
    try:
        while len(kills) < 2 and time.monotonic() < deadline and watcher.poll() is None:
            step = half_written_step(evaluation)
            if step is not None and step not in kills:
                watcher.send_signal(signal.SIGKILL)
                watcher.wait()
                kills.append(step)
                watcher = start_watcher(tmp_path, tiny_warm_starts)
            time.sleep(0.05)
        assert training.wait(timeout=patience.RUN_S) == 0, (tmp_path / "training.log").read_text()[
            -3000:
        ]
        assert watcher.wait(timeout=patience.RUN_S) == 0, (tmp_path / "watch.log").read_text()[
            -3000:
        ]
    finally:
        for process in (watcher, training):
            if process.poll() is None:
                process.kill()
    assert kills, "the watcher was never caught half-way through a step"

    steps = read_steps(evaluation)
    assert sorted(steps) == [5, 10, 15]
    for step, numbers in steps.items():
        lines = [json.loads(line) for line in (evaluation / f"step_{step}.jsonl").open()]
        keys = [(line["problem_id"], line["sample"]) for line in lines]
        assert len(keys) == len(set(keys)) == PROBLEMS * SAMPLES  # none lost, none repeated
        counts = load_run([evaluation / f"step_{step}.jsonl"])
        assert numbers["accuracy"] == pytest.approx(counts.correct.sum() / counts.samples.sum())
        assert numbers["tensorboard"] is True
        logged = dict(reward_curve(tmp_path / "logs", "validation/paper/average"))
        assert logged[step] == pytest.approx(numbers["average"])
    best = max(steps.values(), key=lambda entry: (entry["average"], -entry["step"]))
    marker = json.loads((evaluation / "best" / "nemo_mmpo_best.json").read_text())
    assert marker["step"] == best["step"] and (evaluation / "best" / "config.json").is_file()
    summary = json.loads((evaluation / "run_summary.json").read_text())
    assert summary["selected"]["step"] == best["step"] and summary["final"]["step"] == STEPS
