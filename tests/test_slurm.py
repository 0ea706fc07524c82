"""The Slurm templates hand the right command, container and mounts to NeMo-RL's ray.sub."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FAKE_SBATCH = """#!/usr/bin/env bash
{ echo "ARGS=$*"; echo "COMMAND=$COMMAND"; echo "CONTAINER=$CONTAINER"; echo "MOUNTS=$MOUNTS"; \
  echo "PWD=$PWD"; } > "$SBATCH_RECORD"
"""


def submit(script: str, tmp_path: Path, extra_env: dict[str, str], *overrides: str) -> dict:
    fake = tmp_path / "fake_sbatch"
    fake.write_text(FAKE_SBATCH)
    fake.chmod(0o755)
    record = tmp_path / "record.txt"
    env = {
        **os.environ,
        "SBATCH": str(fake),
        "SBATCH_RECORD": str(record),
        "NEMO_RL_HOST_DIR": "/home/me/RL",
        "ACCOUNT": "acct",
        "PARTITION": "batch",
        "PYTHON": sys.executable,
        **extra_env,
    }
    subprocess.run(
        ["bash", str(ROOT / "slurm" / script), *overrides],
        env=env,
        check=True,
        capture_output=True,
    )
    return dict(line.split("=", 1) for line in record.read_text().splitlines())


def test_one_node_template(tmp_path):
    recorded = submit("mmpo_1node.sh", tmp_path, {}, "grpo.adv_estimator.truncation_order=3")
    arguments = shlex.split(recorded["ARGS"])
    assert arguments[-1] == "/home/me/RL/ray.sub"
    for expected in ("--nodes=1", "--account=acct", "--partition=batch", "--gres=gpu:2"):
        assert expected in arguments
    command = recorded["COMMAND"]
    assert "uv run --project /opt/nemo-rl python examples/run_mmpo_math.py" in command
    assert "--config examples/configs/mmpo_math_qwen3_1.7b.yaml" in command
    assert "cluster.num_nodes=1 cluster.gpus_per_node=2" in command
    assert command.endswith("grpo.adv_estimator.truncation_order=3")
    assert recorded["CONTAINER"] == "nvcr.io/nvidia/nemo-rl:v0.7.0"
    assert recorded["MOUNTS"] == f"{ROOT}:{ROOT}"
    assert recorded["PWD"] == str(ROOT)


def test_multinode_template(tmp_path):
    recorded = submit(
        "mmpo_multinode.sh", tmp_path, {"NUM_NODES": "4", "EXTRA_MOUNTS": "/data:/data"}
    )
    arguments = shlex.split(recorded["ARGS"])
    assert "--nodes=4" in arguments and "--gres=gpu:8" in arguments
    assert "cluster.num_nodes=4 cluster.gpus_per_node=8" in recorded["COMMAND"]
    assert "mmpo_math_qwen3_8b_2nodes.yaml" in recorded["COMMAND"]
    assert recorded["MOUNTS"].endswith(",/data:/data")


def test_missing_ray_sub_location_is_explained(tmp_path):
    with pytest.raises(subprocess.CalledProcessError):
        subprocess.run(
            ["bash", str(ROOT / "slurm" / "mmpo_1node.sh")],
            env={**os.environ, "NEMO_RL_HOST_DIR": ""},
            check=True,
            capture_output=True,
        )
    result = subprocess.run(
        ["bash", str(ROOT / "slurm" / "mmpo_1node.sh")],
        env={**os.environ, "NEMO_RL_HOST_DIR": ""},
        capture_output=True,
        text=True,
    )
    assert "NEMO_RL_HOST_DIR" in result.stderr


def test_invalid_override_is_refused_before_submission(tmp_path):
    with pytest.raises(subprocess.CalledProcessError) as error:
        submit("mmpo_1node.sh", tmp_path, {}, "grpo.adv_estimator.name=mmpoo")
    assert error.value.returncode == 2
    assert "grpo.adv_estimator.name='mmpoo'" in error.value.stderr.decode()
    assert "Not submitted" in error.value.stderr.decode()
    assert not (tmp_path / "record.txt").exists()


def test_override_values_with_spaces_survive_the_container_shell(tmp_path):
    recorded = submit("mmpo_1node.sh", tmp_path, {}, "logger.wandb.name=mmpo run 1", "grpo.seed=7")
    words = shlex.split(recorded["COMMAND"])
    assert "logger.wandb.name=mmpo run 1" in words
    assert words[-1] == "grpo.seed=7"


@pytest.mark.parametrize(
    "recipe",
    sorted(path.name for path in (ROOT / "examples" / "configs").glob("*.yaml")),
)
def test_every_recipe_submits(tmp_path, recipe):
    recorded = submit(
        "submit_mmpo.sh", tmp_path, {"CONFIG": f"examples/configs/{recipe}", "NUM_NODES": "2"}
    )
    assert f"--config examples/configs/{recipe}" in recorded["COMMAND"]
