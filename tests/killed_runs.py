"""A recipe's command killed with SIGKILL mid-run, for the tests that resume it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from nemo_rl_support import CONFIGS_DIR

ROOT = Path(__file__).resolve().parents[1]


def run_until_step_then_kill(
    recipe: str, overrides: list[str], out: Path, steps: int, kill_after: int, timeout_s=900
) -> str:
    """``examples/run_mmpo_math.py --config <recipe> <overrides>`` in its own process group,
    killed with SIGKILL once it has printed step ``kill_after`` of ``steps``; returns its
    terminal output (also in ``out/killed_run.txt``)."""
    command = [
        sys.executable,
        str(ROOT / "examples" / "run_mmpo_math.py"),
        "--config",
        str(CONFIGS_DIR / recipe),
        *overrides,
    ]
    output = out / "killed_run.txt"
    with output.open("w") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
        )
        deadline = time.monotonic() + timeout_s
        try:
            while f"step {kill_after:>4}/{steps}" not in output.read_text():
                assert process.poll() is None, output.read_text()[-3000:]
                assert time.monotonic() < deadline, output.read_text()[-3000:]
                time.sleep(1)
        finally:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=60)
    return output.read_text()
