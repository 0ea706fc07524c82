"""The Slurm templates hand the right command, container and mounts to NeMo-RL's ray.sub.

A stand-in ``sbatch`` records what it is given, and a stand-in ``sinfo`` says the partition's
GRES (``FAKE_GRES``, default ``gpu:8``, for partition ``batch``); the check before submission runs
for real, with NeMo-RL's config loader read from the checkout ``NEMO_RL_HOST_DIR`` names (the
login node's).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import patience
import pytest
from nemo_rl_support import nemo_rl_checkout

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "nemo_mmpo" / "configs"
FAKE_SBATCH = """#!/usr/bin/env bash
{ echo "ARGS=$*"; echo "COMMAND=$COMMAND"; echo "CONTAINER=$CONTAINER"; echo "MOUNTS=$MOUNTS"; \
  echo "PWD=$PWD"; echo "JOB_PATH=$PATH"; echo "JOB_MARKER=${MMPO_TEST_MARKER:-}"; \
  echo "RAY_SUB=$MMPO_RAY_SUB"; echo "CHECKPOINT_DIR=$MMPO_CHECKPOINT_DIR"; \
  echo "RAY_SUB_GPUS=$GPUS_PER_NODE"; \
} > "$SBATCH_RECORD"
"""
# sinfo -p PARTITION -h -o %G: FAKE_GRES's lines for partition batch, nothing for another;
# sinfo -h -o %R: the partitions
FAKE_SINFO = """#!/usr/bin/env bash
if [[ -n "${FAKE_SINFO_FAILS:-}" ]]; then echo "$FAKE_SINFO_FAILS" >&2; exit 1; fi
case "$*" in
  "-p batch -h -o %G") printf '%s\\n' "${FAKE_GRES-gpu:8}" ;;
  "-p "*" -h -o %G") ;;
  "-h -o %R") printf 'batch\\ndebug\\n' ;;
  *) echo "sinfo stand-in: unexpected arguments $*" >&2; exit 1 ;;
esac
"""


def submit(
    script: str, tmp_path: Path, extra_env: dict[str, str], *overrides: str, cwd: Path = ROOT
) -> dict:
    """What the stand-in sbatch was given, and the script's standard error as ``STDERR``."""
    fake = tmp_path / "fake_sbatch"
    fake.write_text(FAKE_SBATCH)
    fake.chmod(0o755)
    stand_ins = tmp_path / "bin"
    stand_ins.mkdir(exist_ok=True)
    (stand_ins / "sinfo").write_text(FAKE_SINFO)
    (stand_ins / "sinfo").chmod(0o755)
    record = tmp_path / "record.txt"
    env = {
        **os.environ,
        "PATH": f"{stand_ins}:{os.environ['PATH']}",
        "SBATCH": str(fake),
        "SBATCH_RECORD": str(record),
        "NEMO_RL_HOST_DIR": str(nemo_rl_checkout()),
        "ACCOUNT": "acct",
        "PARTITION": "batch",
        "PYTHON": sys.executable,
        **extra_env,
    }
    result = subprocess.run(
        ["bash", str(ROOT / "slurm" / script), *overrides],
        env=env,
        check=True,
        capture_output=True,
        cwd=cwd,
    )
    recorded = dict(line.split("=", 1) for line in record.read_text().splitlines())
    return {**recorded, "STDERR": result.stderr.decode()}


def watch_command(recorded: dict) -> list[str]:
    """The words of the command the watcher's job runs (``--wrap``'s ``bash -c`` argument,
    sbatch's last)."""
    arguments = shlex.split(recorded["ARGS"])
    assert arguments[-3:-1] == ["bash", "-c"]
    return shlex.split(arguments[-1])


def test_a_recipe_in_a_folder_of_ones_own_is_mounted_not_copied(tmp_path):
    """``CONFIG=my_task.yaml`` relative to where one submits (here, a folder outside the
    clone): checked on the login node, made absolute, its folder mounted at the same path in
    the job (training and watcher), where its ``nemo_rl/`` bases are the container's NeMo-RL's;
    the jobs run there (the recipe's relative paths start where one submits, as NeMo-RL reads
    them), and the watcher's Slurm output folder is created there."""
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "my_task.yaml").write_text(
        "defaults:\n  - nemo_rl/grpo_math_1B_megatron.yaml\n  - base/mmpo_common.yaml\n"
        "grpo:\n  num_prompts_per_step: 16\n  num_generations_per_prompt: 8\n"
        "policy:\n  train_global_batch_size: 128\n  generation:\n    max_new_tokens: 384\n"
        "data:\n  max_input_seq_length: 128\n"  # room for the answers in NeMo-RL's 512
        "checkpointing:\n  enabled: true\nevaluation:\n  enabled: true\n"
    )
    prompts = exp / "examples" / "prompts"  # NeMo-RL's configs name it from the run's folder
    prompts.mkdir(parents=True)
    (prompts / "cot.txt").write_text((nemo_rl_checkout() / "examples/prompts/cot.txt").read_text())
    environment = {"CONFIG": "my_task.yaml", "NUM_NODES": "1", "GPUS_PER_NODE": "2"}
    recorded = submit("submit_mmpo.sh", tmp_path, environment, cwd=exp)
    assert recorded["MOUNTS"] == f"{ROOT}:{ROOT},{exp}:{exp}"
    words = shlex.split(recorded["COMMAND"])
    assert words[words.index("--config") + 1] == str(exp / "my_task.yaml")
    assert "NEMO_RL_PATH=/opt/nemo-rl" in words
    assert words[:2] == ["cd", str(exp)] and recorded["PWD"] == str(exp)
    assert recorded["CHECKPOINT_DIR"] == f"{exp}/results/grpo_megatron"  # NeMo-RL's, relative
    watcher = submit("watch_mmpo.sh", tmp_path, {"CONFIG": "my_task.yaml"}, cwd=exp)
    assert f"--container-mounts={ROOT}:{ROOT},{exp}:{exp}" in watcher["ARGS"]
    assert f"--container-workdir={exp} " in watcher["ARGS"]
    assert str(exp / "my_task.yaml") in watcher["ARGS"]
    assert f"--output={exp}/logs/%x-%j.out" in watcher["ARGS"] and (exp / "logs").is_dir()
    assert not (ROOT / "examples" / "configs" / "my_task.yaml").exists()


def test_a_recipe_of_ones_own_wins_over_the_clones_of_the_same_name(tmp_path):
    """``CONFIG=examples/configs/mmpo_math_qwen3_1.7b.yaml`` where one submits from a folder
    holding a file of that name: that file is checked and run (and watched), not the clone's."""
    exp = tmp_path / "exp"
    mine = exp / "examples" / "configs" / "mmpo_math_qwen3_1.7b.yaml"
    mine.parent.mkdir(parents=True)
    mine.write_text(
        "defaults:\n  - nemo_mmpo/mmpo_math_qwen3_1.7b.yaml\n"
        "checkpointing:\n  checkpoint_dir: results/mine\n"
    )
    environment = {"CONFIG": "examples/configs/mmpo_math_qwen3_1.7b.yaml"}
    recorded = submit("mmpo_1node.sh", tmp_path, environment, cwd=exp)
    words = shlex.split(recorded["COMMAND"])
    assert words[words.index("--config") + 1] == str(mine)
    assert recorded["CHECKPOINT_DIR"] == f"{exp}/results/mine"  # the check read this file
    watched = watch_command(submit("watch_mmpo.sh", tmp_path, environment, cwd=exp))
    assert watched[watched.index("--config") + 1] == str(mine)


@pytest.mark.parametrize(
    ("config", "path"),
    [
        ("nemo_mmpo/mmpo_tiny_cpu.yaml", "nemo_mmpo/configs/mmpo_tiny_cpu.yaml"),
        ("examples/configs/mmpo_tiny_cpu.yaml", "examples/configs/mmpo_tiny_cpu.yaml"),
    ],
)
def test_a_packaged_recipe_is_named_as_train_names_it(tmp_path, config, path):
    """``nemo_mmpo/<file>`` (as ``nemo-mmpo train --config`` names the package's recipes) and
    the older ``examples/configs/<file>`` name the clone's recipe from any folder."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    recorded = submit("mmpo_1node.sh", tmp_path, {"CONFIG": config}, cwd=elsewhere)
    words = shlex.split(recorded["COMMAND"])
    assert words[words.index("--config") + 1] == str(ROOT / path)
    assert recorded["MOUNTS"] == f"{ROOT}:{ROOT},{elsewhere}:{elsewhere}"
    watched = watch_command(submit("watch_mmpo.sh", tmp_path, {"CONFIG": config}, cwd=elsewhere))
    assert watched[watched.index("--config") + 1] == str(ROOT / path)


@pytest.mark.parametrize("script", ["mmpo_1node.sh", "watch_mmpo.sh"])
@pytest.mark.parametrize("config", ["my_recipe.yaml", "nemo_mmpo/no_such.yaml", "/no/such.yaml"])
def test_a_missing_config_is_one_clear_line(tmp_path, script, config):
    with pytest.raises(subprocess.CalledProcessError) as error:
        submit(script, tmp_path, {"CONFIG": config}, cwd=tmp_path)
    assert error.value.returncode == 2
    (line,) = error.value.stderr.decode().splitlines()
    assert line.startswith(f"CONFIG={config}: ")
    assert "nemo_mmpo/<file>" in line
    assert not (tmp_path / "record.txt").exists()


@pytest.mark.parametrize("key", ["evaluation.enabled", "checkpointing.enabled"])
def test_the_watcher_refuses_a_run_with_nothing_to_watch_before_queuing(tmp_path, key):
    """As ``nemo-mmpo eval watch`` would refuse it on the GPU, but before anything is queued."""
    with pytest.raises(subprocess.CalledProcessError) as error:
        submit(
            "watch_mmpo.sh",
            tmp_path,
            {"CONFIG": "nemo_mmpo/mmpo_tiny_cpu.yaml"},
            f"{key}=false",
            cwd=tmp_path,
        )
    message = error.value.stderr.decode()
    assert error.value.returncode == 2
    assert f"{key} is false in this recipe" in message and "Not submitted" in message
    assert not (tmp_path / "record.txt").exists()


def test_the_watcher_checks_on_the_login_node_what_it_will_watch(tmp_path):
    """The check prints what the job will watch, from the overrides given; the job's command
    watches (no ``--check``)."""
    recorded = submit(
        "watch_mmpo.sh",
        tmp_path,
        {"CONFIG": "nemo_mmpo/mmpo_tiny_cpu.yaml"},
        "checkpointing.checkpoint_dir=runs/mine",
        cwd=tmp_path,
    )
    watched = watch_command(recorded)
    assert watched[-2:] == ["--follow", "checkpointing.checkpoint_dir=runs/mine"]
    assert "--check" not in watched
    default = watch_command(submit("watch_mmpo.sh", tmp_path, {}, cwd=tmp_path))
    assert default[-1] == "--follow"  # no override: no empty argument either
    assert default[default.index("--config") + 1] == f"{CONFIGS}/mmpo_math_qwen3_1.7b.yaml"
    with pytest.raises(subprocess.CalledProcessError) as error:
        submit("watch_mmpo.sh", tmp_path, {"NEMO_RL_HOST_DIR": ""}, cwd=tmp_path)
    assert error.value.returncode == 2 and b"NEMO_RL_HOST_DIR" in error.value.stderr


def test_a_login_python_that_cannot_check_the_watcher_says_so(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True
    )
    python = str(tmp_path / "bare" / "bin" / "python")
    with pytest.raises(subprocess.CalledProcessError) as error:
        submit("watch_mmpo.sh", tmp_path, {"PYTHON": python}, cwd=tmp_path)
    message = error.value.stderr.decode()
    assert error.value.returncode == 3
    assert "cannot run the check" in message and "launch extra" in message and "torch" in message
    assert not (tmp_path / "record.txt").exists()


def test_one_node_template(tmp_path):
    recorded = submit("mmpo_1node.sh", tmp_path, {}, "grpo.adv_estimator.truncation_order=3")
    arguments = shlex.split(recorded["ARGS"])
    # the batch script runs NeMo-RL's ray.sub and watches the nodes
    assert arguments[-1] == str(ROOT / "slurm" / "ray_job.sh")
    assert recorded["RAY_SUB"] == f"{nemo_rl_checkout()}/ray.sub"
    assert recorded["CHECKPOINT_DIR"] == f"{ROOT}/results/mmpo_qwen3_1.7b"
    # the partition's nodes have gpu:8: ray.sub claims them all, the recipe uses 2
    for expected in ("--nodes=1", "--account=acct", "--partition=batch", "--gres=gpu:8"):
        assert expected in arguments
    assert recorded["RAY_SUB_GPUS"] == "8"
    # ray.sub's own directives come first (ours override them); a lost node is not requeued
    assert arguments[:2] == ["--nodes=2", "--exclusive"] and "--no-requeue" in arguments
    assert arguments.index("--nodes=1") > arguments.index("--nodes=2")
    command = recorded["COMMAND"]
    assert f"uv run --project /opt/nemo-rl python {ROOT}/examples/run_mmpo_math.py" in command
    assert f"--config {ROOT}/nemo_mmpo/configs/mmpo_math_qwen3_1.7b.yaml" in command
    assert "cluster.num_nodes=1 cluster.gpus_per_node=2" in command
    assert command.endswith("grpo.adv_estimator.truncation_order=3")
    assert recorded["CONTAINER"] == "nvcr.io/nvidia/nemo-rl:v0.7.0"
    assert recorded["MOUNTS"] == f"{ROOT}:{ROOT}"
    assert recorded["PWD"] == str(ROOT)
    assert recorded["JOB_MARKER"] == ""  # JOB_ENV is empty by default


def test_multinode_template(tmp_path):
    recorded = submit(
        "mmpo_multinode.sh", tmp_path, {"NUM_NODES": "4", "EXTRA_MOUNTS": "/data:/data"}
    )
    arguments = shlex.split(recorded["ARGS"])
    assert "--nodes=4" in arguments and "--gres=gpu:8" in arguments
    assert recorded["RAY_SUB_GPUS"] == "8"
    assert "cluster.num_nodes=4 cluster.gpus_per_node=8" in recorded["COMMAND"]
    assert "mmpo_math_qwen3_8b_2nodes.yaml" in recorded["COMMAND"]
    assert recorded["MOUNTS"].endswith(",/data:/data")


def ray_sub_gres_arg(tmp_path: Path, gres: str, gpus_per_node: str) -> subprocess.CompletedProcess:
    """NeMo-RL's own ``maybe_gres_arg``, cut from the checkout's ray.sub, as the job runs it:
    the stand-in ``sinfo`` of the last :func:`submit` answers ``gres``, ``GPUS_PER_NODE`` as
    handed."""
    ray_sub = (nemo_rl_checkout() / "ray.sub").read_text()
    function = ray_sub[ray_sub.index("maybe_gres_arg() {") :]
    function = function[: function.index("\n}\n") + 3]
    return subprocess.run(
        ["bash", "-c", f"set -eou pipefail\n{function}maybe_gres_arg"],
        env={
            **os.environ,
            "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
            "SLURM_JOB_PARTITION": "batch",
            "FAKE_GRES": gres,
            "GPUS_PER_NODE": gpus_per_node,
        },
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize(
    ("gres", "said"),
    [
        ("gpu:8", "gpu:8"),
        ("gpu:a100:8(S:0-1)", "gpu:a100:8(S:0-1)"),  # a type, a socket spec
        ("gpu:8\n(null)", "gpu:8"),  # and nodes without GPUs: sbatch and ray.sub pick GPU nodes
    ],
)
def test_a_gpu_partition_is_claimed_whole_and_the_recipe_keeps_its_gpus(tmp_path, gres, said):
    """The 1-node template's recipe uses 2 GPUs on a partition of gpu:8 nodes: ray.sub gets 8
    (its check passes: NeMo-RL's own function, which stops the job on the recipe's 2), sbatch
    claims 8, the recipe keeps ``cluster.gpus_per_node=2``; one line says so."""
    recorded = submit("mmpo_1node.sh", tmp_path, {"FAKE_GRES": gres})
    arguments = shlex.split(recorded["ARGS"])
    assert [word for word in arguments if word.startswith("--gres")] == ["--gres=gpu:8"]
    assert recorded["RAY_SUB_GPUS"] == "8"
    assert "cluster.num_nodes=1 cluster.gpus_per_node=2" in recorded["COMMAND"]
    line = f"partition batch: nodes have {said}; claiming 8 a node for ray.sub, the recipe uses 2"
    assert line in recorded["STDERR"].splitlines()
    accepted = ray_sub_gres_arg(tmp_path, gres, recorded["RAY_SUB_GPUS"])
    assert (accepted.returncode, accepted.stdout) == (0, "--gres=gpu:8\n")
    before = ray_sub_gres_arg(tmp_path, gres, "2")  # what the template handed ray.sub before
    assert before.returncode == 1 and "Error: GPUS_PER_NODE=2 but GRES detected" in before.stderr


def test_a_partition_without_gpu_gres_is_submitted_without_gres(tmp_path):
    """Nodes that declare no GPUs: ray.sub runs without --gres (Ray sees the whole node), and so
    does the job (sbatch refuses --gres there); the recipe's count is ray.sub's."""
    recorded = submit("mmpo_1node.sh", tmp_path, {"FAKE_GRES": "(null)"})
    assert not [word for word in shlex.split(recorded["ARGS"]) if word.startswith("--gres")]
    assert recorded["RAY_SUB_GPUS"] == "2"
    assert "cluster.gpus_per_node=2" in recorded["COMMAND"]
    assert (
        "partition batch: its nodes declare no GPU GRES; submitting without --gres, as ray.sub "
        "runs there (Ray sees each whole node); the recipe uses 2 a node"
    ) in recorded["STDERR"].splitlines()
    accepted = ray_sub_gres_arg(tmp_path, "(null)", recorded["RAY_SUB_GPUS"])
    assert (accepted.returncode, accepted.stdout) == (0, "\n")


@pytest.mark.parametrize(
    ("script", "environment", "line"),
    [
        (
            "mmpo_1node.sh",
            {"FAKE_GRES": "gpu:8\ngpu:4"},
            "Not submitted: partition batch's nodes have different GPU counts (gpu:4, gpu:8) and "
            "ray.sub claims one count on every node; pick a partition whose nodes all have the "
            "same (sinfo -p batch -o '%N %G' lists them)",
        ),
        (
            "mmpo_1node.sh",
            {"GPUS_PER_NODE": "16"},
            "Not submitted: GPUS_PER_NODE=16 but partition batch's nodes have gpu:8; set "
            "GPUS_PER_NODE to 8 or fewer (and the recipe's layout to fit), or pick a partition "
            "with more GPUs a node",
        ),
        (
            "mmpo_multinode.sh",
            {"FAKE_GRES": "gpu:h100:4(S:0-1)"},
            "Not submitted: GPUS_PER_NODE=8 but partition batch's nodes have gpu:h100:4(S:0-1); "
            "set GPUS_PER_NODE to 4 or fewer (and the recipe's layout to fit), or pick a "
            "partition with more GPUs a node",
        ),
        (
            "mmpo_1node.sh",
            {"PARTITION": "YOUR_PARTITION"},
            "Not submitted: PARTITION=YOUR_PARTITION: Slurm lists no node in it; set PARTITION "
            "to one of: batch debug",
        ),
        (
            "mmpo_1node.sh",
            {"FAKE_SINFO_FAILS": "sinfo: error: Unable to contact slurm controller"},
            "Not submitted: sinfo -p batch failed: sinfo: error: Unable to contact slurm "
            "controller",
        ),
        (
            "mmpo_1node.sh",
            {"GPUS_PER_NODE": "two"},
            "GPUS_PER_NODE=two: not a whole number of GPUs; set it to the GPUs the recipe uses on "
            "each node, e.g. GPUS_PER_NODE=2",
        ),
    ],
)
def test_what_ray_sub_cannot_run_is_refused_in_one_line_before_queuing(
    tmp_path, script, environment, line
):
    with pytest.raises(subprocess.CalledProcessError) as error:
        submit(script, tmp_path, environment)
    assert error.value.returncode == 2
    said = error.value.stderr.decode().splitlines()
    assert said[0].startswith("recipe: ") and said[1:] == [line]
    assert not (tmp_path / "record.txt").exists()


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


def test_a_login_python_that_cannot_check_is_not_called_invalid(tmp_path):
    """A login-node Python without torch and NeMo-RL's config libraries: the check cannot run,
    and the script says so (status 3), instead of calling a valid recipe invalid."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True
    )
    with pytest.raises(subprocess.CalledProcessError) as error:
        submit("mmpo_1node.sh", tmp_path, {"PYTHON": str(tmp_path / "bare" / "bin" / "python")})
    message = error.value.stderr.decode()
    assert error.value.returncode == 3
    assert "cannot check the plan" in message and "launch extra" in message
    assert "invalid" not in message
    assert not (tmp_path / "record.txt").exists()


def test_without_a_container_the_job_gets_the_launcher_and_the_environment(tmp_path):
    """PYTHON_LAUNCHER replaces ``uv run --project``; JOB_ENV's assignments reach the job's
    environment (which ray.sub, Ray and its workers inherit), PATH included."""
    path = f"/shared/venv/bin:{os.environ['PATH']}"
    recorded = submit(
        "mmpo_1node.sh",
        tmp_path,
        {
            "NEMO_RL_DIR": "/shared/RL",
            "PYTHON_LAUNCHER": "/shared/venv/bin/python",
            "JOB_ENV": f"PATH={path} MMPO_TEST_MARKER=1",
        },
    )
    command = recorded["COMMAND"]
    assert f"NEMO_RL_PATH=/shared/RL /shared/venv/bin/python {ROOT}/examples/run_mmpo_math.py" in (
        command
    )
    assert "uv run" not in command
    assert recorded["JOB_PATH"] == path
    assert recorded["JOB_MARKER"] == "1"


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
    from nemo_mmpo.launch import trainers
    from nemo_mmpo.recipes import load

    extra = {"CONFIG": f"examples/configs/{recipe}", "NUM_NODES": "2"}
    config = load(ROOT / "examples" / "configs" / recipe).config
    has_one = (nemo_rl_checkout() / trainers.SINGLE_CONTROLLER_SCRIPT).is_file()
    if trainers.is_single_controller(config) and not has_one:  # v0.7.0: refused before sbatch
        with pytest.raises(subprocess.CalledProcessError) as refused:
            submit("submit_mmpo.sh", tmp_path, extra)
        assert refused.value.returncode == 2
        assert b"run_grpo_single_controller.py" in refused.value.stderr
        assert not (tmp_path / "record.txt").exists()
        return
    recorded = submit("submit_mmpo.sh", tmp_path, extra)
    assert f"--config {ROOT}/examples/configs/{recipe}" in recorded["COMMAND"]


FAKE_SCONTROL = """#!/usr/bin/env bash
case "$1 $2" in
  "show config") echo "SlurmdPort              = $FAKE_SLURMD_PORT" ;;
  "show hostnames") printf 'node1\\nnode2\\nnode3\\n' ;;
  "show node") echo "NodeName=$3 NodeAddr=$(grep "^$3 " "$FAKE_NODES" | cut -d' ' -f2) \
State=$(grep "^$3 " "$FAKE_NODES" | cut -d' ' -f3)" ;;
esac
"""


def run_batch_script(tmp_path: Path, ray_sub: str, nodes: dict[str, tuple[str, str]]):
    """slurm/ray_job.sh as the batch host node1 runs it, with stand-ins for ``scontrol`` and
    ``hostname``; ``nodes``: name -> (address, Slurm state). node2 and node3's slurmd "listen"
    where a socket of this test does (127.0.0.1); any other address refuses."""
    import socket

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL)
    (bin_dir / "hostname").write_text("#!/bin/sh\necho node1\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    (tmp_path / "ray.sub").write_text(ray_sub)
    (tmp_path / "nodes").write_text(
        "".join(f"{name} {address} {state}\n" for name, (address, state) in nodes.items())
    )
    checkpoints = tmp_path / "checkpoints"
    for name in ("step_2", "step_12", "tmp_step_13"):  # step 12 is the newest NeMo-RL finished
        (checkpoints / name).mkdir(parents=True)
    with socket.socket() as slurmd:
        slurmd.bind(("127.0.0.1", 0))
        slurmd.listen(8)
        port = slurmd.getsockname()[1]
        env = {
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "FAKE_SLURMD_PORT": str(port),
            "FAKE_NODES": str(tmp_path / "nodes"),
            "SLURM_JOB_NODELIST": "node[1-3]",
            "MMPO_RAY_SUB": str(tmp_path / "ray.sub"),
            "MMPO_CHECKPOINT_DIR": str(checkpoints),
            "NODE_WATCH_PERIOD": "1",
            "NODE_WATCH_MISSES": "2",
            "STOP_GRACE": "5",
        }
        result = patience.run(
            ["bash", str(ROOT / "slurm" / "ray_job.sh")],
            env=env,
            capture_output=True,
            text=True,
            timeout=patience.COMMAND_S,
        )
    return result, checkpoints, port


def test_a_lost_node_ends_the_job_naming_it_and_the_checkpoint(tmp_path):
    """node3's slurmd refuses (127.0.0.3 has no listener): after two probes in a row the
    watch stops ray.sub (which would run for 10 minutes) and the last line names node3 and the
    newest finished checkpoint."""
    nodes = {"node2": ("127.0.0.1", "ALLOCATED"), "node3": ("127.0.0.3", "ALLOCATED")}
    result, checkpoints, port = run_batch_script(tmp_path, "sleep 600\n", nodes)
    assert result.returncode == 1
    assert result.stdout.splitlines()[-1] == (
        f"mmpo: node node3 lost (its slurmd at 127.0.0.3:{port} does not answer, 2 probes in "
        f"a row); the job ended; resume from checkpoint {checkpoints}/step_12: submit the same "
        "command again"
    )


def test_ray_sub_failing_on_its_own_names_the_node_slurm_declared_down(tmp_path):
    nodes = {"node2": ("127.0.0.1", "DOWN+NOT_RESPONDING"), "node3": ("127.0.0.1", "ALLOCATED")}
    result, checkpoints, _ = run_batch_script(tmp_path, "exit 3\n", nodes)
    assert result.returncode == 3
    last = result.stdout.splitlines()[-1]
    assert last.startswith("mmpo: node node2 lost (Slurm: DOWN+NOT_RESPONDING, 2 probes in a row)")
    assert last.endswith(
        f"resume from checkpoint {checkpoints}/step_12: submit the same command again"
    )


def test_a_finished_job_with_every_node_up_says_so(tmp_path):
    nodes = {"node2": ("127.0.0.1", "ALLOCATED"), "node3": ("127.0.0.1", "ALLOCATED")}
    result, checkpoints, _ = run_batch_script(tmp_path, "sleep 3\n", nodes)
    assert result.returncode == 0
    assert result.stdout.splitlines()[-1] == (
        f"mmpo: ray.sub finished; newest checkpoint: {checkpoints}/step_12"
    )


@pytest.mark.parametrize(
    ("gres", "asked", "said"),
    [("gpu:8", "--gres=gpu:1", ""), ("(null)", "--exclusive", "declare no GPU GRES")],
)
def test_the_watcher_asks_for_its_gpu_as_the_partition_declares_gpus(tmp_path, gres, asked, said):
    """One GPU by GRES where the nodes declare GPU GRES; a whole node, no ``--gres`` (which
    sbatch refuses there), where they declare none."""
    watcher = submit("watch_mmpo.sh", tmp_path, {"FAKE_GRES": gres})
    arguments = shlex.split(watcher["ARGS"].split(" --wrap=")[0])
    assert asked in arguments and ("--gres=gpu:1" in arguments) == (asked == "--gres=gpu:1")
    assert said in watcher["STDERR"]
