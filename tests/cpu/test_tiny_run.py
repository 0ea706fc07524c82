"""The tiny CPU recipe end to end, shortened: NeMo-RL's grpo_train with our CPU backends.

What holds on any machine, by construction: the warm start reached its band (or the run would
have failed loudly); the advantages the policy trains on are the core library's for the
rewards NeMo-RL's Math-Verify environment returned; the first optimizer step lowers that loss
on its batch; every step moves the policy; checkpoints are complete Hugging Face directories;
a second run resumes from the saved step with the same data order as an uninterrupted run; a
run whose warm start is read from the cache draws the same samples as one that trained it.
That the run *learns* is measured over seeds and perturbed numerics
(``python -m nemo_mmpo.cpu spread``) and checked by ``test_tiny_learning.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from in_loop_evaluation import check_in_loop_evaluations
from nemo_rl_support import CONFIGS_DIR, Console, import_nemo_rl

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
    calls = {"estimator": [], "train": [], "policies": [], "loss": [], "samples": []}
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


# CI time: main's grpo_train runs the estimator in tests/nemo_rl_adapter/test_trainer_loop.py and
# the Megatron recipe end to end (killed and resumed)
@pytest.mark.one_snapshot
def test_short_tiny_run_trains_on_the_core_advantages_and_resumes(
    ray_cluster, spies, tmp_path, warm_starts
):
    console = Console()
    first = driver.run(recipe(tmp_path, warm_starts, "run", 10, *EVALUATE_EVERY_5), console=console)
    # the warm start stopped inside its band (the loop returns nowhere else) and said so
    (info_file,) = warm_starts.glob("*/warm_start.json")
    info = json.loads(info_file.read_text())
    band = info["settings"]["target_low"], info["settings"]["target_high"]
    assert band[0] <= info["result"]["success"] <= band[1]
    assert any(line.startswith("[nemo-mmpo] warm start:") for line in console.lines)
    # one progress line per step, for a person
    progress = [line for line in console.lines if line.startswith("step ")]
    assert [line.split()[1] for line in progress] == [f"{step}/10" for step in range(1, 11)]

    assert len(spies["estimator"]) == len(spies["train"]) == 10
    for (estimator, prompt_ids, rewards), advantages in zip(
        spies["estimator"], spies["train"], strict=True
    ):
        assert set(rewards.tolist()) <= {0.0, 1.0}
        expected = compute_advantages(
            rewards, group_ids_from_prompt_rows(prompt_ids), estimator.objective, "plugin"
        ).to(advantages.dtype)
        assert torch.equal(advantages[:, 0], expected)
    rewards = torch.stack([rewards.mean() for _, _, rewards in spies["estimator"]])
    # 640 samples from a policy whose measured success is in [0.25, 0.55]: mixed rewards
    assert 0 < rewards.mean() < 1
    # the first optimizer step lowers the loss NeMo-RL handed to the policy, on its batch
    # (Adam's first update is a descent direction; later ones carry momentum)
    before, after = spies["loss"][0]
    assert after < before
    assert all(before != after for before, after in spies["loss"])  # every step moved it
    assert Path(first["checkpoint"]).parent.parent.name == "step_10"
    assert (Path(first["checkpoint"]) / "tokenizer.json").is_file()  # a complete HF checkpoint
    assert (Path(first["held_out_file"])).is_file()
    # NeMo-RL's logger wrote our metrics to TensorBoard, once per step
    success = reward_curve(tmp_path / "run" / "logs", "train/mmpo/success_rate")
    assert [step for step, _ in success] == list(range(1, 11))
    assert [value for _, value in success] == pytest.approx(rewards.tolist())

    check_in_loop_evaluations(tmp_path / "run", steps=(0, 5, 10), samples=4)
    # a person saw each
    assert sum("evaluation at step" in line for line in console.lines) == 3

    # resume: the same command with more steps continues from step 10 (an epoch's end)
    resumed_from = len(spies["estimator"])
    driver.run(recipe(tmp_path, warm_starts, "run", 12, *EVALUATE_EVERY_5), console=Console())
    assert len(spies["estimator"]) == resumed_from + 2  # steps 11 and 12 only
    assert (tmp_path / "run" / "checkpoints" / "step_12" / "policy" / "weights").is_dir()
    # ... seeing the prompts an uninterrupted run sees at steps 11 and 12; and that run, whose
    # warm start came from the cache, drew the first run's samples at steps 1-10
    uninterrupted_from = len(spies["estimator"])
    driver.run(recipe(tmp_path, warm_starts, "straight", 12, *EVALUATE_EVERY_5), console=Console())
    resumed = spies["estimator"][resumed_from:uninterrupted_from]
    straight = spies["estimator"][uninterrupted_from + 10 :]
    assert len(resumed) == len(straight) == 2
    for (_, mine, _), (_, theirs, _) in zip(resumed, straight, strict=True):
        assert torch.equal(mine, theirs)
    for trained, cached in zip(spies["samples"][:10], spies["samples"][12:22], strict=True):
        assert torch.equal(trained, cached)


@pytest.mark.one_snapshot  # CI time: main's async loop runs in test_trainer_loop.py and
# test_ray_nodes.py is v0.7.0's too; v0.7.0 is the snapshot whose collector can stall
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
