"""The paper's evaluation of one checkpoint, as a step of a training run.

The recipe's ``evaluation`` section (:class:`EvaluationSettings`) names the benchmarks and the
sampler (paper: 16 samples per problem, temperature 0.6, top-p 0.95). :func:`evaluate_step`
samples every problem through any object with ``generate(prompts, n)`` (the CPU engines, the
``hf`` and ``vllm`` samplers of :mod:`nemo_mmpo.eval.generate`), grades with the training
reward's Math-Verify scorer, appends the rollouts to ``step_<N>.jsonl`` (the format ``nemo-mmpo
eval report`` reads; each line flushed, so an interrupted step resumes where it stopped and
repeats no sample), then writes the step's numbers to ``step_<N>.json`` atomically: that file
marks the step done. It returns the numbers (:func:`flat_metrics` makes NeMo-RL metrics).

The numbers come from the project's metric code (:mod:`nemo_mmpo.eval.metrics`, through
:func:`step_metrics`) on the rollouts as :mod:`nemo_mmpo.eval.rollouts` reads them back, so
``nemo-mmpo eval report`` on ``step_<N>.jsonl`` gives the same values. Per step:

- per benchmark: ``avg@n`` (mean correctness over the n samples, an unbiased avg@1) and
  unbiased ``pass@k`` for k in ``pass_at`` (k <= n);
- ``average``: the mean of the benchmarks' avg@n (the paper's average column) and ``accuracy``,
  pooled over all problems (NeMo-RL's validation accuracy, for its checkpoint selection);
- over all problems: ``gini/alpha_<a>`` of per-problem success (problems with success in
  ``[a, 1-a]``, mean-normalised), ``never_solved`` (no success in n samples) and the
  first-success distribution (``P(first success at attempt t)``, in ``step_<N>.json``).
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field, field_validator

from nemo_mmpo.data import load_benchmark
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.eval.metrics import (
    STEP_PASS_AT,
    first_success_distribution,
    gini_by_method,
    pass_at_k,
)
from nemo_mmpo.eval.rollouts import ProblemCounts, load_run
from nemo_mmpo.io import write_text_atomic
from nemo_mmpo.settings import Settings, parse, unread_when_disabled

#: Prefix of the evaluation's metrics in NeMo-RL's logger (under its ``validation/``).
METRIC_PREFIX = "paper/"
GINI_ALPHAS = (0.0, 0.1)


class EvaluationSettings(Settings):
    """The recipe's ``evaluation`` section: the paper's protocol over a run.

    What each key does, its default and the paper's value: ``docs/keys.md``, generated from
    this class (the descriptions are in :mod:`nemo_mmpo.launch.keys`).
    """

    enabled: bool = False
    in_loop: bool = False
    benchmarks: dict[str, str | None] = Field(default_factory=dict)
    samples: int = Field(16, ge=1)
    temperature: float = Field(0.6, ge=0.0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    max_new_tokens: int = Field(4096, ge=1)
    template: str | None = None
    output_dir: str = "logs/evaluation"
    pass_at: tuple[int, ...] = STEP_PASS_AT
    gini_alphas: tuple[float, ...] = GINI_ALPHAS

    @field_validator("template")
    @classmethod
    def _has_slot(cls, value: str | None) -> str | None:
        if value is not None and "{}" not in value:
            raise MMPOInputError(f"template {value!r}: put {{}} where the problem goes")
        return value

    @field_validator("pass_at")
    @classmethod
    def _positive(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value or min(value) < 1:
            raise MMPOInputError(f"pass_at {list(value)}: give integers >= 1")
        return value


def read_settings(section: Any) -> EvaluationSettings:
    return parse(EvaluationSettings, section, "evaluation")


def unread_evaluation_settings(section: Any, answer_length: int | None = None) -> list[str]:
    """With ``evaluation.enabled: false`` nothing reads the section's other keys (neither the
    loop nor ``nemo-mmpo eval watch``): one message naming those set to a non-default value.
    ``answer_length``: the recipe's ``policy.generation.max_new_tokens``, which
    ``max_new_tokens`` follows by default (base/mmpo_common.yaml): not a value a user set."""
    if not section or read_settings(section).enabled:
        return []
    if answer_length is not None and section.get("max_new_tokens") == answer_length:
        section = {key: item for key, item in section.items() if key != "max_new_tokens"}
    return unread_when_disabled(
        EvaluationSettings, section, "evaluation", "set evaluation.enabled=true to evaluate"
    )


def _at(config: Mapping[str, Any], path: str) -> Any:
    """The value at dotted ``path`` in the recipe ``config`` (plain mappings), else None."""
    node: Any = config
    for key in path.split("."):
        node = node.get(key) if isinstance(node, Mapping) else None
    return node


def answer_room_problem(config: Mapping[str, Any], settings: EvaluationSettings) -> str | None:
    """Why the watcher's answers would be cut before ``evaluation.max_new_tokens`` (one line):
    a prompt's room (``data.max_input_seq_length``) and an answer's do not fit the model length
    its vLLM engine is built with (read as :func:`nemo_mmpo.eval.watch.vllm_engine` reads it).
    The dry run and ``nemo-mmpo eval watch`` refuse it."""
    length_key = "policy.generation.vllm_cfg.max_model_len"
    model_length = _at(config, length_key)
    if not model_length:
        length_key = "policy.max_total_sequence_length"
        model_length = _at(config, length_key)
    prompt_room = _at(config, "data.max_input_seq_length") or 0
    if not model_length or settings.max_new_tokens + prompt_room <= model_length:
        return None
    answer_room = model_length - prompt_room
    if answer_room >= 1:
        fix = f"lower evaluation.max_new_tokens to {answer_room} or less"
    else:
        suggested = model_length // 4
        fix = (
            f"give prompts a room below it (data.max_input_seq_length={suggested}, say) and "
            f"answers the rest (policy.generation.max_new_tokens={model_length - suggested}, "
            "which evaluation.max_new_tokens follows)"
        )
    return (
        f"evaluation.max_new_tokens={settings.max_new_tokens} plus data.max_input_seq_length="
        f"{prompt_room} (a prompt's room) is more than {length_key}={model_length}, the model "
        f"length the watcher samples with: its answers would be cut short; {fix}, or raise "
        "policy.max_total_sequence_length"
    )


def load_problems(settings: EvaluationSettings) -> list[dict[str, Any]]:
    """Every benchmark's problems (``{"id", "problem", "answer", "source"}``)."""
    if not settings.benchmarks:
        raise MMPOInputError("evaluation.benchmarks is empty: name at least one benchmark")
    return [
        record
        for name, path in settings.benchmarks.items()
        for record in load_benchmark(name, path)
    ]


def step_metrics(counts: ProblemCounts, settings: EvaluationSettings) -> dict[str, Any]:
    """The step's numbers from per-problem counts (see the module docstring)."""
    numbers: dict[str, Any] = {"benchmarks": {}}
    averages = []
    for benchmark in counts.benchmarks:
        subset = counts.benchmark(benchmark)
        samples = int(subset.samples.min())
        entry = {
            "problems": len(subset.keys),
            "samples_per_problem": samples,
            f"avg@{samples}": float(np.mean(subset.correct / subset.samples)),
        }
        for k in settings.pass_at:
            if k <= samples:
                entry[f"pass@{k}"] = float(pass_at_k(subset.samples, subset.correct, k).mean())
        numbers["benchmarks"][benchmark] = entry
        averages.append(entry[f"avg@{samples}"])
    numbers["average"] = float(np.mean(averages))
    numbers["accuracy"] = float(counts.correct.sum() / counts.samples.sum())
    success = counts.correct / counts.samples
    numbers["gini"] = {}
    for alpha in settings.gini_alphas:
        result = gini_by_method({"run": success}, alpha)
        numbers["gini"][f"alpha_{alpha:g}"] = float(result["methods"]["run"]["gini"])
    distribution = first_success_distribution(counts.samples, counts.correct)
    numbers["never_solved"] = distribution["never_solved"]
    numbers["first_success"] = [float(value) for value in distribution["pmf"]]
    return numbers


def flat_metrics(numbers: dict[str, Any]) -> dict[str, float]:
    """The step's numbers as ``paper/...`` scalars for NeMo-RL's logger."""
    flat = {
        f"{METRIC_PREFIX}average": numbers["average"],
        f"{METRIC_PREFIX}accuracy": numbers["accuracy"],
        f"{METRIC_PREFIX}never_solved": numbers["never_solved"],
    }
    for benchmark, entry in numbers["benchmarks"].items():
        for key, value in entry.items():
            if key.startswith(("avg@", "pass@")):
                flat[f"{METRIC_PREFIX}{benchmark}/{key}"] = value
    for key, value in numbers["gini"].items():
        flat[f"{METRIC_PREFIX}gini/{key}"] = value
    return flat


def evaluation_seed(step: int) -> int:
    """The seed of step ``step``'s evaluation (its own: the evaluation leaves the training
    run's random state alone, and the watcher draws what the loop draws)."""
    return zlib.crc32(f"evaluation step {step}".encode())


def step_paths(output_dir: str | Path, step: int) -> tuple[Path, Path]:
    """``(rollouts, numbers)`` files of ``step`` in ``output_dir``."""
    return Path(output_dir) / f"step_{step}.jsonl", Path(output_dir) / f"step_{step}.json"


def evaluate_step(
    sampler: Any,
    grade: Any,
    problems: Sequence[dict[str, Any]],
    settings: EvaluationSettings,
    step: int,
    output_dir: str | Path | None = None,
    batch_size: int = 64,
    prompts: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Sample, grade, write and measure one step; returns the numbers (also in the JSON).

    Args:
        sampler: ``generate(prompts, n) -> [[response] * n]`` at the protocol's settings.
        grade: ``(golds, predictions) -> [Verdict]``.
        problems: from :func:`load_problems`.
        batch_size: problems per call of ``sampler.generate``.
        prompts: each problem's prompt text, whole (:mod:`nemo_mmpo.eval.prompts`); None:
            ``evaluation.template`` around the problem.
    """
    from nemo_mmpo.eval.generate import run_generation

    started = time.monotonic()
    rollouts, record = step_paths(output_dir or settings.output_dir, step)
    run_generation(
        prompted(problems, settings, prompts),
        sampler,
        grade,
        rollouts,
        settings.samples,
        batch_size=batch_size,
        template="{}",  # each record's problem is its prompt text, whole
        progress=False,
    )
    numbers = step_metrics(load_run([rollouts]), settings)
    numbers.update(step=step, rollouts=rollouts.name, seconds=time.monotonic() - started)
    write_text_atomic(record, json.dumps(numbers, indent=2) + "\n")
    return numbers


def prompted(
    problems: Sequence[dict[str, Any]],
    settings: EvaluationSettings,
    prompts: Sequence[str] | None,
) -> list[dict[str, Any]]:
    """The problems, each ``problem`` replaced by the text its sampler continues."""
    if prompts is None:
        if settings.template is None:
            raise MMPOInputError(
                "evaluation.template is null (the training prompt), and nothing built it "
                "here: give evaluation.template (`{}`: the problem)"
            )
        prompts = [settings.template.format(problem["problem"]) for problem in problems]
    return [{**problem, "problem": text} for problem, text in zip(problems, prompts, strict=True)]


def read_steps(output_dir: str | Path) -> dict[int, dict[str, Any]]:
    """Every finished step's numbers in ``output_dir`` (``step_<N>.json``), by step."""
    steps = {}
    for path in sorted(Path(output_dir).glob("step_*.json")):
        try:
            step = int(path.stem.removeprefix("step_"))
        except ValueError:
            continue
        steps[step] = json.loads(path.read_text())
    return dict(sorted(steps.items()))
