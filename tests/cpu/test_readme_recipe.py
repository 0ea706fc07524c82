"""The README's recipe as printed, from a user's folder, on the user's JSONL: trained, killed,
resumed and evaluated, with nothing else than the README's own CPU file beside it.

The recipe (``my_recipe.yaml``) and its CPU companion (``my_recipe_cpu.yaml``: the recipe, then
``base/tiny_cpu.yaml``) are read out of README.md, not copied here, so the README cannot drift
from what runs. The user's files are what the README describes: a JSONL of problems
(``problem``, ``answer``), a held-out JSONL of the same shape, a prompt file with ``{}`` and the
newline an editor ends a file with (the warm start learns the sums as NeMo-RL formats them). The
only additions are CPU ones given as overrides: fewer steps and a checkpoint every 2 (CI's
time), the session's warm-start cache. nemo-mmpo runs as a user installs it (a wheel in a copy
of NeMo-RL's environment, nothing of this checkout on the path): ``nemo-mmpo train`` is killed
with SIGKILL after step 3 and the same command resumes from its newest checkpoint; then the
README's CPU watcher, ``nemo-mmpo eval watch --config my_recipe_cpu.yaml`` as printed (a CPU
recipe's checkpoints are evaluated on the CPU without a flag), evaluates the checkpoints on the
held-out file. Everything the run wrote is in the user's folder; the checkout and the
environment are unchanged."""

from __future__ import annotations

import json
import subprocess

import patience
import pytest
from installed_wheel import (
    ROOT,
    as_a_user,
    build_wheel,
    changed,
    environment_with,
    site_packages,
    tree_state,
)
from killed_runs import check_resumed, run_then_kill
from nemo_rl_support import import_nemo_rl, nemo_rl_checkout
from readme_recipe_files import HELD_OUT, TRAIN, problems, readme_command, readme_file

pytestmark = [pytest.mark.nemo_rl, pytest.mark.one_snapshot, pytest.mark.long_run]
import_nemo_rl("nemo_rl.algorithms.grpo")

STEPS = 30  # sync steps are ~0.3 s: the kill after step 3 lands well before the end


def test_the_readme_recipe_trains_resumes_and_is_evaluated_from_a_users_folder(
    tmp_path, tiny_warm_starts
):
    environment = environment_with(build_wheel(tmp_path / "wheel"), tmp_path / "environment")
    user = tmp_path / "exp"
    user.mkdir()
    (user / "my_recipe.yaml").write_text(readme_file("my_recipe.yaml"))
    (user / "my_recipe_cpu.yaml").write_text(readme_file("my_recipe_cpu.yaml"))
    (user / "my_problems.jsonl").write_text(problems(TRAIN))
    (user / "my_held_out.jsonl").write_text(problems(HELD_OUT))
    (user / "my_prompt.txt").write_text("{}\n")  # as an editor saves it
    written = sorted(path.name for path in user.iterdir())
    variables = as_a_user(environment, nemo_rl_checkout(), tmp_path)
    nemo_mmpo = str(environment / "bin" / "nemo-mmpo")
    cpu = [
        f"grpo.max_num_steps={STEPS}",
        "checkpointing.save_period=2",
        f"cpu_backend.warm_start_cache={tiny_warm_starts}",
    ]
    train = readme_command("cd ~/exp && nemo-mmpo train --config my_recipe_cpu.yaml")
    assert train[3:7] == ["nemo-mmpo", "train", "--config", "my_recipe_cpu.yaml"], train
    command = [nemo_mmpo, *train[4:7], *cpu]
    checkout, site = tree_state(ROOT), tree_state(site_packages(environment), skip=set())

    killed = run_then_kill(command, user, variables, tmp_path / "killed.txt", f"step    3/{STEPS}")
    assert "problems: the recipe's data section" in killed, killed[-3000:]
    assert "advantage: nemo-mmpo mmpo" in killed and "loss: mmpo" in killed
    resumed = subprocess.run(
        command, cwd=user, env=variables, capture_output=True, text=True, timeout=patience.RUN_S
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    summary = json.loads(resumed.stdout.strip().splitlines()[-1].removeprefix("[nemo-mmpo] "))
    check_resumed(resumed.stdout.splitlines(), summary, STEPS)

    gpu_watch = readme_command("nemo-mmpo eval watch --config my_recipe.yaml")
    assert gpu_watch == ["nemo-mmpo", "eval", "watch", "--config", "my_recipe.yaml", "--follow"]
    # the README's CPU watcher, as printed (no backend flag: a CPU recipe's is the CPU's), its
    # steps override replaced by the run's own
    watch = readme_command("cd ~/exp && nemo-mmpo eval watch --config my_recipe_cpu.yaml")
    assert watch[3:] == [
        "nemo-mmpo",
        "eval",
        "watch",
        "--config",
        "my_recipe_cpu.yaml",
        "grpo.max_num_steps=20",
    ], watch
    evaluated = subprocess.run(
        [nemo_mmpo, *watch[4:8], *cpu],
        cwd=user,
        env=variables,
        capture_output=True,
        text=True,
        timeout=patience.RUN_S,
    )
    assert evaluated.returncode == 0, evaluated.stdout[-3000:] + evaluated.stderr[-3000:]
    # the watcher evaluated the final checkpoint (each checkpoint: val_period 0, save_period 2)
    # on the user's held-out problems, into the recipe's per-run folder
    evaluation = user / "logs" / "my_run" / "evaluation"
    final = json.loads((evaluation / f"step_{STEPS}.json").read_text())
    assert final["benchmarks"]["my_held_out"]["problems"] == len(HELD_OUT), final
    rows = [json.loads(line) for line in (evaluation / f"step_{STEPS}.jsonl").open()]
    assert {(row["problem_id"], row["answer"]) for row in rows} == {
        (f"my_held_out-{index}", str(a + b)) for index, (a, b) in enumerate(HELD_OUT)
    }

    run = user / "results" / "my_run"
    assert (run / f"step_{STEPS}" / "policy" / "weights").is_dir()
    assert (run / "nemo_mmpo_recipe.yaml").read_text().startswith("# nemo-mmpo run: ")
    assert sorted(path.name for path in user.iterdir()) == sorted([*written, "logs", "results"])
    assert changed(checkout, tree_state(ROOT)) == []  # nothing written into the clone
    assert changed(site, tree_state(site_packages(environment), skip=set())) == []
