"""``uv run examples/run_mmpo_math.py``, the README's command, run for real with uv from PyPI as a
user of NeMo-RL's container runs it (:func:`killed_runs.as_in_nemo_rls_container`: the prepared
environment as uv's project environment, no sync, nothing downloaded). uv gives the script a
bare environment of its own (the script declares no dependencies); ``--dry-run`` there moves
into NeMo-RL's environment and prints the plan, as training does (the training run through the
same move: ``tests/cpu/test_tiny_run_sync.py``'s killed run). Without a NeMo-RL checkout the
bare environment says in one line what it lacks."""

from __future__ import annotations

import subprocess

import pytest
from killed_runs import REEXECUTED, ROOT, as_in_nemo_rls_container
from nemo_rl_support import import_nemo_rl, nemo_rl_checkout

pytestmark = pytest.mark.nemo_rl
import_nemo_rl("uv")

ENTRY_POINT = ROOT / "examples" / "run_mmpo_math.py"


def uv_run(tmp_path, *arguments: str, **environment: str) -> subprocess.CompletedProcess:
    command, env = as_in_nemo_rls_container()
    env.update(environment)
    return subprocess.run(
        [*command, str(ENTRY_POINT), *arguments],
        cwd=tmp_path,  # --config is relative to where the user runs it
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_uv_run_dry_run_moves_into_nemo_rls_environment_and_plans(tmp_path):
    recipe = ROOT / "examples" / "configs" / "mmpo_tiny_cpu.yaml"
    done = uv_run(
        tmp_path, "--config", str(recipe), "--dry-run", NEMO_RL_PATH=str(nemo_rl_checkout())
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert REEXECUTED in done.stdout
    assert "advantage: nemo-mmpo mmpo" in done.stdout


def test_uv_run_without_nemo_rl_says_what_the_bare_environment_lacks(tmp_path):
    recipe = ROOT / "examples" / "configs" / "mmpo_tiny_cpu.yaml"
    done = uv_run(tmp_path, "--config", str(recipe), "--dry-run", NEMO_RL_PATH=str(tmp_path))
    assert done.returncode == 3, done.stdout[-3000:] + done.stderr[-3000:]
    (line,) = done.stderr.strip().splitlines()[-1:]
    assert "cannot check the plan" in line and "torch" in line
    assert REEXECUTED not in done.stdout
