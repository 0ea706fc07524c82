"""Sample n responses per problem, grade them, append one JSON line per (problem, sample).

Resumable: a restarted run reads what the output file holds and generates only the missing
samples; every line is flushed and fsynced, so a killed run loses at most the line it was
writing (a truncated last line is cut off on restart). Shardable: ``shard_index`` of
``num_shards`` takes every ``num_shards``-th problem, one output file per shard.

Two samplers with the same semantics (temperature, top-p, max new tokens; one seed set when
the engine starts, none per request, so a resumed run draws new samples): :class:`VLLMSampler`
(the default, GPU) and :class:`TransformersSampler` (Hugging Face ``generate``, CPU or GPU).
Each imports its library only when built; anything with ``generate(prompts, n)`` works.

``VLLMSampler(seed_per_row=True)`` (the checkpoint watcher's) gives each row of a call its own
vLLM seed instead, :func:`row_seed` of the sampler's seed and the row's place in the call, as
the in-loop evaluation through NeMo-RL's vLLM engine does: a call's draws are fixed by what it
asks (``draws_fixed_by_call``), and a resumed run asks again the interrupted call whole and
keeps only the samples it lacks, so it writes what an uninterrupted run writes.
"""

from __future__ import annotations

import json
import os
import sys
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from nemo_mmpo.errors import MMPOInputError, install_command
from nemo_mmpo.eval.rollouts import read_jsonl_tolerant
from nemo_mmpo.eval.worker_environments import VLLM_WORKER

#: Samples per problem by default: 16 everywhere, so every section of the report is filled
#: (pass@16, first success within 16 attempts) and avg@1 is estimated from 16 samples.
DEFAULT_SAMPLES = 16
#: The paper's table alone (``--samples paper``): avg@1 on MATH500/OlymMATH, avg@16 elsewhere.
PAPER_TABLE_SAMPLES = {"math500": 1, "olymmath": 1, "amc23": 16, "aime24": 16, "aime25": 16}
DEFAULT_TEMPLATE = "{}\nPlease reason step by step, and put your final answer within \\boxed{{}}."


class Sampler(Protocol):
    def generate(self, prompts: Sequence[str], n: int) -> list[list[str]]:
        """``n`` responses for each prompt."""


def free_memory() -> None:
    """Collect what a closed sampler left and hand the GPU's cached blocks back."""
    import gc

    gc.collect()
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def row_seed(seed: int, row: int) -> int:
    """vLLM's per-request seed for row ``row`` of a call seeded ``seed`` (the rows of a call
    are its prompts' samples, prompt by prompt: each sample draws its own tokens, and the same
    call samples the same texts)."""
    return zlib.crc32(f"{seed} {row}".encode())


@dataclass
class VLLMSampler:
    """vLLM sampling from a Hugging Face checkpoint (paper: temperature 0.6, top-p 0.95).

    ``engine_options``: more arguments of ``vllm.LLM`` (the watcher passes the recipe's
    precision and context length). ``seed_per_row``: each row its own seed (:func:`row_seed`),
    instead of one for the engine.
    """

    model: str
    temperature: float = 0.6
    top_p: float = 0.95
    max_tokens: int = 4096
    tensor_parallel_size: int = 1
    seed: int = 0
    chat_template: bool = True
    seed_per_row: bool = False
    engine_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        try:
            from vllm import LLM
        except ImportError as error:
            raise MMPOInputError(
                f"generation needs vLLM, which this Python ({sys.executable}) lacks: run it "
                "with the python of NeMo-RL's vLLM worker environment, nemo-mmpo on its "
                "PYTHONPATH (`PYTHONPATH=<the folder holding nemo_mmpo> $NEMO_RL_VENV_DIR/"
                f"{VLLM_WORKER}/bin/python -m nemo_mmpo.eval ...`; NEMO_RL_VENV_DIR: the "
                "container's /opt/ray_venvs, a checkout's venvs/ by default), or use --backend "
                "hf; `nemo-mmpo eval watch` finds that environment itself"
            ) from error
        self.engine = LLM(
            self.model,
            tensor_parallel_size=self.tensor_parallel_size,
            seed=self.seed,
            **self.engine_options,
        )
        self.tokenizer = self.engine.get_tokenizer()

    def close(self) -> None:
        """Let the engine go and free its memory (the watcher builds one per checkpoint), as
        NeMo-RL's ``VllmGenerationWorker.shutdown`` does: the last reference to ``vllm.LLM``
        dropped, then a collection (vLLM's engine-core process, holding the weights and the KV
        cache, ends with its client). Not ``engine_core.shutdown()``: on vLLM's CPU build its
        worker's clean-up asks ``torch.accelerator`` to synchronize, which needs a GPU
        (``gpu_model_runner.py``'s ``_cleanup_profiling_kv_cache``). Idempotent."""
        if self.__dict__.pop("engine", None) is not None:
            self.__dict__.pop("tokenizer", None)
            free_memory()

    @property
    def draws_fixed_by_call(self) -> bool:
        """Whether a call's draws depend only on its prompts and their places in it."""
        return self.seed_per_row

    def generate(self, prompts: Sequence[str], n: int) -> list[list[str]]:
        from vllm import SamplingParams

        if self.seed_per_row:
            return self._generate_seeded_rows(prompts, n)
        # No per-request seed: with one, a resumed run would redraw the samples it already has.
        # The engine's seed (set at start-up) keeps a whole run reproducible.
        params = SamplingParams(
            n=n, temperature=self.temperature, top_p=self.top_p, max_tokens=self.max_tokens
        )
        outputs = self.engine.generate(self._token_prompts(prompts), params)
        return [[choice.text for choice in output.outputs] for output in outputs]

    def _generate_seeded_rows(self, prompts: Sequence[str], n: int) -> list[list[str]]:
        """``n`` rows per prompt, row ``r`` of the call seeded :func:`row_seed` (seed, r)."""
        from vllm import SamplingParams

        rows = [prompt for prompt in self._token_prompts(prompts) for _ in range(n)]
        params = [
            SamplingParams(
                n=1,
                temperature=self.temperature,
                top_p=self.top_p,
                max_tokens=self.max_tokens,
                seed=row_seed(self.seed, row),
            )
            for row in range(len(rows))
        ]
        outputs = self.engine.generate(rows, params)
        texts = [output.outputs[0].text for output in outputs]
        return [texts[index * n : (index + 1) * n] for index in range(len(prompts))]

    def _token_prompts(self, prompts: Sequence[str]) -> list[dict[str, list[int]]]:
        """The prompts as token ids, tokenized as NeMo-RL tokenizes its training prompts:
        without special tokens (the text, chat-templated, already holds them; vLLM's own
        tokenization would add a second BOS for a Llama-style tokenizer)."""
        return [
            {"prompt_token_ids": self.tokenizer(text, add_special_tokens=False)["input_ids"]}
            for text in self._texts(prompts)
        ]

    def _texts(self, prompts: Sequence[str]) -> list[str]:
        return [
            self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
            if self.chat_template and getattr(self.tokenizer, "chat_template", None)
            else prompt
            for prompt in prompts
        ]


@dataclass
class TransformersSampler:
    """Hugging Face ``transformers`` sampling: ``model.generate`` with the same settings.

    ``temperature == 0`` is greedy (as vLLM). The chat template is applied when the tokenizer
    has one. ``seed`` seeds torch once, when the sampler is built.
    """

    model: str
    temperature: float = 0.6
    top_p: float = 0.95
    max_tokens: int = 4096
    seed: int = 0
    device: str | None = None
    batch_size: int = 8
    chat_template: bool = True

    def __post_init__(self) -> None:
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as error:
            raise MMPOInputError(
                f"--backend hf needs transformers: {install_command('hf')}"
            ) from error
        if not Path(self.model).is_dir():
            raise MMPOInputError(
                f"--model {self.model}: not a local directory; give a Hugging Face checkpoint "
                "directory (config.json, weights, tokenizer files)"
            )
        torch.manual_seed(self.seed)
        self.device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(self.model)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.engine = AutoModelForCausalLM.from_pretrained(self.model).to(self.device).eval()

    def close(self) -> None:
        """Let the model go and free its memory. Idempotent."""
        if self.__dict__.pop("engine", None) is not None:
            free_memory()

    def _text(self, prompt: str) -> str:
        if self.chat_template and getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
        return prompt

    def generate(self, prompts: Sequence[str], n: int) -> list[list[str]]:
        import torch

        results: list[list[str]] = []
        options: dict[str, Any] = {"max_new_tokens": self.max_tokens}
        if self.temperature > 0:
            options.update(do_sample=True, temperature=self.temperature, top_p=self.top_p)
        else:
            options.update(do_sample=False)
        draws = n if self.temperature > 0 else 1  # greedy: n copies of one continuation
        for start in range(0, len(prompts), self.batch_size):
            chunk = [self._text(prompt) for prompt in prompts[start : start + self.batch_size]]
            # without special tokens, as NeMo-RL tokenizes its training prompts
            inputs = self.tokenizer(
                chunk, return_tensors="pt", padding=True, add_special_tokens=False
            ).to(self.device)
            with torch.no_grad():
                output = self.engine.generate(
                    **inputs,
                    num_return_sequences=draws,
                    pad_token_id=self.tokenizer.pad_token_id,
                    **options,
                )
            new_tokens = output[:, inputs["input_ids"].shape[1] :]
            texts = self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
            for row in range(len(chunk)):
                own = texts[row * draws : (row + 1) * draws]
                results.append(own if draws == n else own * n)
        return results


def _repair_and_read(path: Path) -> list[dict[str, Any]]:
    """Existing records; drops a truncated last line from the file itself."""
    if not path.exists():
        return []
    records = read_jsonl_tolerant(path)
    content = path.read_bytes()
    if content and not content.endswith(b"\n"):
        keep = content.rfind(b"\n") + 1
        with open(path, "r+b") as handle:
            handle.truncate(keep)
        records = read_jsonl_tolerant(path)
    return records


def shard(problems: Sequence[dict[str, Any]], shard_index: int, num_shards: int):
    if not 0 <= shard_index < num_shards:
        raise MMPOInputError(f"shard_index={shard_index} must be in [0, num_shards={num_shards})")
    return [problem for index, problem in enumerate(problems) if index % num_shards == shard_index]


def run_generation(
    problems: Sequence[dict[str, Any]],
    sampler: Sampler,
    grade: Any,
    out_path: str | Path,
    samples_per_problem: int | dict[str, int] = DEFAULT_SAMPLES,
    shard_index: int = 0,
    num_shards: int = 1,
    batch_size: int = 64,
    template: str = DEFAULT_TEMPLATE,
    progress: bool = True,
) -> dict[str, int]:
    """Generate and grade what ``out_path`` lacks; returns counts written/skipped.

    Args:
        problems: normalised records ``{"id", "problem", "answer", "source"}``.
        sampler: ``generate(prompts, n) -> [[response] * n]``.
        grade: ``(golds, predictions) -> [Verdict]`` (e.g. ``VerifierPool.verify``).
        samples_per_problem: an int (default 16), or per-benchmark counts.
    """
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    done: dict[tuple[str, str], set[int]] = {}
    for record in _repair_and_read(out_path):
        done.setdefault((record["benchmark"], record["problem_id"]), set()).add(record["sample"])
    wanted = []
    for problem in shard(problems, shard_index, num_shards):
        count = (
            samples_per_problem
            if isinstance(samples_per_problem, int)
            else samples_per_problem.get(problem["source"], DEFAULT_SAMPLES)
        )
        have = done.get((problem["source"], problem["id"]), set())
        wanted.append((problem, count, [sample for sample in range(count) if sample not in have]))
    skipped = sum(len(samples) for samples in done.values())
    if getattr(sampler, "draws_fixed_by_call", False):
        calls = _calls_as_uninterrupted(wanted, batch_size)
    else:
        calls = _calls_of_missing(wanted, batch_size)
    if progress:
        try:
            from tqdm.auto import tqdm

            calls = tqdm(calls, desc=f"generating {out_path.name}")
        except ImportError:
            pass
    written = 0
    with open(out_path, "a") as handle:
        for prompts, width, keep in calls:
            responses = sampler.generate([template.format(p["problem"]) for p in prompts], width)
            pairs = [(prompts[row], sample, responses[row][place]) for row, sample, place in keep]
            verdicts = grade([p["answer"] for p, _, _ in pairs], [text for _, _, text in pairs])
            for (problem, sample, text), verdict in zip(pairs, verdicts, strict=True):
                record = {
                    "benchmark": problem["source"],
                    "problem_id": problem["id"],
                    "sample": sample,
                    "answer": problem["answer"],
                    "response": text,
                    "correct": verdict.correct,
                    "status": verdict.status,
                }
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
                written += 1
    return {"written": written, "skipped": skipped}


#: one sampler call: ``(problems, samples per problem, [(problem's row, sample, place among
#: that problem's responses)] to write)``
Call = tuple[list[dict[str, Any]], int, list[tuple[int, int, int]]]


def _calls_of_missing(wanted: list[tuple[dict, int, list[int]]], batch_size: int) -> list[Call]:
    """Only the missing samples: up to ``batch_size`` problems that lack some per call."""
    todo = [(problem, missing) for problem, _, missing in wanted if missing]
    calls = []
    for start in range(0, len(todo), batch_size):
        chunk = todo[start : start + batch_size]
        keep = [
            (row, sample, place)
            for row, (_, missing) in enumerate(chunk)
            for place, sample in enumerate(missing)
        ]
        calls.append(([problem for problem, _ in chunk], max(len(m) for _, m in chunk), keep))
    return calls


def _calls_as_uninterrupted(
    wanted: list[tuple[dict, int, list[int]]], batch_size: int
) -> list[Call]:
    """The calls an uninterrupted run makes (every ``batch_size`` problems, every sample) that
    hold a missing sample, keeping only those: what a sampler whose draws are fixed by the call
    writes as if it had never stopped."""
    calls = []
    for start in range(0, len(wanted), batch_size):
        chunk = wanted[start : start + batch_size]
        keep = [
            (row, sample, sample) for row, (_, _, missing) in enumerate(chunk) for sample in missing
        ]
        if keep:
            calls.append(([problem for problem, _, _ in chunk], max(c for _, c, _ in chunk), keep))
    return calls
