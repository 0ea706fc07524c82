"""The tiny Hugging Face Llama as a real megatron-core ``GPTModel`` on gloo ranks.

``tests/nemo_rl_adapter/test_megatron_llama.py`` runs :func:`main` in a fresh interpreter:
``python -c "from megatron_llama_ranks import main; main()" OUT``. That process installs the CPU
shims (:mod:`nemo_mmpo.cpu.megatron_cpu`), builds the seeded tiny ``LlamaForCausalLM``, saves its
weights and logits on a batch, then for tensor parallel 1 and 2 forks that many ranks: each
builds its part of the Llama-shaped ``GPTModel`` (:func:`nemo_mmpo.cpu.megatron_llama.
llama_settings`), loads its shard of :func:`~nemo_mmpo.cpu.megatron_llama.hf_to_megatron` of the
Hugging Face weights, runs the batch, gathers the vocabulary-parallel logits and the full
weights, converts those back (:func:`~nemo_mmpo.cpu.megatron_llama.megatron_to_hf`); rank 0
writes ``OUT/tp<N>.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from gloo_ranks import run_launch

from nemo_mmpo.cpu import megatron_cpu

SEED = 7
PROMPTS = ["12+7=19", "3+45=48 and 2+2=4", "60+6="]


def hugging_face(out: Path) -> None:
    """The tiny Llama's weights, config and logits on :data:`PROMPTS` (right-padded)."""
    from nemo_mmpo.cpu.model import ModelShape, char_tokenizer, tiny_llama
    from nemo_mmpo.cpu.sampling import encode_prompts

    tokenizer = char_tokenizer()
    model = tiny_llama(tokenizer, ModelShape(), seed=SEED)
    input_ids, lengths = encode_prompts(tokenizer, PROMPTS)
    with torch.no_grad():
        logits = model(input_ids).logits
    torch.save(
        {
            "config": model.config.to_dict(),
            "weights": {name: tensor.clone() for name, tensor in model.state_dict().items()},
            "input_ids": input_ids,
            "lengths": lengths,
            "logits": logits,
        },
        out / "hf.pt",
    )


def run_rank(rank: int, world: int, launch: dict, spec: dict, out: Path) -> None:
    from megatron.core import parallel_state as ps

    from nemo_mmpo.cpu.megatron_llama import hf_to_megatron, llama_settings, megatron_to_hf
    from nemo_mmpo.cpu.megatron_model import gather_full, load_full, local_pieces, tiny_gpt

    megatron_cpu.cpu_rng_tracker(SEED)
    ps.initialize_model_parallel(tensor_model_parallel_size=world)
    hf = torch.load(out / "hf.pt")
    config = hf["config"]
    input_ids = hf["input_ids"]
    model = tiny_gpt(
        config["vocab_size"], config["max_position_embeddings"], llama_settings(config)
    )
    load_full(model, hf_to_megatron(hf["weights"], config))
    model.eval()
    length = input_ids.shape[1]
    causal = torch.triu(torch.ones(length, length, dtype=torch.bool), 1)[None, None]
    positions = torch.arange(length)[None].expand_as(input_ids)
    with torch.no_grad():
        local = model(input_ids, positions, causal)  # [batch, seq, vocabulary / tp]
    shards = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(shards, local.contiguous(), group=ps.get_tensor_model_parallel_group())
    pieces = [None] * world
    dist.all_gather_object(pieces, local_pieces(model, "param"))
    if rank == 0:
        full = gather_full(pieces)
        torch.save(
            {
                "logits": torch.cat(shards, dim=-1),
                "round_trip": megatron_to_hf(full, config),
            },
            out / f"tp{world}.pt",
        )
    ps.destroy_model_parallel()


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    megatron_cpu.install()
    import nemo_mmpo.cpu.megatron_model  # noqa: F401  (megatron-core, before forking)

    hugging_face(out)
    for world in (1, 2):
        run_launch({"index": f"tp{world}", "world": world}, {}, out, run_rank)
