"""The Hugging Face <-> megatron-core weight layouts of ``nemo_mmpo.cpu.megatron_llama`` (plain
torch; the converted model itself runs in ``tests/nemo_rl_adapter/test_megatron_llama.py``)."""

from __future__ import annotations

import pytest
import torch

from nemo_mmpo.cpu.megatron_llama import fuse_qkv, hf_to_megatron, llama_settings, split_qkv


def test_the_fused_layouts_group_queries_with_their_key_and_value():
    """megatron-core's ``linear_qkv`` rows: per query group, its query heads, key, value."""
    config = {"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 8}
    head_dim = 2
    q = torch.arange(4 * head_dim)[:, None].float().expand(-1, 8)  # row i holds i
    k = 100 + torch.arange(2 * head_dim)[:, None].float().expand(-1, 8)
    v = 200 + torch.arange(2 * head_dim)[:, None].float().expand(-1, 8)
    fused = fuse_qkv(q, k, v, config)
    assert fused[:, 0].tolist() == [0, 1, 2, 3, 100, 101, 200, 201, 4, 5, 6, 7, 102, 103, 202, 203]
    assert all(torch.equal(a, b) for a, b in zip(split_qkv(fused, config), (q, k, v), strict=True))


def test_what_the_conversion_does_not_cover_is_refused_by_name():
    config = {"num_attention_heads": 4, "hidden_size": 8, "tie_word_embeddings": True}
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        llama_settings(config)
    config = {"num_attention_heads": 4, "hidden_size": 8, "num_hidden_layers": 0}
    with pytest.raises(ValueError, match=r"does not place.*extra"):
        hf_to_megatron(
            {
                "model.embed_tokens.weight": torch.zeros(1),
                "model.norm.weight": torch.zeros(1),
                "lm_head.weight": torch.zeros(1),
                "extra.weight": torch.zeros(1),
            },
            config,
        )
