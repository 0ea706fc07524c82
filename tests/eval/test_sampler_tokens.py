"""The watcher's samplers feed the model the tokens NeMo-RL trains on: the prompt text (already
chat-templated, holding its special tokens) tokenized without special tokens, as NeMo-RL's data
processors tokenize it. A Llama-style tokenizer adds a BOS to plain tokenization; with the
samplers' old default every evaluated prompt started with two."""

from __future__ import annotations

import torch

from nemo_mmpo.char_tokenizer import char_tokenizer
from nemo_mmpo.eval.generate import TransformersSampler, VLLMSampler

BOS = "<eos>"  # the char tokenizer's EOS doubles as a BOS here


def bos_adding_tokenizer():
    """The rig's char tokenizer with a Llama-style post-processor: plain tokenization adds BOS."""
    from tokenizers import processors

    tokenizer = char_tokenizer()
    bos = tokenizer.convert_tokens_to_ids(BOS)
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, bos)]
    )
    tokenizer.bos_token = BOS
    return tokenizer


TRAINING_PROMPT = f"{BOS}What is 2+3? "  # a chat template that opens with the BOS


def nemo_rls_tokens(tokenizer, text):
    """As NeMo-RL's math data processor tokenizes the chat-templated prompt."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_a_plain_tokenization_would_add_a_second_bos():
    tokenizer = bos_adding_tokenizer()
    plain = tokenizer(TRAINING_PROMPT)["input_ids"]
    assert plain[:2] == [tokenizer.bos_token_id] * 2  # what the samplers fed before


def test_the_vllm_sampler_sends_nemo_rls_token_ids():
    sampler = VLLMSampler.__new__(VLLMSampler)  # no engine: only its tokenization
    sampler.tokenizer, sampler.chat_template = bos_adding_tokenizer(), False
    (prompt,) = sampler._token_prompts([TRAINING_PROMPT])
    assert prompt == {"prompt_token_ids": nemo_rls_tokens(sampler.tokenizer, TRAINING_PROMPT)}


def test_the_transformers_sampler_feeds_nemo_rls_token_ids():
    tokenizer = bos_adding_tokenizer()
    sampler = TransformersSampler.__new__(TransformersSampler)
    fed = []

    class Engine:
        def generate(self, input_ids, attention_mask, **options):
            fed.append(input_ids[0][attention_mask[0].bool()].tolist())
            return torch.cat([input_ids, input_ids[:, :1]], dim=1)

    tokenizer.padding_side = "left"
    sampler.__dict__.update(
        tokenizer=tokenizer,
        engine=Engine(),
        device="cpu",
        chat_template=False,
        temperature=0.0,
        top_p=1.0,
        max_tokens=1,
        batch_size=8,
    )
    sampler.generate([TRAINING_PROMPT], 1)
    assert fed == [nemo_rls_tokens(tokenizer, TRAINING_PROMPT)]
