"""The tiny Hugging Face Llama as a megatron-core ``GPTModel``, and its weights both ways.

The CPU rig's policy is a ``LlamaForCausalLM`` built from a config
(:func:`nemo_mmpo.cpu.model.tiny_llama`). A Megatron policy holds the same network as a
megatron-core ``GPTModel``: RMSNorm, SwiGLU, rotary positions, no biases, untied output layer.
:func:`llama_settings` gives the ``TransformerConfig`` settings of a ``LlamaConfig``;
:func:`hf_to_megatron` and :func:`megatron_to_hf` rename and re-lay the weights between the two
(the one-process model's names on the Megatron side; :mod:`nemo_mmpo.cpu.megatron_model` shards
them for tensor and pipeline parallel). Two layouts differ, not only names:

- attention: Megatron fuses ``q``, ``k`` and ``v`` into one ``linear_qkv`` whose rows run by
  query group, each group's query heads then its key head then its value head (megatron-core's
  ``SelfAttention.get_query_key_value_tensors``);
- MLP: Megatron's ``linear_fc1`` is ``gate`` then ``up`` (its gated linear unit applies the
  activation to the first half).

These functions hold no Megatron state: they work on plain ``{name: tensor}`` dicts.
"""

from __future__ import annotations

from typing import Any

import torch

HF_LAYER = "model.layers.{}."
MEGATRON_LAYER = "decoder.layers.{}."

#: Hugging Face name -> Megatron name, outside the decoder layers
OUTER = {
    "model.embed_tokens.weight": "embedding.word_embeddings.weight",
    "model.norm.weight": "decoder.final_layernorm.weight",
    "lm_head.weight": "output_layer.weight",
}
#: per decoder layer, the tensors renamed only
PER_LAYER = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attn.o_proj.weight": "self_attention.linear_proj.weight",
    "post_attention_layernorm.weight": "pre_mlp_layernorm.weight",
    "mlp.down_proj.weight": "mlp.linear_fc2.weight",
}


def _get(config: Any, name: str, default: Any = None) -> Any:
    return (
        getattr(config, name, default)
        if not isinstance(config, dict)
        else config.get(name, default)
    )


def llama_settings(config: Any) -> dict[str, Any]:
    """``TransformerConfig`` settings, plus ``GPTModel``'s ``rotary_base``, for the network a
    ``LlamaConfig`` (or its dict) describes (:func:`nemo_mmpo.cpu.megatron_model.tiny_gpt`
    takes them); refuses what the conversion does not cover (biases, tied embeddings, scaled
    rotary positions)."""
    heads = _get(config, "num_attention_heads")
    groups = _get(config, "num_key_value_heads") or heads
    hidden = _get(config, "hidden_size")
    head_dim = _get(config, "head_dim") or hidden // heads
    unsupported = {
        "attention_bias": bool(_get(config, "attention_bias", False)),
        "mlp_bias": bool(_get(config, "mlp_bias", False)),
        "tie_word_embeddings": bool(_get(config, "tie_word_embeddings", False)),
        "rope_scaling": _rope_scaled(config),
        "hidden_act": _get(config, "hidden_act", "silu") != "silu",
    }
    named = [name for name, present in unsupported.items() if present]
    if named:
        raise ValueError(
            f"the Llama config sets {', '.join(named)}: the Megatron conversion covers untied, "
            "bias-free SwiGLU Llamas with plain rotary positions"
        )
    return {
        "num_layers": _get(config, "num_hidden_layers"),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_query_groups": groups,
        "kv_channels": head_dim,
        "ffn_hidden_size": _get(config, "intermediate_size"),
        "normalization": "RMSNorm",
        "layernorm_epsilon": _get(config, "rms_norm_eps", 1e-6),
        "gated_linear_unit": True,
        "activation_func": torch.nn.functional.silu,
        "add_bias_linear": False,
        "rotary_base": _rope_theta(config),
    }


def _rope_parameters(config: Any) -> dict[str, Any]:
    """transformers 5 keeps rotary settings in ``rope_parameters``; 4 in ``rope_theta`` and
    ``rope_scaling``."""
    return dict(_get(config, "rope_parameters") or _get(config, "rope_scaling") or {})


def _rope_scaled(config: Any) -> bool:
    return _rope_parameters(config).get("rope_type", "default") not in ("default", None)


def _rope_theta(config: Any) -> float:
    return float(_rope_parameters(config).get("rope_theta") or _get(config, "rope_theta", 10000.0))


def _shape(config: Any) -> tuple[int, int, int]:
    """``(query heads, query groups, head dim)``."""
    settings = llama_settings(config)
    return settings["num_attention_heads"], settings["num_query_groups"], settings["kv_channels"]


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: Any) -> torch.Tensor:
    """``linear_qkv``'s weight ``[(heads + 2 * groups) * head_dim, hidden]`` from Hugging
    Face's ``q_proj`` ``[heads * head_dim, hidden]``, ``k_proj`` and ``v_proj``
    ``[groups * head_dim, hidden]``: per group, its query heads, its key, its value."""
    heads, groups, head_dim = _shape(config)
    hidden = q.shape[-1]
    per_group = heads // groups
    q = q.reshape(groups, per_group * head_dim, hidden)
    k = k.reshape(groups, head_dim, hidden)
    v = v.reshape(groups, head_dim, hidden)
    return torch.cat([q, k, v], dim=1).reshape(-1, hidden)


def split_qkv(qkv: torch.Tensor, config: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inverse of :func:`fuse_qkv`: ``(q_proj, k_proj, v_proj)`` weights."""
    heads, groups, head_dim = _shape(config)
    hidden = qkv.shape[-1]
    per_group = heads // groups
    grouped = qkv.reshape(groups, (per_group + 2) * head_dim, hidden)
    q, k, v = grouped.split([per_group * head_dim, head_dim, head_dim], dim=1)
    return q.reshape(-1, hidden), k.reshape(-1, hidden), v.reshape(-1, hidden)


def hf_to_megatron(state: dict[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
    """The one-process ``GPTModel``'s weights (by Megatron name) from a ``LlamaForCausalLM``
    state dict. Every tensor is used once; a missing or left-over name is an error."""
    state = dict(state)
    out = {megatron: state.pop(hf) for hf, megatron in OUTER.items()}
    for layer in range(llama_settings(config)["num_layers"]):
        hf, megatron = HF_LAYER.format(layer), MEGATRON_LAYER.format(layer)
        for hf_name, megatron_name in PER_LAYER.items():
            out[megatron + megatron_name] = state.pop(hf + hf_name)
        out[megatron + "self_attention.linear_qkv.weight"] = fuse_qkv(
            *(state.pop(f"{hf}self_attn.{name}_proj.weight") for name in "qkv"), config
        )
        out[megatron + "mlp.linear_fc1.weight"] = torch.cat(
            [state.pop(f"{hf}mlp.gate_proj.weight"), state.pop(f"{hf}mlp.up_proj.weight")]
        )
    left = sorted(name for name in state if not name.endswith("rotary_emb.inv_freq"))
    if left:
        raise ValueError(f"Hugging Face weights the conversion does not place: {left}")
    return out


def megatron_to_hf(state: dict[str, torch.Tensor], config: Any) -> dict[str, torch.Tensor]:
    """The inverse of :func:`hf_to_megatron`: a ``LlamaForCausalLM`` state dict (the names
    NeMo-RL's refit sends vLLM) from the one-process ``GPTModel``'s weights."""
    state = dict(state)
    out = {hf: state.pop(megatron) for hf, megatron in OUTER.items()}
    for layer in range(llama_settings(config)["num_layers"]):
        hf, megatron = HF_LAYER.format(layer), MEGATRON_LAYER.format(layer)
        for hf_name, megatron_name in PER_LAYER.items():
            out[hf + hf_name] = state.pop(megatron + megatron_name)
        q, k, v = split_qkv(state.pop(megatron + "self_attention.linear_qkv.weight"), config)
        out.update(
            {f"{hf}self_attn.{n}_proj.weight": t for n, t in zip("qkv", (q, k, v), strict=True)}
        )
        gate, up = state.pop(megatron + "mlp.linear_fc1.weight").chunk(2)
        out.update({f"{hf}mlp.gate_proj.weight": gate, f"{hf}mlp.up_proj.weight": up})
    if state:
        raise ValueError(f"Megatron weights the conversion does not place: {sorted(state)}")
    return out
