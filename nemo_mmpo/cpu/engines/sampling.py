"""Sampling from a causal LM with NeMo-RL's generation conventions (no NeMo-RL import).

:func:`sample_batch` is what the CPU generation backends return to NeMo-RL's loop, as plain
tensors: ``output_ids`` (prompt + response, right-padded), the response tokens' ``logprobs``,
``generation_lengths`` and ``unpadded_sequence_lengths``. :func:`token_logprobs` is the
policy's log-probability of every token; both scale logits by the sampling temperature, as
NeMo-RL's workers do (to match vLLM), so a sample's generation log-probabilities equal the
policy's. The samples' log-probabilities come from the logits ``generate`` computed while
sampling (no second forward pass); they equal a full forward pass's to float rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def token_logprobs(
    model: Any, input_ids: torch.Tensor, lengths: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """``[rows, seq_len]``: ``log p(token_t | tokens_<t)`` at ``t >= 1`` (0 at 0 and padding),
    from logits divided by ``temperature``."""
    positions = torch.arange(input_ids.shape[1])
    attention = (positions[None, :] < lengths[:, None]).long()
    logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    picked = logprobs.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    picked = picked * attention[:, 1:]
    return torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)


def _generate(
    model: Any,
    tokenizer: Any,
    input_ids: torch.Tensor,
    input_lengths: torch.Tensor,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    with_logits: bool = False,
) -> Any:
    """``[rows, <= max_new_tokens]`` new tokens of ``model.generate`` on right-padded prompts
    (temperature 0 is greedy); with ``with_logits``, also the raw logits of each new token
    ``[rows, new, vocab]``."""
    rows = input_ids.shape[0]
    width = int(input_lengths.max())
    pad = tokenizer.pad_token_id
    left = torch.full((rows, width), pad, dtype=torch.long)
    for row in range(rows):  # generate() wants left padding
        length = int(input_lengths[row])
        left[row, width - length :] = input_ids[row, :length]
    attention = (torch.arange(width)[None, :] >= (width - input_lengths)[:, None]).long()
    options: dict[str, Any] = {"max_new_tokens": max_new_tokens}
    if temperature == 0:
        options["do_sample"] = False
    else:
        options.update(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
    with torch.no_grad():
        output = model.generate(
            input_ids=left,
            attention_mask=attention,
            pad_token_id=pad,
            eos_token_id=tokenizer.eos_token_id,
            output_logits=with_logits,
            return_dict_in_generate=True,
            **options,
        )
    new = output.sequences[:, width:]
    if not with_logits:
        return new
    return new, torch.stack(output.logits, dim=1).float()


def _response_lengths(new_tokens: torch.Tensor, eos_token_id: int) -> list[int]:
    """Tokens up to and including the first end-of-sequence (all of them if none)."""
    lengths = []
    for tokens in new_tokens.tolist():
        lengths.append(tokens.index(eos_token_id) + 1 if eos_token_id in tokens else len(tokens))
    return lengths


def sample_batch(
    model: Any,
    tokenizer: Any,
    input_ids: torch.Tensor,
    input_lengths: torch.Tensor,
    generation_config: dict[str, Any],
    greedy: bool = False,
) -> dict[str, torch.Tensor]:
    """NeMo-RL's generation output for right-padded prompts ``input_ids`` ``[rows, width]``.

    Settings from ``policy.generation``: ``temperature`` (0: greedy), ``top_p``,
    ``max_new_tokens``. Log-probabilities use the same ``temperature`` (1 when greedy at
    temperature 0). Sampling draws from torch's global RNG.
    """
    temperature = float(generation_config.get("temperature", 1.0))
    new, logits = _generate(
        model,
        tokenizer,
        input_ids,
        input_lengths,
        int(generation_config["max_new_tokens"]),
        0.0 if greedy else temperature,
        float(generation_config.get("top_p") or 1.0),
        with_logits=True,
    )
    rows = input_ids.shape[0]
    lengths = _response_lengths(new, tokenizer.eos_token_id)
    # each sampled token's log-probability at the sampling temperature (1 when greedy at 0)
    sampled = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    sampled = sampled.gather(-1, new[:, :, None]).squeeze(-1)
    total = int(input_lengths.max()) + max(max(lengths), 1)
    output_ids = torch.full((rows, total), tokenizer.pad_token_id, dtype=torch.long)
    logprobs = torch.zeros((rows, total), dtype=torch.float32)
    for row in range(rows):
        length, response = int(input_lengths[row]), lengths[row]
        output_ids[row, :length] = input_ids[row, :length]
        output_ids[row, length : length + response] = new[row, :response]
        logprobs[row, length : length + response] = sampled[row, :response]
    generation_lengths = torch.tensor(lengths)
    return {
        "output_ids": output_ids,
        "logprobs": logprobs,
        "generation_lengths": generation_lengths,
        "unpadded_sequence_lengths": input_lengths + generation_lengths,
    }


def encode_prompts(tokenizer: Any, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids [rows, width] right-padded, input_lengths [rows])`` of prompt texts."""
    encoded = [tokenizer.encode(text, add_special_tokens=False) for text in prompts]
    width = max(len(ids) for ids in encoded)
    input_ids = torch.full((len(encoded), width), tokenizer.pad_token_id, dtype=torch.long)
    for row, ids in enumerate(encoded):
        input_ids[row, : len(ids)] = torch.tensor(ids)
    return input_ids, torch.tensor([len(ids) for ids in encoded])


def sample_texts(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    samples: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    batch_size: int = 512,
) -> list[list[str]]:
    """``samples`` decoded responses for each prompt (end-of-sequence and padding removed)."""
    rows = [prompt for prompt in prompts for _ in range(samples)]
    texts: list[str] = []
    for start in range(0, len(rows), batch_size):
        input_ids, lengths = encode_prompts(tokenizer, rows[start : start + batch_size])
        new = _generate(model, tokenizer, input_ids, lengths, max_new_tokens, temperature, top_p)
        texts.extend(tokenizer.batch_decode(new, skip_special_tokens=True))
    return [texts[index * samples : (index + 1) * samples] for index in range(len(prompts))]
