"""The CPU rig's tokenizer, one token per character, and its plain chat template.

Here, below the layers that use it: the CPU rig trains with it (``nemo_mmpo.cpu.rig.model``)
and the watcher formats a CPU recipe's held-out problems with it (``nemo_mmpo.eval.prompts``).
No hub access: a ``tokenizers`` word-level model over printable ASCII wrapped as a
``transformers`` fast tokenizer.
"""

from __future__ import annotations

from typing import Any

PAD, EOS, UNK = 0, 1, 2
#: the chat template the rig's character tokenizer gets for a recipe's own problems: the
#: messages' text as it is (NeMo-RL's data processors apply a chat template to every prompt;
#: the prompt file, applied before it, is the user's)
PLAIN_CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def char_tokenizer() -> Any:
    """A ``transformers`` fast tokenizer with one token per character: printable ASCII its own,
    any other (a newline, a tab, ``é``) the unknown token ``<unk>``, one per character (two
    newlines in a prompt file are two tokens)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": PAD, "<eos>": EOS, "<unk>": UNK}
    vocab.update({chr(code): code - 32 + 3 for code in range(32, 127)})
    model = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    # every character, a newline too (Oniguruma's "." is all but "\n", whose runs were one piece)
    model.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    model.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=model, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
