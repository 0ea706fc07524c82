"""The tiny Qwen3 through Megatron-Bridge's Qwen3 bridge on the CPU, in a fresh interpreter:
``python qwen3_bridge_check.py HF_FOLDER OUT_JSON`` (``tests/cpu/test_qwen3_bridge.py`` runs it).

First a ``transformers`` forward of the folder's model, before anything else: a model that
``transformers`` 5.8.1 loads in a process holding the CPU answers and Megatron-Bridge has zeros
in its rotary embedding's non-persistent ``inv_freq`` (docs/cpu-answers.md). Then, as
NeMo-RL's Megatron worker does on the CPU rig: the worker's CPU answers
(:mod:`nemo_mmpo.cpu.answers.megatron_shims`), one gloo rank, ``AutoBridge.from_hf_pretrained``
and ``to_megatron_provider(load_weights=True)`` (the CPU answer gives the local layer spec,
:func:`~nemo_mmpo.cpu.answers.megatron_attention.cpu_layer_spec`), the model built and its
weights imported (Hugging Face -> Megatron), a forward, and ``export_hf_weights`` (Megatron ->
Hugging Face, what the refit sends vLLM and the converter writes). Writes what the test
asserts into ``OUT_JSON``.
"""

from __future__ import annotations

import json
import sys

import torch
from transformers import AutoModelForCausalLM

SEQUENCE = 16


def main(folder: str, out: str) -> None:
    reference = AutoModelForCausalLM.from_pretrained(folder).float().eval()
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1, reference.config.vocab_size, (2, SEQUENCE), generator=generator)
    with torch.no_grad():
        expected = reference(input_ids).logits
    hugging_face = {name: tensor.clone() for name, tensor in reference.state_dict().items()}

    from nemo_mmpo.cpu.answers import megatron_shims

    megatron_shims.answer_torch()
    megatron_shims.install_on_import()
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    from megatron.bridge import AutoBridge
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    from nemo_mmpo.cpu.answers.megatron_attention import cpu_layer_spec

    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(0)
    bridge = AutoBridge.from_hf_pretrained(folder, dtype=torch.float32)
    provider = bridge.to_megatron_provider(load_weights=True)
    provider.params_dtype = provider.pipeline_dtype = torch.float32
    provider.finalize()
    models = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)
    (model,) = models
    model.eval()
    attention = model.decoder.layers[0].self_attention
    positions = torch.arange(SEQUENCE)[None].expand(2, SEQUENCE)
    causal = torch.triu(torch.ones(1, 1, SEQUENCE, SEQUENCE, dtype=torch.bool), diagonal=1)
    with torch.no_grad():
        logits = model(input_ids=input_ids, position_ids=positions, attention_mask=causal)
    logits = logits[..., : expected.shape[-1]]
    exported = {name: tensor for name, tensor in bridge.export_hf_weights(models, cpu=True)}
    shared = sorted(set(exported) & set(hugging_face))
    report = {
        "bridge": type(bridge._model_bridge).__name__,
        "layer_spec": provider.transformer_layer_spec is cpu_layer_spec,
        "qk_layernorm": provider.qk_layernorm,
        "q_layernorm": type(attention.q_layernorm).__name__,
        "k_layernorm": type(attention.k_layernorm).__name__,
        "query_groups": provider.num_query_groups,
        "heads": provider.num_attention_heads,
        "tied": provider.share_embeddings_and_output_weights,
        "rotary_base": provider.rotary_base,
        "logits_relative": float((logits - expected).norm() / expected.norm()),
        "exported_only": sorted(set(exported) - set(hugging_face)),
        "hugging_face_only": sorted(set(hugging_face) - set(exported)),
        "largest_weight_difference": max(
            float((exported[name] - hugging_face[name]).abs().max()) for name in shared
        ),
    }
    with open(out, "w") as file:
        json.dump(report, file)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
