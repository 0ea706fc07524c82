"""The tiny CPU recipe end to end, shortened: NeMo-RL's grpo_train with our CPU backends.

What holds on any machine, by construction: the warm start reached its band (or the run would
have failed loudly); the advantages the policy trains on are the core library's for the
rewards NeMo-RL's Math-Verify environment returned; the first optimizer step lowers that loss
on its batch; every step moves the policy; checkpoints are complete Hugging Face directories;
a run killed mid-way resumes from its newest checkpoint with the same data order as an
uninterrupted run; a run whose warm start is read from the cache draws the same samples as one
that trained it. The killed run is a user's: nemo-mmpo installed from a wheel, the recipe in a
folder of their own, which holds everything the run wrote.
That the run *learns* is measured over seeds and perturbed numerics
(``python -m nemo_mmpo.cpu spread``) and checked by ``test_tiny_learning.py``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import patience
import pytest
import torch
from in_loop_evaluation import check_in_loop_evaluations
from installed_wheel import (
    ROOT,
    as_a_user,
    build_wheel,
    changed,
    environment_with,
    site_packages,
    tree_state,
)
from killed_runs import run_then_kill
from nemo_rl_support import CONFIGS_DIR, Console, import_nemo_rl, nemo_rl_checkout

pytestmark = pytest.mark.nemo_rl
import_nemo_rl("nemo_rl.algorithms.grpo")

from nemo_mmpo import compute_advantages, group_ids_from_prompt_rows
from nemo_mmpo.cpu.engines.generation import SeparateCPUGeneration
from nemo_mmpo.cpu.engines.policy import CPUPolicy
from nemo_mmpo.cpu.engines.sampling import token_logprobs
from nemo_mmpo.cpu.rig import driver
from nemo_mmpo.cpu.spread.curves import reward_curve
from nemo_mmpo.nemo_rl import MMPOAdvantageEstimator
from nemo_mmpo.recipes import load


@pytest.fixture
def warm_starts(tiny_warm_starts):
    """The session's warm-start cache: every run of seed 0 starts from the same weights."""
    return tiny_warm_starts


def recipe(tmp_path, warm_starts, name, steps, *extra, config="mmpo_tiny_cpu.yaml"):
    overrides = [
        f"grpo.max_num_steps={steps}",
        "checkpointing.save_period=5",
        f"checkpointing.checkpoint_dir={tmp_path / name / 'checkpoints'}",
        f"logger.log_dir={tmp_path / name / 'logs'}",
        f"cpu_backend.warm_start_cache={warm_starts}",
        "cpu_backend.stall_timeout_s=240",  # async: a stalled run fails in minutes, not hours
        *extra,
    ]
    return load(CONFIGS_DIR / config, overrides).config


@pytest.fixture
def spies(monkeypatch):
    """Record the estimator's inputs/outputs and the batches the policy trains on."""
    calls = {"estimator": [], "train": [], "policies": [], "loss": [], "samples": [], "masks": []}
    estimate, train, init = (
        MMPOAdvantageEstimator.compute_advantage,
        CPUPolicy.train,
        CPUPolicy.__init__,
    )

    def recording_estimate(self, prompt_ids, rewards, mask, *args, **kwargs):
        advantages = estimate(self, prompt_ids, rewards, mask, *args, **kwargs)
        calls["estimator"].append((self, prompt_ids.clone(), rewards.clone()))
        return advantages

    def recording_train(self, data, loss_fn, *args, **kwargs):
        calls["train"].append(data["advantages"].clone())
        calls["samples"].append(data["input_ids"].clone())
        calls["masks"].append(data["token_mask"].clone())
        results = train(self, data, loss_fn, *args, **kwargs)
        # the same loss on the same batch, with the updated policy (no gradient)
        with torch.no_grad():
            current = token_logprobs(
                self.model, data["input_ids"], data["input_lengths"], self.temperature
            )[:, 1:]
            sample_mask = data["sample_mask"]
            tokens = (data["token_mask"][:, 1:] * sample_mask[:, None]).sum()
            after, _ = loss_fn(current, data, sample_mask.sum(), tokens)
        calls["loss"].append((float(results["loss"].sum()), float(after)))
        return results

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        calls["policies"].append(self)

    monkeypatch.setattr(MMPOAdvantageEstimator, "compute_advantage", recording_estimate)
    monkeypatch.setattr(CPUPolicy, "train", recording_train)
    monkeypatch.setattr(CPUPolicy, "__init__", recording_init)
    return calls


EVALUATE_EVERY_5 = ["grpo.val_period=5", "evaluation.samples=4"]
#: the user's recipe, in a folder of their own: the tiny recipe by the package's reference, the
#: run's paths relative to that folder (the warm start from the session's cache)
USERS_RECIPE = """\
defaults: nemo_mmpo/mmpo_tiny_cpu.yaml
grpo:
  max_num_steps: 12
  val_period: 5
evaluation:
  samples: 4
checkpointing:
  checkpoint_dir: results/run
  save_period: 2
logger:
  log_dir: logs/run
cpu_backend:
  warm_start_cache: {warm_starts}
"""


def logged_batches(log_dir: Path, steps: range) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """``{step: (input_ids, token_mask)}`` of the batches NeMo-RL's ``grpo_train`` logged
    (``train_data_step<N>.jsonl`` in the run's log directory), for ``steps``."""
    batches = {}
    for step in steps:
        rows = [json.loads(line) for line in (log_dir / f"train_data_step{step}.jsonl").open()]
        batches[step] = tuple(
            torch.tensor([row[key][0] for row in rows]) for key in ("token_ids", "token_loss_mask")
        )
    return batches


def prompts(input_ids: torch.Tensor, token_mask: torch.Tensor) -> list[list[int]]:
    """Each row's prompt: its tokens before the first one the loss reads."""
    return [
        row[: int(mask.tolist().index(1))].tolist()
        for row, mask in zip(input_ids, token_mask, strict=True)
    ]


def users_run_killed_and_resumed(tmp_path: Path, warm_starts: Path) -> tuple[Path, str, str]:
    """``nemo-mmpo train --config my_recipe.yaml`` as a user runs it: nemo-mmpo built into a
    wheel and installed (not editable) into a copy of this NeMo-RL environment, from a folder
    of the user's own with nothing of this checkout on the path; killed with SIGKILL after
    step 6, then the same command resumes it to step 12. The checkout and the environment's
    site-packages are unchanged afterwards. Returns the user's folder and both terminals."""
    environment = environment_with(build_wheel(tmp_path / "wheel"), tmp_path / "environment")
    user = tmp_path / "user"
    user.mkdir()
    (user / "my_recipe.yaml").write_text(USERS_RECIPE.format(warm_starts=warm_starts))
    variables = as_a_user(environment, nemo_rl_checkout(), tmp_path)
    command = [str(environment / "bin" / "nemo-mmpo"), "train", "--config", "my_recipe.yaml"]
    checkout, site = tree_state(ROOT), tree_state(site_packages(environment), skip=set())
    killed = run_then_kill(command, user, variables, tmp_path / "killed.txt", "step    6/12")
    resumed = subprocess.run(
        command, cwd=user, env=variables, capture_output=True, text=True, timeout=patience.RUN_S
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert changed(checkout, tree_state(ROOT)) == []  # nothing written into the clone
    assert changed(site, tree_state(site_packages(environment), skip=set())) == []  # nor there
    return user, killed, resumed.stdout


# CI time: main's grpo_train runs the estimator in tests/nemo_rl_adapter/test_trainer_loop.py and
# the Megatron recipe end to end (killed and resumed)
@pytest.mark.one_snapshot
@pytest.mark.long_run
def test_short_tiny_run_trains_on_the_core_advantages_and_resumes(
    ray_cluster, spies, tmp_path, warm_starts
):
    """The user's run from an installed wheel (:func:`users_run_killed_and_resumed`), then the
    same recipe uninterrupted in this process, where the estimator, the policy and the loss
    are watched; the user's run wrote everything into the user's folder, resumed where it was
    killed, saw the uninterrupted run's prompts and, to step 6, its samples."""
    user, killed, resumed = users_run_killed_and_resumed(tmp_path, warm_starts)
    console = Console()
    first = driver.run(
        recipe(tmp_path, warm_starts, "run", 12, *EVALUATE_EVERY_5),
        console=console,
    )
    # the user's run: its checkpoints, logs and record in the user's folder (relative paths
    # start where the command runs), the record beside NeMo-RL's step_<N>
    run, logs = user / "results" / "run", user / "logs" / "run"
    assert (run / "step_12" / "policy" / "weights").is_dir()
    assert (run / "nemo_mmpo_recipe.yaml").read_text().startswith("# nemo-mmpo run: ")
    assert (logs / "nemo_rl.log").is_file()
    assert sorted(path.name for path in user.iterdir()) == ["logs", "my_recipe.yaml", "results"]
    # the same command resumed from the newest checkpoint the kill left, and trained only the
    # steps after it
    (resume_line,) = [line for line in resumed.splitlines() if "resuming from" in line]
    start = int(resume_line.rsplit("step_", 1)[1].split()[0].rstrip("/):,."))
    assert 2 <= start <= 6, resume_line
    steps = [line.split()[1] for line in resumed.splitlines() if line.startswith("step ")]
    assert steps == [f"{step}/12" for step in range(start + 1, 13)]
    # ... seeing the prompts the uninterrupted run saw at those steps; and before the kill, the
    # user's run (a process of its own, its warm start trained or read from the same cache)
    # drew this run's samples
    batches = logged_batches(logs, range(1, 13))
    for step in range(start + 1, 13):
        ids, masks = batches[step]
        assert prompts(ids, masks) == prompts(spies["samples"][step - 1], spies["masks"][step - 1])
    for step in range(1, start + 1):
        assert torch.equal(batches[step][0], spies["samples"][step - 1]), step
    assert "step    6/12" in killed
    # the warm start stopped inside its band (the loop returns nowhere else) and said so
    (info_file,) = warm_starts.glob("*/warm_start.json")
    info = json.loads(info_file.read_text())
    band = info["settings"]["target_low"], info["settings"]["target_high"]
    assert band[0] <= info["result"]["success"] <= band[1]
    assert any(line.startswith("[nemo-mmpo] warm start:") for line in console.lines)
    # one progress line per step, for a person
    progress = [line for line in console.lines if line.startswith("step ")]
    assert [line.split()[1] for line in progress] == [f"{step}/12" for step in range(1, 13)]

    assert len(spies["estimator"]) == len(spies["train"]) == 12
    for (estimator, prompt_ids, rewards), advantages in zip(
        spies["estimator"], spies["train"], strict=True
    ):
        assert set(rewards.tolist()) <= {0.0, 1.0}
        expected = compute_advantages(
            rewards, group_ids_from_prompt_rows(prompt_ids), estimator.objective, "plugin"
        ).to(advantages.dtype)
        assert torch.equal(advantages[:, 0], expected)
    rewards = torch.stack([rewards.mean() for _, _, rewards in spies["estimator"]])
    # 768 samples from a policy whose measured success is in [0.25, 0.55]: mixed rewards
    assert 0 < rewards.mean() < 1
    # the first optimizer step lowers the loss NeMo-RL handed to the policy, on its batch
    # (Adam's first update is a descent direction; later ones carry momentum)
    before, after = spies["loss"][0]
    assert after < before
    assert all(before != after for before, after in spies["loss"])  # every step moved it
    assert Path(first["checkpoint"]).parent.parent.name == "step_12"
    assert (Path(first["checkpoint"]) / "tokenizer.json").is_file()  # a complete HF checkpoint
    assert (Path(first["held_out_file"])).is_file()
    # NeMo-RL's logger wrote our metrics to TensorBoard, once per step
    success = reward_curve(tmp_path / "run" / "logs", "train/mmpo/success_rate")
    assert [step for step, _ in success] == list(range(1, 13))
    assert [value for _, value in success] == pytest.approx(rewards.tolist())

    check_in_loop_evaluations(tmp_path / "run", steps=(0, 5, 10), samples=4)
    # a person saw each
    assert sum("evaluation at step" in line for line in console.lines) == 3


@pytest.mark.one_snapshot  # CI time: main's async loop runs in test_trainer_loop.py and
# test_ray_nodes.py is v0.7.0's too; v0.7.0 is the snapshot whose collector can stall
@pytest.mark.long_run
def test_short_async_tiny_run_refits_a_separate_engine_and_resumes(
    ray_cluster, spies, tmp_path, warm_starts, monkeypatch
):
    """``mmpo_tiny_cpu_async.yaml``: NeMo-RL's ``async_grpo_train`` with its trajectory
    collector sampling through a separate CPU engine. The engine starts from the policy's
    weights, is refit with them before training and after every optimizer step, and ends
    holding the policy's final weights; the advantages are the core library's; a second run
    resumes from the saved step (NeMo-RL restores its replay buffer)."""
    engines = []
    shutdown = SeparateCPUGeneration.shutdown

    def recording_shutdown(self):  # NeMo-RL's trainer shuts it down first, then our driver
        if self.worker is not None:
            engines.append({"weights": self.weights(), "refits": self.refit_count()})
        return shutdown(self)

    monkeypatch.setattr(SeparateCPUGeneration, "shutdown", recording_shutdown)
    batches = []
    train = CPUPolicy.train

    def recording_train(self, data, loss_fn, *args, **kwargs):
        batches.append({key: data[key].clone() for key in ("generation_logprobs", "token_mask")})
        batches[-1]["prev_logprobs"] = data["prev_logprobs"].clone()
        return train(self, data, loss_fn, *args, **kwargs)

    monkeypatch.setattr(CPUPolicy, "train", recording_train)  # over the spies' recorder

    async_recipe = "mmpo_tiny_cpu_async.yaml"
    console = Console()
    first = driver.run(
        recipe(tmp_path, warm_starts, "async", 3, config=async_recipe), console=console
    )
    # the step-0 evaluation (the driver's, before NeMo-RL's loop) is logged as NeMo-RL logs it
    assert any(line.startswith("[nemo-mmpo] evaluation at step 0:") for line in console.lines)
    assert len(spies["estimator"]) == len(spies["train"]) == 3
    for (estimator, prompt_ids, rewards), advantages in zip(
        spies["estimator"], spies["train"], strict=True
    ):
        expected = compute_advantages(
            rewards, group_ids_from_prompt_rows(prompt_ids), estimator.objective, "plugin"
        ).to(advantages.dtype)
        assert torch.equal(advantages[:, 0], expected)
    # one refit before training, one after each of the 3 steps; then the engine holds the
    # policy's final weights, which the first batch's sampling weights are not
    (engine,) = engines
    assert engine["refits"] == 4
    policy = spies["policies"][-1]
    final = policy.model.state_dict()
    assert all(torch.equal(engine["weights"][name], final[name]) for name in final)
    # the first batch was sampled by the engine's copy of the starting weights: its
    # log-probabilities are the training policy's before the first step
    mask = batches[0]["token_mask"].bool()
    torch.testing.assert_close(
        batches[0]["generation_logprobs"][mask], batches[0]["prev_logprobs"][mask]
    )
    assert Path(first["checkpoint"]).parent.parent.name == "step_3"
    assert (Path(first["checkpoint"]).parents[1] / "replay_buffer.pt").is_file()

    driver.run(recipe(tmp_path, warm_starts, "async", 4, config=async_recipe), console=Console())
    assert len(spies["estimator"]) == 4  # step 4 only
    assert (tmp_path / "async" / "checkpoints" / "step_4" / "policy" / "weights").is_dir()
