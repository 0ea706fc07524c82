"""The Megatron CPU policy (``cpu_backend.policy: megatron``) against the one-process policy.

Both hold the same tiny Llama and train it with the same loss (NeMo-RL's ``ClippedPGLossFn``)
and the same optimizer (Adam, torch's AdamW defaults, no weight decay, clipping at 1.0): the
Megatron policy as megatron-core's ``GPTModel`` on two rank actors (tensor, pipeline or data
parallel 2) through NeMo-RL's Megatron train step and log-prob pass, the one-process policy as
the Hugging Face model in this process. What holds by construction, up to float32 rounding:
the log-probs (at the sampler's temperature, 0.7 here) and the loss and gradient norm of a step
are the same; the step moves the weights the same way; the weights a refit or a checkpoint
takes are the ranks' weights under Hugging Face names; a policy resumed from a checkpoint
(weights and each rank's Adam state) takes the same next step as the one that saved it.
"""

from __future__ import annotations

import copy

import pytest
import torch
from nemo_rl_support import import_nemo_rl, master_config_from_recipe

pytestmark = [pytest.mark.nemo_rl, pytest.mark.one_snapshot]
import_nemo_rl("megatron.core")
loss_module = import_nemo_rl("nemo_rl.algorithms.loss")
BatchedDataDict = import_nemo_rl("nemo_rl.distributed.batched_data_dict").BatchedDataDict
ColocatablePolicyInterface = import_nemo_rl(
    "nemo_rl.models.policy.interfaces"
).ColocatablePolicyInterface

from nemo_mmpo.cpu.megatron_policy import LAYOUT_FILE, Layout, MegatronCPUPolicy
from nemo_mmpo.cpu.model import ModelShape, char_tokenizer, tiny_llama
from nemo_mmpo.cpu.policy import CPUPolicy
from nemo_mmpo.errors import MMPOInputError

LEARNING_RATE = 1e-3
TEMPERATURE = 0.7
#: float32 through two different graphs (sharded matmuls, packed attention): relative
TOLERANCE = 1e-5
LAYOUTS = {
    "tp2": ["policy.megatron_cfg.tensor_model_parallel_size=2"],
    # at temperature 1: NeMo-RL divides each pipeline stage's output by the temperature (see
    # test_nemo_rl_divides_the_hidden_state_between_pipeline_stages_by_the_temperature)
    "pp2": [
        "policy.megatron_cfg.tensor_model_parallel_size=1",
        "policy.megatron_cfg.pipeline_model_parallel_size=2",
        "policy.generation.temperature=1.0",
    ],
    "dp2": ["policy.megatron_cfg.tensor_model_parallel_size=1"],
}


def policy_config(layout: str) -> dict:
    """The Megatron tiny recipe's ``policy`` section (sequence packing on, as NeMo-RL's Megatron
    recipes), 16 rows a step in micro-batches of 4, the sampler at :data:`TEMPERATURE`."""
    overrides = [
        "policy.train_global_batch_size=16",
        "policy.train_micro_batch_size=4",
        "policy.logprob_batch_size=4",
        f"policy.generation.temperature={TEMPERATURE}",
        *LAYOUTS[layout],
    ]
    return dict(master_config_from_recipe("mmpo_tiny_cpu_megatron.yaml", overrides).policy)


def training_batch(tokenizer, generator) -> BatchedDataDict:
    """16 sums with right or wrong answers, ragged; the answer is the response (token mask), its
    advantage +-1, one row masked out."""
    texts, prompt_lengths = [], []
    for row in range(16):
        a, b = (int(x) for x in torch.randint(0, 100, (2,), generator=generator))
        answer = (
            a + b + (0 if row % 2 == 0 else int(torch.randint(1, 9, (1,), generator=generator)))
        )
        prompt = f"{a}+{b}="
        texts.append(f"{prompt}\\boxed{{{answer}}}")
        prompt_lengths.append(len(prompt))
    encoded = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    width = -(-max(map(len, encoded)) // 4) * 4
    input_ids = torch.full((16, width), tokenizer.pad_token_id)
    token_mask = torch.zeros(16, width)
    for row, ids in enumerate(encoded):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        token_mask[row, prompt_lengths[row] : len(ids)] = 1.0
    advantages = torch.tensor([1.0 if row % 2 == 0 else -1.0 for row in range(16)])
    sample_mask = torch.ones(16)
    sample_mask[5] = 0.0
    return BatchedDataDict(
        {
            "input_ids": input_ids,
            "input_lengths": torch.tensor([len(ids) for ids in encoded]),
            "token_mask": token_mask,
            "sample_mask": sample_mask,
            "advantages": advantages[:, None].expand(16, width).clone(),
        }
    )


def on_policy(data: BatchedDataDict, logprobs: torch.Tensor) -> BatchedDataDict:
    return BatchedDataDict({**data, "prev_logprobs": logprobs, "generation_logprobs": logprobs})


def relative(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    if mask is not None:
        a, b = a[mask], b[mask]
    return float((a.double() - b.double()).norm() / b.double().norm())


def response_mask(data: BatchedDataDict) -> torch.Tensor:
    positions = torch.arange(data["input_ids"].shape[1])
    return (positions >= 1) & (positions < data["input_lengths"][:, None])


@pytest.fixture(scope="module")
def start():
    """The seeded tiny Llama, its tokenizer, NeMo-RL's clipped loss and one training batch."""
    tokenizer = char_tokenizer()
    model = tiny_llama(tokenizer, ModelShape(), seed=3)
    loss = loss_module.ClippedPGLossFn(master_config_from_recipe("mmpo_tiny_cpu.yaml").loss_fn)
    data = training_batch(tokenizer, torch.Generator().manual_seed(0))
    return model, tokenizer, loss, data


def one_process(start, layout):
    model, tokenizer, _, _ = start
    config = dict(policy_config(layout), optimizer={"kwargs": {"lr": LEARNING_RATE}})
    return CPUPolicy(copy.deepcopy(model), tokenizer, config)


def megatron(start, layout, model=None):
    original, tokenizer, _, _ = start
    return MegatronCPUPolicy(
        copy.deepcopy(model if model is not None else original),
        tokenizer,
        policy_config(layout),
        LEARNING_RATE,
        ranks=2,
    )


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_step_equals_the_one_process_step(ray_cluster, start, layout):
    """Log-probs, the step's loss and gradient norm, and the log-probs after the step."""
    _, _, loss, data = start
    reference = one_process(start, layout)
    policy = megatron(start, layout)
    try:
        assert isinstance(policy, ColocatablePolicyInterface)
        assert vars(policy.layout) == {
            "tensor": 2 if layout == "tp2" else 1,
            "pipeline": 2 if layout == "pp2" else 1,
            "context": 1,
            "data": 2 if layout == "dp2" else 1,
        }
        mask = response_mask(data)
        expected = reference.get_logprobs(data)["logprobs"]
        got = policy.get_logprobs(data)["logprobs"]
        assert got.shape == expected.shape
        assert relative(got, expected, mask) < TOLERANCE
        if reference.temperature != 1.0:  # the sampler's temperature reached the ranks
            plain = copy.deepcopy(reference)
            plain.temperature = 1.0
            assert relative(plain.get_logprobs(data)["logprobs"], expected, mask) > 100 * TOLERANCE

        batch = on_policy(data, expected)
        mine, theirs = policy.train(batch, loss), reference.train(batch, loss)
        assert relative(mine["loss"], theirs["loss"]) < TOLERANCE
        assert relative(mine["grad_norm"], theirs["grad_norm"]) < TOLERANCE
        assert set(mine["all_mb_metrics"]["lr"]) == {LEARNING_RATE}
        moved = reference.get_logprobs(data)["logprobs"] - expected
        moved_here = policy.get_logprobs(data)["logprobs"] - expected
        assert moved[mask].abs().max() > 1e-3  # the step changed the policy
        assert relative(moved_here, moved, mask) < 1e-2
        # the weights the refit and checkpoints take are the ranks' (gathered, renamed)
        state = policy.model.state_dict()
        assert set(state) == set(reference.model.state_dict())
        assert set(policy.prepare_refit_info()) == set(state)
    finally:
        policy.shutdown()


def test_a_resumed_policy_takes_the_same_next_step(ray_cluster, start, tmp_path):
    """Checkpoint after one step (Hugging Face weights, each rank's Adam state, the layout),
    then: the policy that saved it and one built from the checkpoint take the same second
    step; a checkpoint of another layout is refused by name."""
    from transformers import LlamaForCausalLM

    _, _, loss, data = start
    policy = megatron(start, "tp2")
    try:
        batch = on_policy(data, policy.get_logprobs(data)["logprobs"])
        policy.train(batch, loss)
        policy.save_checkpoint(
            str(tmp_path / "weights"), str(tmp_path / "optimizer"), str(tmp_path / "tokenizer")
        )
        assert (tmp_path / "optimizer" / LAYOUT_FILE).is_file()
        assert {p.name for p in (tmp_path / "optimizer").glob("rank-*.pt")} == {
            "rank-0.pt",
            "rank-1.pt",
        }
        saved = LlamaForCausalLM.from_pretrained(tmp_path / "weights").float().eval()
        for name, tensor in policy.model.state_dict().items():
            assert torch.equal(saved.state_dict()[name], tensor), name
        batch = on_policy(data, policy.get_logprobs(data)["logprobs"])
        continued = policy.train(batch, loss)
        after = policy.get_logprobs(data)["logprobs"]
    finally:
        policy.shutdown()

    resumed = megatron(start, "tp2", model=saved)
    try:
        resumed.load_optimizer(tmp_path / "optimizer")
        assert resumed.steps == 1
        torch.testing.assert_close(resumed.get_logprobs(data)["logprobs"], batch["prev_logprobs"])
        again = resumed.train(batch, loss)
        assert torch.equal(again["loss"], continued["loss"])
        torch.testing.assert_close(resumed.get_logprobs(data)["logprobs"], after)
    finally:
        resumed.shutdown()

    other = megatron(start, "dp2", model=saved)
    try:
        with pytest.raises(MMPOInputError, match="megatron_ranks"):
            other.load_optimizer(tmp_path / "optimizer")
    finally:
        other.shutdown()


def test_a_layout_that_does_not_divide_the_ranks_is_refused_by_name():
    with pytest.raises(MMPOInputError, match=r"cpu_backend\.megatron_ranks=3"):
        Layout.from_config({"megatron_cfg": {"tensor_model_parallel_size": 2}}, ranks=3)


def test_nemo_rl_divides_the_hidden_state_between_pipeline_stages_by_the_temperature(
    ray_cluster, start
):
    """NeMo-RL's Megatron forward step (``forward_with_post_processing_fn``, v0.7.0 and main)
    divides its model's output by the sampler's temperature on every pipeline stage, not only
    the last: the hidden state a stage hands the next is divided too. Under pipeline parallel
    with a temperature other than 1 the log-probs (and the loss) are then not those of the
    model vLLM samples from. Pinned here exactly: PP2's log-probs at 0.7 are those of the
    Hugging Face model whose first layer's output is divided by 0.7, and not the model's
    own. ``--dry-run`` warns about the setting (``pipeline_temperature`` rule); when NeMo-RL
    fixes it this test fails, and the rule and this test go."""
    model, tokenizer, _, data = start
    config = policy_config("pp2")
    config["generation"] = dict(config["generation"], temperature=TEMPERATURE)
    policy = MegatronCPUPolicy(copy.deepcopy(model), tokenizer, config, LEARNING_RATE, ranks=2)
    try:
        got = policy.get_logprobs(data)["logprobs"]
    finally:
        policy.shutdown()
    mask = response_mask(data)
    reference = CPUPolicy(copy.deepcopy(model), tokenizer, config)
    own = reference.get_logprobs(data)["logprobs"]

    def divided(module, inputs, output):
        if isinstance(output, tuple):
            return (output[0] / TEMPERATURE, *output[1:])
        return output / TEMPERATURE

    hook = reference.model.model.layers[0].register_forward_hook(divided)
    try:
        scaled = reference.get_logprobs(data)["logprobs"]
    finally:
        hook.remove()
    assert relative(got, scaled, mask) < TOLERANCE
    assert relative(got, own, mask) > 100 * TOLERANCE
