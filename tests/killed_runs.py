"""A recipe's command killed with SIGKILL mid-run, for the tests that resume it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import patience
from nemo_rl_support import CONFIGS_DIR

ROOT = Path(__file__).resolve().parents[1]
#: what ``examples/run_mmpo_math.py`` prints when it moves into NeMo-RL's environment
REEXECUTED = "re-running in NeMo-RL's environment"


def as_in_nemo_rls_container() -> tuple[list[str], dict[str, str]]:
    """``uv run`` as a user of NeMo-RL's container runs it: uv (PyPI's, in NeMo-RL's
    environment here as in the container) with the container's variables, the project
    environment being the prepared one this test runs in (``UV_PROJECT_ENVIRONMENT``,
    ``UV_NO_SYNC=1``: NeMo-RL's ``docker/Dockerfile`` sets both), and nothing downloaded
    (``UV_OFFLINE``, ``UV_PYTHON_DOWNLOADS=never``). Returns the command's start and its
    environment."""
    from uv import find_uv_bin

    uv = find_uv_bin()
    environment = dict(
        os.environ,
        UV_PROJECT_ENVIRONMENT=sys.prefix,
        UV_NO_SYNC="1",
        UV_LINK_MODE="copy",
        UV_OFFLINE="1",
        UV_PYTHON_DOWNLOADS="never",
        PATH=os.pathsep.join(
            [os.path.dirname(uv), str(Path(sys.prefix) / "bin"), os.environ["PATH"]]
        ),
    )
    return [uv, "run"], environment


def run_until_step_then_kill(
    recipe: str,
    overrides: list[str],
    out: Path,
    steps: int,
    kill_after: int,
    timeout_s=patience.RUN_S,
    until: str | None = None,
) -> str:
    """``uv run examples/run_mmpo_math.py --config <recipe> <overrides>`` (the README's command,
    as in NeMo-RL's container: :func:`as_in_nemo_rls_container`; uv's bare script environment
    re-executes it in NeMo-RL's) in its own process group, killed with SIGKILL once it has
    printed step ``kill_after`` of ``steps`` (or the text ``until``); returns its terminal
    output (also in ``out/killed_run.txt``)."""
    until = until or f"step {kill_after:>4}/{steps}"
    uv_run, environment = as_in_nemo_rls_container()
    command = [
        *uv_run,
        str(ROOT / "examples" / "run_mmpo_math.py"),
        "--config",
        str(CONFIGS_DIR / recipe),
        *overrides,
    ]
    terminal = run_then_kill(command, ROOT, environment, out / "killed_run.txt", until, timeout_s)
    assert REEXECUTED in terminal, terminal[-3000:]  # uv's script environment moved to NeMo-RL's
    return terminal


def run_then_kill(
    command: list[str],
    cwd: Path,
    environment: dict,
    output: Path,
    until: str,
    timeout_s=patience.RUN_S,
) -> str:
    """``command`` run in ``cwd`` in its own process group, its terminal output into
    ``output``, killed with SIGKILL once it printed ``until``; returns that output."""
    with output.open("w") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=environment,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        try:
            while until not in output.read_text():
                assert process.poll() is None, output.read_text()[-3000:]
                assert time.monotonic() < deadline, output.read_text()[-3000:]
                time.sleep(1)
        finally:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=60)
    return output.read_text()


def check_terminal_shows_our_lines_only(terminal: str, log_dir: Path, printed_steps: int) -> None:
    """The recipe as a person runs it (a subprocess, real file descriptors, its engines' own
    processes too): NeMo-RL's output, "Skipping aggregation" lines included, lands in
    ``<log_dir>/nemo_rl.log``; the ``terminal`` (stdout and stderr) shows the plan, the warm
    start and one line per step, the first ``printed_steps`` of them at least."""
    from nemo_mmpo.cpu.rig.driver import NEMO_RL_LOG

    lines = terminal.splitlines()
    steps = [int(line.split()[1].split("/")[0]) for line in lines if line.startswith("step ")]
    assert len(steps) >= printed_steps, terminal[-3000:]
    assert steps == list(range(1, len(steps) + 1)), terminal[-3000:]  # each step once, in order
    assert "Skipping aggregation" not in terminal
    log = (log_dir / NEMO_RL_LOG).read_text()
    assert "Skipping aggregation" in log or "Computing advantages" in log
    # the plan (~20 lines), the warm start (<= 15 measurements) and the steps printed
    assert len(lines) < 40 + len(steps), terminal[-3000:]


#: float32 policy and engine, on-policy: NeMo-RL's errors sit at their ideal values to ~1e-6
ON_POLICY_BOUND = 1e-3


def check_resumed(lines: list[str], summary: dict, steps: int) -> int:
    """The driver's printed ``lines`` of the resumed run: it resumed from an even step (a
    checkpoint every 2 steps) at or after step 2, printed every later step once, and ended with
    the checkpoint of ``steps``. Returns the step it resumed from."""
    (resume_line,) = [line for line in lines if "resuming from" in line]
    start = int(resume_line.rsplit("step_", 1)[1].split()[0].rstrip("/):,."))
    assert start >= 2 and start % 2 == 0, resume_line
    progress = [line.split()[1] for line in lines if line.startswith("step ")]
    assert progress == [f"{step}/{steps}" for step in range(start + 1, steps + 1)]
    assert Path(summary["checkpoint"]).parent.parent.name == f"step_{steps}"
    return start


def check_on_policy(logs: Path, first: int, last: int) -> None:
    """NeMo-RL's ``token_mult_prob_error`` within :data:`ON_POLICY_BOUND` of 1 and
    ``gen_kl_error`` of 0 at every logged step, steps ``first`` to ``last`` among them (a
    killed run's last events may be lost unflushed)."""
    from nemo_mmpo.cpu.spread.curves import reward_curve

    errors = dict(reward_curve(logs, "train/token_mult_prob_error"))
    kl = dict(reward_curve(logs, "train/gen_kl_error"))
    assert set(range(first, last + 1)) <= set(errors)
    assert all(abs(value - 1.0) < ON_POLICY_BOUND for value in errors.values()), errors
    assert all(abs(value) < ON_POLICY_BOUND for value in kl.values()), kl
