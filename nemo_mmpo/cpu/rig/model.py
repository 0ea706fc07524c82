"""The tiny model and its tokenizer: a Llama or a Qwen3 built from a config, one token per
character.

No hub access: the tokenizer is a ``tokenizers`` word-level model over printable ASCII wrapped
as a ``transformers`` fast tokenizer, so checkpoints are complete Hugging Face directories
that ``python -m nemo_mmpo.eval generate --backend hf`` loads like any other; load one with
:func:`load_tiny_model` (``AutoModelForCausalLM``: the checkpoint's config names its class).

``cpu_backend.model.architecture`` picks the model: ``llama`` (the default) or ``qwen3``,
Qwen3-1.7B-Base's config (``Qwen3ForCausalLM``: q/k RMSNorm, grouped-query attention with half
as many key/value heads as query heads, ``head_dim`` = hidden / heads, an intermediate size of
3 x hidden, RoPE theta 1e6, RMSNorm eps 1e-6, tied embeddings, SiLU, no attention bias) with
only the sizes shrunk to the shape and the vocabulary the character tokenizer's. Megatron-Bridge
imports it through its Qwen3 bridge and vLLM samples it with its Qwen3 model, as on a GPU node
with the real checkpoint.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from nemo_mmpo.char_tokenizer import EOS, PAD, UNK, char_tokenizer  # noqa: F401  (re-exported)
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.settings import Settings


class ModelShape(Settings):
    """The tiny model's architecture and size (``cpu_backend.model`` in the recipe)."""

    hidden_size: int = Field(128, ge=1)
    num_layers: int = Field(2, ge=1)
    num_heads: int = Field(4, ge=1)
    max_positions: int = Field(64, ge=8)
    architecture: Literal["llama", "qwen3"] = "llama"

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> ModelShape:
        if self.hidden_size % self.num_heads:
            raise MMPOInputError(
                f"num_heads={self.num_heads} must divide hidden_size={self.hidden_size}"
            )
        if self.architecture == "qwen3" and self.num_heads % 2:
            raise MMPOInputError(
                f"cpu_backend.model.architecture=qwen3 has num_heads / 2 key-value heads "
                f"(Qwen3-1.7B's ratio): num_heads={self.num_heads} must be even"
            )
        return self

    def key_parts(self) -> dict[str, Any]:
        """What of the shape determines a warm start: the Llama's key is the one it had before
        ``architecture`` existed (its name is left out), so its cached warm starts stay found."""
        parts = self.model_dump()
        if self.architecture == "llama":
            del parts["architecture"]
        return parts


def tiny_config(tokenizer: Any, shape: ModelShape) -> Any:
    """The ``transformers`` config of the tiny model ``shape`` names."""
    common = {
        "vocab_size": len(tokenizer),
        "hidden_size": shape.hidden_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "max_position_embeddings": shape.max_positions,
        "pad_token_id": PAD,
        "eos_token_id": EOS,
        "bos_token_id": EOS,
    }
    if shape.architecture == "qwen3":
        from transformers import Qwen3Config

        # Qwen3-1.7B-Base's config.json with the sizes shrunk (hidden 2048, 28 layers, 16 heads,
        # 8 key-value heads, head_dim 128, intermediate 6144, vocabulary 151936)
        return Qwen3Config(
            **common,
            intermediate_size=3 * shape.hidden_size,
            num_key_value_heads=shape.num_heads // 2,
            head_dim=shape.hidden_size // shape.num_heads,
            hidden_act="silu",
            rms_norm_eps=1e-6,
            rope_theta=1_000_000.0,
            tie_word_embeddings=True,
            attention_bias=False,
            attention_dropout=0.0,
            use_sliding_window=False,
            max_window_layers=shape.num_layers,
        )
    from transformers import LlamaConfig

    return LlamaConfig(
        **common, intermediate_size=2 * shape.hidden_size, num_key_value_heads=shape.num_heads
    )


def tiny_model(tokenizer: Any, shape: ModelShape, seed: int) -> Any:
    """A randomly initialised ``LlamaForCausalLM`` or ``Qwen3ForCausalLM`` (``shape``'s
    architecture; float32, eval mode), seeded."""
    import torch
    from transformers import AutoModelForCausalLM

    config = tiny_config(tokenizer, shape)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config).float().eval()


def tiny_llama(tokenizer: Any, shape: ModelShape, seed: int) -> Any:
    """:func:`tiny_model` (the name from before the rig had a Qwen3; ``shape`` may name
    either)."""
    return tiny_model(tokenizer, shape, seed)


def load_tiny_model(folder: Any) -> Any:
    """The Hugging Face checkpoint in ``folder`` as its config's class (a tiny Llama or Qwen3),
    float32, eval mode."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder).float().eval()
