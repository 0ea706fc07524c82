"""The prompt each held-out problem is sampled with: the one training gives a problem.

NeMo-RL formats a training problem with its data processor (``math_hf_data_processor`` for a
``ResponseDataset``): the dataset's ``prompt_file`` around the problem (``{}``), its
``system_prompt_file`` as a system message, then the tokenizer's chat template
(``policy.tokenizer``: ``chat_template``, ``chat_template_kwargs``, through NeMo-RL's
``get_tokenizer``) with the generation prompt. The watcher (and the in-loop evaluation) gives its
sampler that text whole, built by the same NeMo-RL functions in the driver: the sampler applies
no chat template of its own.

``evaluation.template`` opts out: a string with ``{}`` replaces the recipe's prompt files (no
system prompt); the chat template stays the training tokenizer's. ``null`` (the default) is the
training prompt. The CPU rig trains with its own character tokenizer (a plain chat template on
the recipe's problems, none on its own sums, whose held-out problems are whole prompts).

:func:`prompt_format` reads the recipe without importing NeMo-RL (the dry run's
:func:`format_problem` refuses what it cannot format); :meth:`PromptFormat.texts` imports it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nemo_mmpo.char_tokenizer import PLAIN_CHAT_TEMPLATE, char_tokenizer
from nemo_mmpo.errors import MMPOInputError

#: the data processors whose prompt the watcher builds: NeMo-RL's ``PROCESSOR_REGISTRY`` names
#: of ``math_hf_data_processor`` (a dataset without ``processor`` gets ``default``)
CHAT_PROCESSORS = ("math_hf_data_processor", "default")
#: the processor's ``max_seq_length``: a longer prompt is kept whole (its text is what we read)
NO_LENGTH_LIMIT = 2**62
#: the dataset keys that decide how a problem is formatted
FORMAT_KEYS = ("prompt_file", "system_prompt_file", "processor")


@dataclass(frozen=True)
class PromptFormat:
    """How a held-out problem becomes the text the sampler continues.

    ``dataset``: the training dataset's formatting keys (:data:`FORMAT_KEYS`, ``data.default``
    filled in, as NeMo-RL's ``update_single_dataset_config``); ``template``:
    ``evaluation.template`` (None: the dataset's prompt files); ``tokenizer``: ``policy.tokenizer``
    for NeMo-RL's ``get_tokenizer``, or None for the CPU rig's tokenizer (``rig_chat``: with
    its plain chat template, as it trains the recipe's own problems)."""

    dataset: dict[str, Any] = field(default_factory=dict)
    template: str | None = None
    tokenizer: dict[str, Any] | None = None
    rig_chat: bool = False

    def texts(self, problems: Sequence[Mapping[str, Any]], tokenizer: Any = None) -> list[str]:
        """Each problem's prompt text (its ``problem``), as training formats a problem
        (``tokenizer``: training's, when the caller has it)."""
        tokenizer = tokenizer or self.load_tokenizer()
        if not getattr(tokenizer, "chat_template", None):  # the rig's sums: text as it is
            return [(self.template or "{}").format(problem["problem"]) for problem in problems]
        from nemo_rl.data.processors import math_hf_data_processor

        spec = self.task_spec()

        texts = []
        for index, problem in enumerate(problems):
            processed = math_hf_data_processor(
                datum(problem), spec, tokenizer, NO_LENGTH_LIMIT, index
            )
            (message,) = processed["message_log"]  # system and user, in the chat template
            texts.append(message["content"])
        return texts

    def load_tokenizer(self) -> Any:
        """The tokenizer training formats with (NeMo-RL's ``get_tokenizer``, or the rig's)."""
        if self.tokenizer is None:
            tokenizer = char_tokenizer()
            if self.rig_chat:
                tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
            return tokenizer
        from nemo_rl.algorithms.utils import get_tokenizer

        try:
            return get_tokenizer(dict(self.tokenizer))
        except OSError as error:  # transformers' "can't load tokenizer" (hub, path)
            raise MMPOInputError(
                f"policy.tokenizer.name {self.tokenizer.get('name')!r}: the tokenizer training "
                f"formats prompts with does not load here ({str(error).splitlines()[0]}); run "
                "the watcher where the training run loaded it (its Hugging Face cache, HF_HOME)"
            ) from None

    def task_spec(self) -> Any:
        """NeMo-RL's ``TaskDataSpec`` of the training dataset (its prompt files read as NeMo-RL
        reads them), or of ``evaluation.template`` alone."""
        from nemo_rl.data.interfaces import TaskDataSpec

        if self.template is not None:
            spec = TaskDataSpec(task_name="evaluation")
            spec.prompt = self.template
            return spec
        return TaskDataSpec(
            task_name="evaluation",
            prompt_file=self.dataset.get("prompt_file"),
            system_prompt_file=self.dataset.get("system_prompt_file"),
        )


def datum(problem: Mapping[str, Any]) -> dict[str, Any]:
    """The row NeMo-RL's ``ResponseDataset`` hands its processor for a problem and answer."""
    return {
        "messages": [
            {"role": "user", "content": problem["problem"]},
            {"role": "assistant", "content": str(problem.get("answer", ""))},
        ],
        "task_name": "evaluation",
    }


def training_datasets(data: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(key, formatting keys)`` of each training dataset, ``data.default`` filled in."""
    default = data.get("default") if isinstance(data.get("default"), Mapping) else {}
    entries = data.get("train")
    listed = entries if isinstance(entries, list) else [entries]
    found = []
    for index, dataset in enumerate(listed):
        if not isinstance(dataset, Mapping):
            continue
        key = "data.train" + (f"[{index}]" if isinstance(entries, list) else "")
        merged = {**default, **dataset}
        found.append((key, {name: merged.get(name) for name in FORMAT_KEYS}))
    return found


def format_problem(config: Mapping[str, Any], template: str | None) -> str | None:
    """Why the watcher cannot format held-out problems as this recipe's training does (one
    line), or None."""
    if template is not None or _rig(config) not in (None, "recipe"):
        return None
    datasets = training_datasets(config.get("data") or {})
    if not datasets:
        return (
            "evaluation.template is null (the training prompt) and data.train names no "
            "dataset: set evaluation.template"
        )
    key, first = datasets[0]
    for other_key, other in datasets[1:]:
        if other != first:
            return (
                f"evaluation.template is null (the training prompt) and {key} and {other_key} "
                f"format problems differently ({first} vs {other}): set evaluation.template to "
                "the prompt the held-out problems get"
            )
    processor = first.get("processor") or "default"
    if processor not in CHAT_PROCESSORS:
        return (
            f"{key}'s processor {processor!r}: the watcher builds the training prompt of "
            "NeMo-RL's math_hf_data_processor only; set evaluation.template to the prompt the "
            "held-out problems get (`{}`: the problem)"
        )
    return None


def prompt_format(config: Mapping[str, Any], template: str | None) -> PromptFormat:
    """The recipe's :class:`PromptFormat` (``template``: ``evaluation.template``)."""
    problem = format_problem(config, template)
    if problem:
        raise MMPOInputError(problem)
    rig = _rig(config)
    if rig not in (None, "recipe"):  # the rig's own sums, held out as whole prompts
        return PromptFormat(template=template)
    datasets = training_datasets(config.get("data") or {})
    dataset = datasets[0][1] if datasets and template is None else {}
    if rig == "recipe":  # the rig's tokenizer, with the plain chat template it trains with
        return PromptFormat(dataset=dataset, template=template, rig_chat=True)
    tokenizer = (config.get("policy") or {}).get("tokenizer") or {}
    return PromptFormat(dataset=dataset, template=template, tokenizer=dict(tokenizer))


def _rig(config: Mapping[str, Any]) -> str | None:
    """The CPU rig's ``cpu_backend.problems`` when the rig trains this recipe, else None."""
    section = config.get("cpu_backend") or {}
    if not section.get("enabled"):
        return None
    return section.get("problems", "addition")
