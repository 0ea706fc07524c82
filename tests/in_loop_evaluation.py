"""The paper's evaluation inside NeMo-RL's loop, checked on a finished CPU run: what NeMo-RL's
logger wrote to TensorBoard equals ``nemo-mmpo eval report`` on the same rollouts, and NeMo-RL's
checkpoint manager recorded the paper's average for its selection. Used by the tiny runs of
both generation engines (``tests/cpu/test_tiny_run.py``, ``tests/cpu/test_tiny_run_vllm.py``);
and :func:`start_watcher`, ``nemo-mmpo eval watch`` on a run's checkpoints as a user starts it
(``tests/cpu/test_watch.py``, ``tests/cpu/test_tiny_run_megatron.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_mmpo.cpu.spread.curves import reward_curve

#: the tiny task's held-out problems (every one is evaluated)
HELD_OUT_PROBLEMS = 240
#: the checkout's root: the watcher runs from it, as a user's command does
ROOT = Path(__file__).resolve().parents[1]


def start_watcher(recipe: Path, watch_args: list[str], overrides: list[str], log: Path):
    """``python -m nemo_mmpo.eval watch --config <recipe> <watch_args> <overrides>`` in its own
    process group (a test kills it with ``os.killpg``), its output appended to ``log``, in
    :func:`user_environment`. Returns the ``subprocess.Popen``."""
    command = [
        sys.executable,
        "-m",
        "nemo_mmpo.eval",
        "watch",
        "--config",
        str(recipe),
        *watch_args,
        *overrides,
    ]
    with log.open("a") as output:  # the child keeps its own descriptor
        return subprocess.Popen(
            command,
            cwd=ROOT,
            env=user_environment(),
            stdout=output,
            stderr=output,
            start_new_session=True,
        )


def user_environment() -> dict[str, str]:
    """This process's environment without the test session's ``RAY_ADDRESS``: a command started
    with it starts its own Ray, as a user's does."""
    return {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}


def check_in_loop_evaluations(run_dir: Path, steps: tuple[int, ...], samples: int) -> None:
    """The evaluations at ``steps`` (``samples`` per problem) of the run in ``run_dir``
    (``logs/`` and ``checkpoints/`` inside), the last of which a checkpoint recorded."""
    from nemo_mmpo.eval.metrics import pass_at_k
    from nemo_mmpo.eval.report import load_runs, write_report

    evaluation = run_dir / "logs" / "evaluation"
    for step in steps:
        rollouts = evaluation / f"step_{step}.jsonl"
        runs = load_runs([f"step{step}={rollouts}"], progress=False)
        report = json.loads(write_report(runs, run_dir / "report").with_suffix(".json").read_text())
        logged = {
            key: value
            for key in (
                "average",
                "accuracy",
                "never_solved",
                *(f"arithmetic/pass@{k}" for k in (1, 2, 4)),
            )
            for (at, value) in reward_curve(run_dir / "logs", f"validation/paper/{key}")
            if at == step
        }
        # the report's pass@1 is the mean over problems of correct / samples: avg@n
        theirs = report["pass_at_k"][f"step{step}"]["arithmetic"]
        assert logged["average"] == pytest.approx(theirs["pass@1"], rel=1e-6)
        assert logged["accuracy"] == pytest.approx(theirs["pass@1"], rel=1e-6)
        for k in (1, 4):  # the report's table has k = 1, 4, 8, 16 (those <= samples here)
            assert logged[f"arithmetic/pass@{k}"] == pytest.approx(theirs[f"pass@{k}"], rel=1e-6)
        counts = runs[f"step{step}"]  # pass@2: the report's pass@k on the report's counts
        assert logged["arithmetic/pass@2"] == pytest.approx(
            float(pass_at_k(counts.samples, counts.correct, 2).mean()), rel=1e-6
        )
        assert logged["never_solved"] == pytest.approx(
            report["first_success"][f"step{step}"]["never_solved"], rel=1e-6, abs=1e-9
        )
        gini = {row["alpha"]: row["gini"][f"step{step}"] for row in report["gini"]}
        numbers = json.loads((evaluation / f"step_{step}.json").read_text())
        assert numbers["gini"]["alpha_0"] == pytest.approx(gini[0.0], rel=1e-9)
        assert numbers["gini"]["alpha_0.1"] == pytest.approx(gini[0.1], rel=1e-9)
        # every problem, every sample
        assert len(rollouts.read_text().splitlines()) == HELD_OUT_PROBLEMS * samples
    checkpoint = run_dir / "checkpoints" / f"step_{steps[-1]}" / "training_info.json"
    recorded = json.loads(checkpoint.read_text())["val:paper/average"]
    assert recorded == pytest.approx(
        json.loads((evaluation / f"step_{steps[-1]}.json").read_text())["average"]
    )
