"""The tiny model and its tokenizer: a Llama built from a config, one token per character.

No hub access: the tokenizer is a ``tokenizers`` word-level model over printable ASCII wrapped
as a ``transformers`` fast tokenizer, so checkpoints are complete Hugging Face directories
that ``python -m nemo_mmpo.eval generate --backend hf`` loads like any other.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from nemo_mmpo.char_tokenizer import EOS, PAD, UNK, char_tokenizer  # noqa: F401  (re-exported)
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.settings import Settings


class ModelShape(Settings):
    """The tiny Llama's size (``cpu_backend.model`` in the recipe)."""

    hidden_size: int = Field(128, ge=1)
    num_layers: int = Field(2, ge=1)
    num_heads: int = Field(4, ge=1)
    max_positions: int = Field(64, ge=8)

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> ModelShape:
        if self.hidden_size % self.num_heads:
            raise MMPOInputError(
                f"num_heads={self.num_heads} must divide hidden_size={self.hidden_size}"
            )
        return self


def tiny_llama(tokenizer: Any, shape: ModelShape, seed: int) -> Any:
    """A randomly initialised ``LlamaForCausalLM`` (float32, eval mode), seeded."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=2 * shape.hidden_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_heads,
        max_position_embeddings=shape.max_positions,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=EOS,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(config).float().eval()
