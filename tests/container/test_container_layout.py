"""The README's recipe in NeMo-RL's container layout, with NeMo-RL's real engines, on CPU.

NeMo-RL's container gives its driver an environment with NeMo-RL's base dependencies and
neither vLLM nor Megatron, and each Ray worker class an environment of its own under
``NEMO_RL_VENV_DIR/<actor class path>``; ``scripts/container_layout.sh`` builds the same here
(``scripts/test_container_layout.sh`` names it in ``NEMO_MMPO_CONTAINER_LAYOUT``; elsewhere
this module skips). nemo-mmpo is installed as the README's container command installs it: a
wheel in the driver's environment only; it reaches the workers through ``PYTHONPATH``, as
``install()`` arranges. ``NEMO_RL_PY_EXECUTABLES_SYSTEM`` is unset: NeMo-RL's registry and
``create_local_venv`` pick each worker's interpreter.

What is asserted: the driver's environment cannot import vLLM or Megatron (the workers'
can, each only its own); the README's recipe with ``base/tiny_cpu_engines.yaml`` (NeMo-RL's
``VllmGeneration`` and ``MegatronPolicyWorker``) trains a tiny Qwen3 (:data:`TINY_QWEN3`:
Megatron-Bridge's Qwen3 bridge, vLLM's Qwen3 model) from a user's folder, its workers on
the interpreters NeMo-RL's registry names (their ``sys.executable``), on policy at every step
(NeMo-RL's ``token_mult_prob_error``, the Megatron worker's over vLLM's probabilities of the
sampled tokens, 1 within float tolerance: the weights map right); killed with SIGKILL after
step 3, the same command resumes from step 2; the README's watcher command evaluates the final
checkpoint with nothing of vLLM or Megatron in the watcher's process (its CPU backend, then
``--backend vllm``: vLLM samples in a process of the vLLM worker's environment).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import patience
import pytest
from installed_wheel import OUTSIDE_PATHS, ROOT, build_wheel, changed, site_packages, tree_state
from killed_runs import check_on_policy, check_resumed, run_then_kill
from readme_recipe_files import HELD_OUT, TRAIN, problems, readme_command, readme_file

LAYOUT = os.environ.get("NEMO_MMPO_CONTAINER_LAYOUT")
pytestmark = pytest.mark.skipif(
    not LAYOUT,
    reason="needs NeMo-RL's container layout: bash scripts/test_container_layout.sh builds it "
    "and runs this module",
)

STEPS = 4
#: The model trained: a tiny Qwen3 (Qwen3-1.7B-Base's config, sizes shrunk: nemo_mmpo/cpu/rig/
#: model.py), so Megatron-Bridge's Qwen3 bridge (q/k layernorm, grouped-query attention, tied
#: embeddings), NeMo-RL's converter and vLLM's Qwen3 model run, as for the README's GPU recipe.
#: Without a warm start: the warm start CI trains for the sessions is the tiny Llama's, and a
#: Qwen3's would cost this part about as much again; the seeded random Qwen3 samples no right
#: answer (reward 0, so the advantages and the loss are 0: the steps move the weights by weight
#: decay only), which leaves what this part checks as it is: the interpreters, the on-policy
#: ratio (Megatron-Bridge's import, then its export at every refit, against vLLM's Qwen3), the
#: resume, the watcher's conversion and evaluation.
TINY_QWEN3 = ["++cpu_backend.model.architecture=qwen3", "++cpu_backend.warm_start.enabled=false"]
VLLM_WORKER = "nemo_rl.models.generation.vllm.vllm_worker.VllmGenerationWorker"
MEGATRON_WORKER = "nemo_rl.models.policy.workers.megatron_policy_worker.MegatronPolicyWorker"


def imports(python: Path, module: str) -> bool:
    """Whether ``module`` imports in ``python``'s environment (run from an empty folder)."""
    return (
        subprocess.run(
            [str(python), "-c", f"import {module}"],
            cwd=tempfile.gettempdir(),
            env={key: value for key, value in os.environ.items() if key not in OUTSIDE_PATHS},
            capture_output=True,
            timeout=patience.COMMAND_S,
        ).returncode
        == 0
    )


def drivers_copy_with(wheel: Path, layout: Path, into: Path) -> Path:
    """A copy of the layout's driver environment (a venv over the same base packages) with the
    wheel installed, as the README's container command installs it."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(into)], check=True)
    (driver_pth,) = (layout / "driver" / "lib").glob("python3*/site-packages/_nemo_mmpo_base.pth")
    (site_packages(into) / driver_pth.name).write_text(driver_pth.read_text())
    alone = {key: value for key, value in os.environ.items() if key not in OUTSIDE_PATHS}
    uv = Path(sys.executable).parent / "uv"  # the test environment's (scripts/nemo_rl_env.sh)
    patience.run(
        [
            str(uv),
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--offline",
            "--python",
            str(into),
            str(wheel),
        ],
        check=True,
        timeout=patience.COMMAND_S,
        env=alone,
    )
    return into


def test_the_readme_recipe_trains_with_nemo_rls_engines_in_its_container_layout(tmp_path):
    layout = Path(LAYOUT)
    venvs = layout / "ray_venvs"
    driver = layout / "driver" / "bin" / "python"
    vllm_python = venvs / VLLM_WORKER / "bin" / "python"
    megatron_python = venvs / MEGATRON_WORKER / "bin" / "python"
    assert not imports(driver, "vllm") and not imports(driver, "megatron.core")
    assert imports(vllm_python, "vllm") and not imports(vllm_python, "megatron.core")
    assert imports(megatron_python, "megatron.core") and not imports(megatron_python, "vllm")

    environment = drivers_copy_with(build_wheel(tmp_path / "wheel"), layout, tmp_path / "env")
    assert not imports(environment / "bin" / "python", "vllm")
    user = tmp_path / "exp"
    user.mkdir()
    for name in ("my_recipe.yaml", "my_recipe_engines.yaml"):
        (user / name).write_text(readme_file(name))
    (user / "my_problems.jsonl").write_text(problems(TRAIN))
    (user / "my_held_out.jsonl").write_text(problems(HELD_OUT))
    (user / "my_prompt.txt").write_text("{}")  # no warm start here (TINY_QWEN3)
    written = sorted(path.name for path in user.iterdir())
    nemo_rl = Path(os.environ["NEMO_RL_PATH"])
    variables = {key: value for key, value in os.environ.items() if key not in OUTSIDE_PATHS}
    variables.pop("NEMO_RL_PY_EXECUTABLES_SYSTEM", None)
    variables.update(
        PATH=os.pathsep.join([str(environment / "bin"), os.environ["PATH"]]),
        TMPDIR=tempfile.mkdtemp(prefix="ray", dir="/tmp"),
        NEMO_RL_PATH=str(nemo_rl),
        NEMO_RL_VENV_DIR=str(venvs),
        NEMO_MMPO_WORKER_PATH=str(tmp_path / "worker_path"),
    )
    cpu = [
        f"grpo.max_num_steps={STEPS}",
        "checkpointing.save_period=2",
        "logger.tensorboard_enabled=true",  # NeMo-RL's token_mult_prob_error, read back below
        f"cpu_backend.warm_start_cache={os.environ['NEMO_MMPO_TEST_WARM_STARTS']}",
        *TINY_QWEN3,
    ]
    train = readme_command("cd ~/exp && nemo-mmpo train --config my_recipe_engines.yaml")
    command = [str(environment / "bin" / "nemo-mmpo"), *train[4:7], *cpu]
    checkout = tree_state(ROOT)

    killed = run_then_kill(command, user, variables, tmp_path / "killed.txt", f"step    3/{STEPS}")
    assert "advantage: nemo-mmpo mmpo" in killed and "loss: mmpo" in killed, killed[-3000:]
    assert "warm start: off" in killed, killed[-3000:]
    start = json.loads((user / "results" / "my_run" / "hf_start" / "config.json").read_text())
    assert start["architectures"] == ["Qwen3ForCausalLM"], start
    assert start["num_key_value_heads"] < start["num_attention_heads"], start
    resumed = subprocess.run(
        command, cwd=user, env=variables, capture_output=True, text=True, timeout=patience.RUN_S
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    lines = resumed.stdout.splitlines()
    summary = json.loads(lines[-1].removeprefix("[nemo-mmpo] "))
    assert check_resumed(lines, summary, STEPS) == 2
    (workers,) = [line for line in lines if "workers' interpreters: " in line]
    interpreters = json.loads(workers.split("workers' interpreters: ", 1)[1])
    assert interpreters == {
        "MegatronPolicyWorker": [str(megatron_python)] * 2,
        "VllmGenerationWorker": [str(vllm_python)],
    }, interpreters
    check_on_policy(user / "logs" / "my_run", 3, STEPS)

    watch = readme_command("cd ~/exp && nemo-mmpo eval watch --config my_recipe_engines.yaml")
    evaluated = subprocess.run(
        [str(environment / "bin" / "nemo-mmpo"), *watch[4:8], *cpu],
        cwd=user,
        env=variables,
        capture_output=True,
        text=True,
        timeout=patience.RUN_S,
    )
    assert evaluated.returncode == 0, evaluated.stdout[-3000:] + evaluated.stderr[-3000:]
    evaluation = user / "logs" / "my_run" / "evaluation"
    final = json.loads((evaluation / f"step_{STEPS}.json").read_text())
    assert final["benchmarks"]["my_held_out"]["problems"] == len(HELD_OUT), final
    # the best step's weights, kept by the watcher: NeMo-RL's converter's Hugging Face Qwen3
    converted = list(evaluation.rglob("config.json"))
    assert any(
        json.loads(path.read_text()).get("architectures") == ["Qwen3ForCausalLM"]
        for path in converted
    ), converted
    # --backend vllm: the same checkpoint sampled by vLLM in a process of its worker's environment
    elsewhere = "evaluation.output_dir=logs/my_run/evaluation_vllm"
    with_vllm = subprocess.run(
        [str(environment / "bin" / "nemo-mmpo"), *watch[4:8], "--backend", "vllm", *cpu, elsewhere],
        cwd=user,
        env=variables,
        capture_output=True,
        text=True,
        timeout=patience.RUN_S,
    )
    assert with_vllm.returncode == 0, with_vllm.stdout[-3000:] + with_vllm.stderr[-3000:]
    assert f"watch: vLLM samples in {vllm_python}" in with_vllm.stdout, with_vllm.stdout[-3000:]
    final = json.loads((user / "logs/my_run/evaluation_vllm" / f"step_{STEPS}.json").read_text())
    assert final["benchmarks"]["my_held_out"]["problems"] == len(HELD_OUT), final
    assert sorted(path.name for path in user.iterdir()) == sorted([*written, "logs", "results"])
    assert changed(checkout, tree_state(ROOT)) == []
