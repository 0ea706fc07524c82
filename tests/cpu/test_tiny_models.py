"""The CPU rig's tiny models (``cpu_backend.model.architecture``): the Llama as it always was,
a Qwen3 from Qwen3-1.7B-Base's config with the sizes shrunk, a bad name refused in one line,
checkpoints loaded by their config's class, and a run without a warm start."""

from __future__ import annotations

import torch

from nemo_mmpo.cpu.rig.model import ModelShape, char_tokenizer, load_tiny_model, tiny_model
from nemo_mmpo.cpu.rig.rig_settings import TinySettings
from nemo_mmpo.cpu.rig.task import AdditionTask
from nemo_mmpo.cpu.rig.warm_start import Sampler, WarmStartSettings, WarmStartSpec
from nemo_mmpo.errors import MMPOInputError

QWEN3 = ModelShape(architecture="qwen3")


def test_the_tiny_qwen3_is_qwen3_1_7b_bases_config_with_the_sizes_shrunk(tmp_path):
    tokenizer = char_tokenizer()
    model = tiny_model(tokenizer, QWEN3, seed=0)
    config = model.config
    assert type(model).__name__ == "Qwen3ForCausalLM" and config.model_type == "qwen3"
    assert (config.hidden_size, config.num_hidden_layers) == (128, 2)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 2, 32)
    assert config.intermediate_size == 3 * 128 and config.vocab_size == len(tokenizer)
    assert config.rope_parameters["rope_theta"] == 1e6 and config.rms_norm_eps == 1e-6
    assert config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    assert config.hidden_act == "silu" and not config.attention_bias
    assert model.model.layers[0].self_attn.q_norm.weight.shape == (32,)  # q/k RMSNorm
    model.save_pretrained(tmp_path)
    loaded = load_tiny_model(tmp_path)
    assert type(loaded).__name__ == "Qwen3ForCausalLM"
    ids = torch.tensor([tokenizer.encode("What is 2 + 3?")])
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, model(ids).logits)


def test_the_llama_and_its_warm_start_key_are_what_they_were():
    """The default architecture builds the same seeded Llama, and a warm start's cache key
    leaves out ``architecture`` (llama) and ``enabled``: caches made before they existed are
    found (the key CI's sessions' warm start had before)."""
    tokenizer = char_tokenizer()
    model = tiny_model(tokenizer, ModelShape(), seed=0)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.num_key_value_heads == model.config.num_attention_heads == 4
    sampler = Sampler(temperature=1.0, top_p=1.0, max_new_tokens=12)
    spec = WarmStartSpec(AdditionTask(), ModelShape(), WarmStartSettings(), sampler, seed=0)
    assert spec.key() == "6fa599737ff69587"
    qwen3 = WarmStartSpec(AdditionTask(), QWEN3, WarmStartSettings(), sampler, seed=0)
    assert qwen3.key() != spec.key() and qwen3.parts()["shape"]["architecture"] == "qwen3"


def test_a_bad_architecture_is_refused_in_one_line():
    for section, words in (
        ({"model": {"architecture": "mistral"}}, ["architecture='mistral'", "'llama' or 'qwen3'"]),
        ({"model": {"architecture": "qwen3", "num_heads": 1}}, ["num_heads=1 must be even"]),
    ):
        try:
            TinySettings.from_config(section)
        except MMPOInputError as error:
            message = str(error)
        else:
            raise AssertionError(f"{section} was accepted")
        assert "\n" not in message and all(word in message for word in words), message


def test_without_a_warm_start_the_policy_starts_from_the_seeded_random_model():
    from nemo_mmpo.cpu.rig.policy_start import policy_model

    class NoCheckpoints:
        def get_latest_checkpoint_path(self):
            return None

    settings = TinySettings.from_config(
        {"model": {"architecture": "qwen3"}, "warm_start": {"enabled": False}, "seed": 5}
    )
    notes = []
    model, optimizer, info, last = policy_model(
        settings, char_tokenizer(), {}, NoCheckpoints(), notes.append
    )
    assert (optimizer, info, last) == (None, None, None)
    expected = tiny_model(char_tokenizer(), QWEN3, seed=5)
    mine, theirs = model.state_dict(), expected.state_dict()
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[name], theirs[name]) for name in mine)
    assert notes and notes[0].startswith("warm start: off"), notes
