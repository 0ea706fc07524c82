"""The tiny CPU recipe end to end, shortened: NeMo-RL's grpo_train with our CPU backends.

A few steps of ``mmpo_tiny_cpu.yaml`` (the one-command run, ``tiny_cpu.run``): the advantages
the policy trains on are the core library's for the rewards NeMo-RL's Math-Verify environment
returned; the first optimizer step lowers that loss on its batch; a second run resumes from the
saved step (an epoch's end) with the same data order as an uninterrupted run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from nemo_rl_support import CONFIGS_DIR, import_nemo_rl
from test_trainer_loop import ray_cluster  # noqa: F401

import_nemo_rl("nemo_rl.algorithms.grpo")

from nemo_mmpo import compute_advantages, group_ids_from_prompt_rows
from nemo_mmpo.nemo_rl import MMPOAdvantageEstimator, tiny_cpu
from nemo_mmpo.nemo_rl.cpu_backends import CPUPolicy, SeparateCPUGeneration, token_logprobs
from nemo_mmpo.nemo_rl.run_config import load_run_config


def recipe(tmp_path, name, steps, *extra, config="mmpo_tiny_cpu.yaml"):
    overrides = [
        f"grpo.max_num_steps={steps}",
        "checkpointing.save_period=5",
        f"checkpointing.checkpoint_dir={tmp_path / name / 'checkpoints'}",
        f"logger.log_dir={tmp_path / name / 'logs'}",
        *extra,
    ]
    return load_run_config(CONFIGS_DIR / config, overrides).config


@pytest.fixture
def spies(monkeypatch):
    """Record the estimator's inputs/outputs and the batches the policy trains on."""
    calls = {"estimator": [], "train": [], "policies": [], "loss": []}
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


def test_short_tiny_run_trains_on_the_core_advantages_and_resumes(
    ray_cluster,  # noqa: F811
    spies,
    tmp_path,
):
    first = tiny_cpu.run(recipe(tmp_path, "run", 10))
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
    assert 0.2 < rewards.mean() < 0.9  # the warm start leaves mixed rewards: a signal
    # the first optimizer step lowers the loss NeMo-RL handed to the policy, on its batch
    # (Adam's first update is a descent direction; later ones carry momentum from earlier
    # batches, so the 300-step reward curve in the README is the evidence past step 1)
    before, after = spies["loss"][0]
    assert after < before
    assert all(before != after for before, after in spies["loss"])  # every step moved it
    assert Path(first["checkpoint"]).parent.parent.name == "step_10"
    assert (Path(first["checkpoint"]) / "tokenizer.json").is_file()  # a complete HF checkpoint
    # NeMo-RL's logger wrote our metrics to TensorBoard, once per step
    success = tiny_cpu.reward_curve(tmp_path / "run" / "logs", "train/mmpo/success_rate")
    assert [step for step, _ in success] == list(range(1, 11))
    assert [value for _, value in success] == pytest.approx(rewards.tolist())

    # resume: the same command with more steps continues from step 10 (an epoch's end)
    resumed_from = len(spies["estimator"])
    tiny_cpu.run(recipe(tmp_path, "run", 12))
    assert len(spies["estimator"]) == resumed_from + 2  # steps 11 and 12 only
    assert (tmp_path / "run" / "checkpoints" / "step_12" / "policy" / "weights").is_dir()
    # ... seeing the prompts an uninterrupted run sees at steps 11 and 12
    uninterrupted_from = len(spies["estimator"])
    tiny_cpu.run(recipe(tmp_path, "straight", 12))
    resumed = spies["estimator"][resumed_from:uninterrupted_from]
    straight = spies["estimator"][uninterrupted_from + 10 :]
    assert len(resumed) == len(straight) == 2
    for (_, mine, _), (_, theirs, _) in zip(resumed, straight, strict=True):
        assert torch.equal(mine, theirs)


def test_short_async_tiny_run_refits_a_separate_engine_and_resumes(
    ray_cluster,  # noqa: F811
    spies,
    tmp_path,
    monkeypatch,
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

    first = tiny_cpu.run(recipe(tmp_path, "async", 3, config="mmpo_tiny_cpu_async.yaml"))
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

    tiny_cpu.run(recipe(tmp_path, "async", 4, config="mmpo_tiny_cpu_async.yaml"))
    assert len(spies["estimator"]) == 4  # step 4 only
    assert (tmp_path / "async" / "checkpoints" / "step_4" / "policy" / "weights").is_dir()
