"""The CPU policy and generation backends on a tiny random Llama, through NeMo-RL's code.

Checks the backends' conventions against NeMo-RL's loss and data types, then drives NeMo-RL's
real ``grpo_train`` with them: real sampling from the model, NeMo-RL's Math-Verify environment
(a Ray actor) grading it, our estimator and loss, optimizer steps on the model.
"""

from __future__ import annotations

import pytest
import torch
from nemo_rl_support import import_nemo_rl, master_config_from_recipe
from test_trainer_loop import PROMPTS, TINY_RUN, initial_save_state, ray_cluster  # noqa: F401
from trainer_standins import RecordingLogger, char_tokenizer, math_dataset

grpo = import_nemo_rl("nemo_rl.algorithms.grpo")
loss_module = import_nemo_rl("nemo_rl.algorithms.loss")
BatchedDataDict = import_nemo_rl("nemo_rl.distributed.batched_data_dict").BatchedDataDict
collate = import_nemo_rl("nemo_rl.data.collate_fn")
checkpoint_module = import_nemo_rl("nemo_rl.utils.checkpoint")
math_environment = import_nemo_rl("nemo_rl.environments.math_environment")
from torchdata.stateful_dataloader import StatefulDataLoader

from nemo_mmpo.nemo_rl import MMPOAdvantageEstimator, install, tiny_cpu
from nemo_mmpo.nemo_rl.cpu_backends import CPUGeneration, CPUPolicy, SeparateCPUGeneration


def tiny_llama(tokenizer):
    return tiny_cpu.tiny_llama(tokenizer, tiny_cpu.TinySettings(hidden_size=48))


def policy_config(**generation):
    return {
        "train_global_batch_size": 16,
        "train_micro_batch_size": 4,
        "max_grad_norm": 1.0,
        "optimizer": {"kwargs": {"lr": 3e-3, "weight_decay": 0.0}},
        "generation": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 12, **generation},
    }


def prompt_batch(tokenizer, texts):
    encoded = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    width = max(len(ids) for ids in encoded)
    input_ids = torch.full((len(texts), width), tokenizer.pad_token_id)
    for row, ids in enumerate(encoded):
        input_ids[row, : len(ids)] = torch.tensor(ids)
    return BatchedDataDict(
        {"input_ids": input_ids, "input_lengths": torch.tensor([len(ids) for ids in encoded])}
    )


def test_generation_logprobs_are_the_policys_for_the_sampled_tokens():
    tokenizer = char_tokenizer()
    policy = CPUPolicy(tiny_llama(tokenizer), tokenizer, policy_config())
    generation = CPUGeneration(policy, policy.cfg["generation"])
    prompts = prompt_batch(tokenizer, ["What is 1 + 2?", "Q7: 3 + 4 ="])
    output = generation.generate(prompts)
    lengths = output["unpadded_sequence_lengths"]
    assert torch.equal(output["output_ids"][0, :14], prompts["input_ids"][0, :14])
    recomputed = policy.get_logprobs(
        BatchedDataDict({"input_ids": output["output_ids"], "input_lengths": lengths})
    )["logprobs"]
    for row in range(2):
        start, end = int(prompts["input_lengths"][row]), int(lengths[row])
        torch.testing.assert_close(
            output["logprobs"][row, start:end], recomputed[row, start:end], atol=1e-5, rtol=0
        )
        assert torch.all(output["logprobs"][row, :start] == 0)


def test_one_train_step_with_nemo_rl_loss_raises_the_advantaged_response():
    tokenizer = char_tokenizer()
    policy = CPUPolicy(tiny_llama(tokenizer), tokenizer, policy_config())
    texts = ["Q: 1+1? A: 2", "Q: 1+1? A: 3"]
    batch = prompt_batch(tokenizer, texts)
    prompt_length = len("Q: 1+1? A: ")
    token_mask = torch.zeros(batch["input_ids"].shape)
    token_mask[:, prompt_length:] = 1.0
    before = policy.get_logprobs(batch)["logprobs"]
    data = BatchedDataDict(
        {
            **batch,
            "token_mask": token_mask,
            "sample_mask": torch.ones(2),
            "advantages": torch.tensor([[1.0], [-1.0]]).expand(token_mask.shape).clone(),
            "prev_logprobs": before,
            "generation_logprobs": before,
        }
    )
    config = master_config_from_recipe("mmpo_math_qwen3_1.7b.yaml")
    results = policy.train(data, loss_module.ClippedPGLossFn(config.loss_fn), gbs=2, mbs=1)
    after = policy.get_logprobs(batch)["logprobs"]
    assert after[0, -1] > before[0, -1] and after[1, -1] < before[1, -1]
    assert results["loss"].shape == (1,) and torch.isfinite(results["grad_norm"]).all()
    assert len(results["all_mb_metrics"]["probs_ratio"]) == 2  # one per micro-batch


def test_separate_engine_samples_from_its_copy_until_a_refit_sends_the_policys_weights(
    ray_cluster,  # noqa: F811
):
    """``SeparateCPUGeneration`` (the async layout): greedy outputs equal the colocated engine's
    on the same weights; after an optimizer step they are the old weights' until NeMo-RL's
    non-colocated refit call (``update_weights_from_collective``) moves the new ones over; a
    pickled copy (what the trajectory collector holds) samples but cannot refit."""
    import pickle

    import ray

    tokenizer = char_tokenizer()
    policy = CPUPolicy(tiny_llama(tokenizer), tokenizer, policy_config(max_new_tokens=8))
    colocated = CPUGeneration(policy, policy.cfg["generation"])
    separate = SeparateCPUGeneration(policy, policy.cfg["generation"], seed=0)
    prompts = prompt_batch(tokenizer, ["What is 1 + 2?", "Q7: 3 + 4 ="])
    try:
        before = colocated.generate(prompts, greedy=True)
        for key in ("output_ids", "generation_lengths"):
            assert torch.equal(separate.generate(prompts, greedy=True)[key], before[key])
        with torch.no_grad():  # a large change of the policy's weights (as a training step)
            for parameter in policy.model.parameters():
                parameter.add_(torch.randn_like(parameter))
        after = colocated.generate(prompts, greedy=True)
        assert not torch.equal(after["output_ids"], before["output_ids"])
        stale = separate.generate(prompts, greedy=True)
        assert torch.equal(stale["output_ids"], before["output_ids"])  # not refit yet
        assert all(ray.get(separate.update_weights_from_collective()))
        refit = separate.generate(prompts, greedy=True)
        assert torch.equal(refit["output_ids"], after["output_ids"])
        torch.testing.assert_close(refit["logprobs"], after["logprobs"], atol=1e-5, rtol=0)
        assert separate.refit_count() == 1

        # requests sent together (NeMo-RL's async rollouts send one per sample) are sampled
        # together and each gets its own rows, whatever the prompts' widths
        texts = ["What is 1 + 2?", "Q7: 3 + 4 =", "9+9?"]
        alone = [colocated.generate(prompt_batch(tokenizer, [text]), greedy=True) for text in texts]
        requests = [
            separate.worker.generate.remote(prompt_batch(tokenizer, [text]), True) for text in texts
        ]
        for solo, together in zip(alone, ray.get(requests), strict=True):
            length = int(solo["unpadded_sequence_lengths"][0])
            assert torch.equal(
                together["unpadded_sequence_lengths"], solo["unpadded_sequence_lengths"]
            )
            assert torch.equal(together["output_ids"][0, :length], solo["output_ids"][0, :length])
        assert max(separate.sampled_batch_sizes()) > 1

        copy = pickle.loads(pickle.dumps(separate))
        assert copy.policy is None
        assert torch.equal(copy.generate(prompts, greedy=True)["output_ids"], after["output_ids"])
        with pytest.raises(RuntimeError, match="driver's generation object"):
            copy.update_weights_from_collective()
    finally:
        separate.shutdown()
    assert separate.shutdown()  # idempotent: NeMo-RL's trainer and our driver both call it


def test_grpo_train_runs_on_the_tiny_model_with_nemo_rl_math_environment(
    ray_cluster,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    import ray

    install()
    config = master_config_from_recipe(
        "mmpo_math_qwen3_1.7b.yaml", [*TINY_RUN, "grpo.max_num_steps=3"]
    )
    tokenizer = char_tokenizer()
    records = math_dataset(tokenizer, 16)
    policy = CPUPolicy(tiny_llama(tokenizer), tokenizer, policy_config(max_new_tokens=24))
    assert tiny_cpu.warm_start(policy.model, tokenizer, records, 150, 1e-2) < 0.5
    generation = CPUGeneration(policy, policy.cfg["generation"])
    config.policy["generation"]["max_new_tokens"] = 24
    environment = math_environment.MathEnvironment.options(
        runtime_env={
            "py_executable": import_nemo_rl(
                "nemo_rl.distributed.virtual_cluster"
            ).PY_EXECUTABLES.SYSTEM
        }
    ).remote({"num_workers": 1})
    calls = []
    original = MMPOAdvantageEstimator.compute_advantage

    def recording(self, prompt_ids, rewards, mask, *args, **kwargs):
        calls.append(rewards.clone())
        return original(self, prompt_ids, rewards, mask, *args, **kwargs)

    monkeypatch.setattr(MMPOAdvantageEstimator, "compute_advantage", recording)
    weights_before = [p.detach().clone() for p in policy.model.parameters()]
    config.checkpointing["checkpoint_dir"] = str(tmp_path / "checkpoints")
    logger = RecordingLogger()
    grpo.grpo_train(
        policy,
        generation,
        StatefulDataLoader(
            records, batch_size=PROMPTS, shuffle=False, collate_fn=collate.rl_collate_fn
        ),
        None,
        tokenizer,
        grpo.ClippedPGLossFn(config.loss_fn),
        {"math": environment},
        None,
        logger,
        checkpoint_module.CheckpointManager(config.checkpointing),
        initial_save_state(),
        config,
    )
    ray.kill(environment)
    assert len(calls) == 3
    rewards = torch.cat(calls)
    assert 0 < rewards.mean() < 1, "the warm start should leave mixed rewards"
    assert any(
        not torch.equal(before, after.detach())
        for before, after in zip(weights_before, policy.model.parameters(), strict=True)
    )
    assert [step for step, _ in logger.metrics["train/mmpo/success_rate"]] == [1, 2, 3]
    saved = tmp_path / "checkpoints" / "step_3" / "policy" / "weights"
    assert (saved / "config.json").is_file()
