"""The CPU policy and generation engines on a tiny random Llama, through NeMo-RL's code.

Checks the engines' conventions against NeMo-RL's loss, data types and interfaces: sampled
tokens' log-probabilities are the policy's at the sampling temperature (computed here by hand,
so a backend that forgot the temperature on both sides would still fail), one optimizer step
with NeMo-RL's loss moves the right way, and the separate engine samples from its own copy of
the weights until a refit. The whole loop (NeMo-RL's ``grpo_train`` with the Math-Verify
environment) runs in ``test_tiny_run.py``.
"""

from __future__ import annotations

import pytest
import torch
from nemo_rl_support import import_nemo_rl, master_config_from_recipe

pytestmark = pytest.mark.nemo_rl
loss_module = import_nemo_rl("nemo_rl.algorithms.loss")
BatchedDataDict = import_nemo_rl("nemo_rl.distributed.batched_data_dict").BatchedDataDict
interfaces = {
    "policy": import_nemo_rl("nemo_rl.models.policy.interfaces").ColocatablePolicyInterface,
    "generation": import_nemo_rl("nemo_rl.models.generation.interfaces").GenerationInterface,
}

from nemo_mmpo.cpu.engines.generation import CPUGeneration, SeparateCPUGeneration
from nemo_mmpo.cpu.engines.policy import CPUPolicy, DriverSidePolicy
from nemo_mmpo.cpu.rig.model import ModelShape, char_tokenizer
from nemo_mmpo.cpu.rig.model import tiny_llama as build_tiny_llama


def tiny_llama(tokenizer):
    return build_tiny_llama(tokenizer, ModelShape(hidden_size=48), seed=0)


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


def by_hand(model, output_ids, temperature):
    """``log softmax(logits / temperature)`` of each next token, computed here (no padding)."""
    with torch.no_grad():
        logits = model(input_ids=output_ids).logits[:, :-1].double()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return logprobs.gather(-1, output_ids[:, 1:, None]).squeeze(-1)


def assert_generation_logprobs_follow_the_temperature(model, output, prompts, temperature):
    """The response tokens' ``logprobs`` are ``log softmax(logits / temperature)`` of the
    sampled tokens, 0 elsewhere; at another temperature they would differ."""
    lengths = output["unpadded_sequence_lengths"]
    for row in range(output["output_ids"].shape[0]):
        start, end = int(prompts["input_lengths"][row]), int(lengths[row])
        ids = output["output_ids"][row : row + 1, :end]
        expected = by_hand(model, ids, temperature)[0, start - 1 : end - 1]
        torch.testing.assert_close(
            output["logprobs"][row, start:end].double(), expected, atol=1e-5, rtol=0
        )
        assert torch.all(output["logprobs"][row, :start] == 0)
        assert torch.all(output["logprobs"][row, end:] == 0)
        if temperature != 1.0:
            other = by_hand(model, ids, 1.0)[0, start - 1 : end - 1]
            assert (expected - other).abs().max() > 1e-3


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_generation_logprobs_are_the_policys_for_the_sampled_tokens(temperature):
    tokenizer = char_tokenizer()
    config = policy_config(temperature=temperature)
    policy = CPUPolicy(tiny_llama(tokenizer), tokenizer, config)
    generation = CPUGeneration(policy, policy.cfg["generation"])
    prompts = prompt_batch(tokenizer, ["What is 1 + 2?", "Q7: 3 + 4 ="])
    torch.manual_seed(0)
    output = generation.generate(prompts)
    assert torch.equal(output["output_ids"][0, :14], prompts["input_ids"][0, :14])
    assert_generation_logprobs_follow_the_temperature(policy.model, output, prompts, temperature)
    recomputed = policy.get_logprobs(
        BatchedDataDict(
            {
                "input_ids": output["output_ids"],
                "input_lengths": output["unpadded_sequence_lengths"],
            }
        )
    )["logprobs"]
    mask = output["logprobs"] != 0
    torch.testing.assert_close(output["logprobs"][mask], recomputed[mask], atol=1e-5, rtol=0)


def test_the_engines_and_stand_ins_implement_nemo_rl_interfaces():
    """Subclasses of NeMo-RL's abstract interfaces: a method NeMo-RL adds (or one we forget)
    fails at construction, not in the middle of a run."""
    tokenizer = char_tokenizer()
    policy = CPUPolicy(tiny_llama(tokenizer), tokenizer, policy_config())
    assert isinstance(policy, interfaces["policy"])
    assert isinstance(CPUGeneration(policy, policy.cfg["generation"]), interfaces["generation"])
    assert issubclass(SeparateCPUGeneration, interfaces["generation"])

    class WithoutTrain(DriverSidePolicy):
        def get_logprobs(self, *args, **kwargs): ...

        def get_reference_policy_logprobs(self, *args, **kwargs): ...

        def save_checkpoint(self, *args, **kwargs): ...

    with pytest.raises(TypeError, match="train"):
        WithoutTrain()


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


# CI time: these two on main only; on v0.7.0 the separate engine is refit at every step of
# test_tiny_run.py's async run, and on both test_the_engines_and_stand_ins_implement_nemo_rl_
# interfaces checks it against the interface each snapshot declares
@pytest.mark.main_snapshot
def test_separate_engine_samples_at_the_temperature_of_its_config(ray_cluster):
    """The separate engine's log-probabilities (computed in its own process, on its own copy
    of the weights) are ``log softmax(logits / 0.7)`` of the tokens it sampled at 0.7."""
    tokenizer = char_tokenizer()
    policy = CPUPolicy(tiny_llama(tokenizer), tokenizer, policy_config(temperature=0.7))
    separate = SeparateCPUGeneration(policy, policy.cfg["generation"], seed=0)
    prompts = prompt_batch(tokenizer, ["What is 1 + 2?", "Q7: 3 + 4 =", "9+9?"])
    try:
        output = separate.generate(prompts)
    finally:
        separate.shutdown()
    assert_generation_logprobs_follow_the_temperature(policy.model, output, prompts, 0.7)


@pytest.mark.main_snapshot
def test_separate_engine_samples_from_its_copy_until_a_refit_sends_the_policys_weights(
    ray_cluster,
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
