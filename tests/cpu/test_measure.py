"""The exact success measure the learning test and the spread read: each problem's probability
of its canonical answer, from one padded batch, equals the chain rule token by token on that
problem alone; the profile's shares count those probabilities."""

from __future__ import annotations

import pytest
import torch

from nemo_mmpo.cpu.rig.measure import expected_success, success_probabilities, success_profile
from nemo_mmpo.cpu.rig.model import ModelShape, char_tokenizer, tiny_llama
from nemo_mmpo.cpu.rig.task import AdditionTask


def chain_rule(model, tokenizer, problem, temperature):
    """p(response + eos | prompt), one token at a time, one unpadded sequence."""
    prompt = tokenizer.encode(problem.prompt, add_special_tokens=False)
    target = [*tokenizer.encode(problem.response, add_special_tokens=False)]
    target.append(tokenizer.eos_token_id)
    sequence, probability = list(prompt), torch.tensor(1.0, dtype=torch.float64)
    with torch.no_grad():
        for token in target:
            logits = model(torch.tensor([sequence])).logits[0, -1].double() / temperature
            probability = probability * torch.softmax(logits, -1)[token]
            sequence.append(token)
    return float(probability)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_batched_probabilities_equal_the_chain_rule_per_problem(temperature):
    tokenizer = char_tokenizer()
    model = tiny_llama(tokenizer, ModelShape(hidden_size=32, num_layers=1), seed=3).eval()
    # sharpen a random model so the probabilities are not all ~0
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    _, held_out = AdditionTask().split()
    problems = held_out[::40]  # every stratum, prompts of different lengths: real padding
    batched = success_probabilities(model, tokenizer, problems, temperature)
    assert batched.dtype == torch.float64 and batched.shape == (len(problems),)
    single = [chain_rule(model, tokenizer, problem, temperature) for problem in problems]
    assert torch.allclose(batched, torch.tensor(single, dtype=torch.float64), rtol=1e-4, atol=0)
    assert expected_success(model, tokenizer, problems, temperature) == pytest.approx(
        float(batched.mean())
    )


def test_the_profile_counts_the_probabilities(monkeypatch):
    values = torch.tensor([0.05, 0.1, 0.19, 0.2, 0.5, 0.8, 0.81, 0.99], dtype=torch.float64)
    monkeypatch.setattr(
        "nemo_mmpo.cpu.rig.measure.success_probabilities", lambda *args, **kwargs: values
    )
    profile = success_profile(None, None, [])
    assert profile == {
        "mean": pytest.approx(float(values.mean())),
        "below_0.2": 3 / 8,
        "above_0.8": 2 / 8,
    }
