"""The supervised warm start, run until a measured success rate is reached.

A randomly initialised model never samples a correct answer, so RL from scratch has no signal.
The warm start trains on ``prompt + correct response + <eos>`` (cross-entropy on the response)
and stops when the success rate of *samples* on the training prompts, at the training
temperature and top-p, graded by NeMo-RL's Math-Verify scorer, lies in a target band. The
prompts are those the RL run gives the policy: for a recipe's own data section, each sum as
NeMo-RL's data processor formats it for the recipe (:attr:`WarmStartSpec.prompts`). Where it
stops is measured, not a step count tuned on one machine: float rounding on another CPU moves
the trajectory, and the loop simply stops at another step.

Every ``check_every`` steps it measures. A measurement above the band (the model jumped over
it) rolls the model, the optimizer and the data order back to the last measurement and
continues with a quarter of the interval. Reaching ``max_steps`` below the band, or jumping
over it one step at a time, raises :class:`WarmStartError` naming the measurements and the fix.

The result is saved as a Hugging Face checkpoint with ``warm_start.json`` (settings, the
measurements, the interpreter and torch build that made it) in a cache keyed by everything
that determines it, so runs that share a seed (the methods of a paired comparison, or a rerun)
start from the same weights without training them again.
"""

from __future__ import annotations

import copy
import hashlib
import json
import platform
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from nemo_mmpo.cpu.rig.measure import Sampler, success_rate
from nemo_mmpo.cpu.rig.model import ModelShape, load_tiny_model, tiny_model
from nemo_mmpo.cpu.rig.task import AdditionTask, AnyProblem, FormattedProblem, solved_rows
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.settings import Settings

INFO_FILE = "warm_start.json"
DTYPES = {"float32": torch.float32, "float64": torch.float64}


class WarmStartError(MMPOInputError):
    """The warm start did not reach its target band; the message names the fix."""


class WarmStartSettings(Settings):
    """``cpu_backend.warm_start`` in the recipe.

    Attributes:
        target_low, target_high: the band the sampled success rate must reach.
        learning_rate: AdamW's (a stable value, well below where training diverges).
        batch_size: training problems per supervised step (drawn with replacement).
        check_every: supervised steps between measurements (a quarter after an overshoot).
        check_prompts: training prompts measured each time (the first ones of the split).
        check_samples: samples per measured prompt.
        max_steps: the cap; reaching it below the band is an error.
        dtype: ``float32`` or ``float64`` for the warm start's arithmetic (the policy trains
            in float32 either way).
        enabled: false: no warm start, the policy starts from the seeded random initialisation
            (it samples no right answer, so the reward stays 0: for runs that check the
            engines, not learning).
    """

    target_low: float = Field(0.25, ge=0.0, le=1.0)
    target_high: float = Field(0.55, ge=0.0, le=1.0)
    learning_rate: float = Field(1e-3, gt=0.0)
    batch_size: int = Field(256, ge=1)
    check_every: int = Field(25, ge=1)
    check_prompts: int = Field(256, ge=1)
    check_samples: int = Field(2, ge=1)
    max_steps: int = Field(3000, ge=1)
    dtype: Literal["float32", "float64"] = "float32"
    enabled: bool = True

    def key_parts(self) -> dict[str, Any]:
        """What of the settings determines a warm start (``enabled`` does not: a disabled warm
        start is neither made nor cached)."""
        parts = self.model_dump()
        del parts["enabled"]
        return parts

    @model_validator(mode="after")
    def _band(self) -> WarmStartSettings:
        if self.target_low >= self.target_high:
            raise MMPOInputError(
                f"the target band [{self.target_low}, {self.target_high}] is empty: give "
                "target_low < target_high"
            )
        return self


@dataclass
class WarmStartResult:
    """What the warm start did: where it stopped and every measurement on the way."""

    steps: int
    success: float
    measurements: list[dict[str, float]] = field(default_factory=list)
    rollbacks: int = 0
    made_by: dict[str, str] = field(default_factory=dict)


def supervised_batch(tokenizer: Any, problems: list[AnyProblem]) -> dict[str, torch.Tensor]:
    """``input_ids``, ``attention_mask`` and ``labels`` (-100 outside the response) of
    ``prompt + response + <eos>`` for each problem, right-padded."""
    input_ids, lengths, prompt_lengths = solved_rows(tokenizer, problems)
    labels = torch.full_like(input_ids, -100)
    attention = torch.zeros_like(input_ids)
    for index, (length, prompt_length) in enumerate(zip(lengths, prompt_lengths, strict=True)):
        labels[index, prompt_length:length] = input_ids[index, prompt_length:length]
        attention[index, :length] = 1
    return {"input_ids": input_ids, "attention_mask": attention, "labels": labels}


def _made_by() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": str(torch.get_num_threads()),
        "kernels": torch.backends.cpu.get_cpu_capability(),
        "machine": platform.machine(),
    }


def warm_start(
    model: Any,
    tokenizer: Any,
    problems: list[AnyProblem],
    settings: WarmStartSettings,
    sampler: Sampler,
    seed: int,
    log: Any = None,
    measure: Any = None,
) -> WarmStartResult:
    """Train ``model`` in place until its sampled success on ``problems`` is in the band.

    ``measure(model, tokenizer, problems, samples, sampler) -> success rate`` defaults to
    :func:`success_rate` (sampling graded by Math-Verify).

    Raises:
        WarmStartError: the band was not reached within ``settings.max_steps``, or the model
            jumps over it in a single step.
    """
    log = log or (lambda message: None)
    measure = measure or success_rate
    dtype = DTYPES[settings.dtype]
    model.to(dtype)
    data = supervised_batch(tokenizer, problems)
    measured = problems[: settings.check_prompts]
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate)
    order = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # the measurements' samples
    low, high = settings.target_low, settings.target_high
    result = WarmStartResult(steps=0, success=0.0, made_by=_made_by())
    interval = settings.check_every
    while True:
        saved = (
            copy.deepcopy(model.state_dict()),
            copy.deepcopy(optimizer.state_dict()),
            order.get_state(),
            result.steps,
        )
        model.train()
        for _ in range(min(interval, settings.max_steps - result.steps)):
            rows = torch.randint(0, len(problems), (settings.batch_size,), generator=order)
            loss = model(**{key: value[rows] for key, value in data.items()}).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            result.steps += 1
        model.eval()
        success = measure(model, tokenizer, measured, settings.check_samples, sampler)
        result.measurements.append(
            {"step": result.steps, "success": success, "loss": float(loss.detach())}
        )
        log(
            f"warm start step {result.steps}: loss {float(loss.detach()):.3f}, sampled success "
            f"{success:.3f}"
        )
        if low <= success <= high:
            result.success = success
            model.to(torch.float32)
            return result
        if success > high:
            if interval == 1:
                raise WarmStartError(
                    f"the warm start jumped over the band [{low}, {high}] in one step (success "
                    f"{success:.3f} at step {result.steps}): lower cpu_backend.warm_start."
                    f"learning_rate={settings.learning_rate} or widen the band"
                )
            model.load_state_dict(saved[0])
            optimizer.load_state_dict(saved[1])
            order.set_state(saved[2])
            result.steps = saved[3]
            result.rollbacks += 1
            interval = max(1, interval // 4)
        elif result.steps >= settings.max_steps:
            trail = ", ".join(f"{m['success']:.2f}" for m in result.measurements[-5:])
            raise WarmStartError(
                f"the warm start reached cpu_backend.warm_start.max_steps={settings.max_steps} "
                f"with sampled success {success:.3f}, below the band [{low}, {high}] (last "
                f"measurements: {trail}): raise max_steps, the learning rate or the model size"
            )


def fingerprint(parts: dict[str, Any]) -> str:
    """A short stable hash of everything that determines a warm start."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class WarmStartSpec:
    """Everything that determines a warm start (the cache key).

    ``prompts``: the training problems' prompts as NeMo-RL formats them for the recipe
    (``cpu_backend.problems: recipe``: its prompt file, system prompt and chat template), in the
    order of ``task.split()``'s training problems; None where they are the sums as they are
    (``What is 47 + 38?``), whose key is the one the rig's own task has always had."""

    task: AdditionTask
    shape: ModelShape
    settings: WarmStartSettings
    sampler: Sampler
    seed: int
    prompts: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.prompts is not None and len(self.prompts) != self.task.train_size:
            raise ValueError(
                f"{len(self.prompts)} formatted prompts for {self.task.train_size} training "
                "problems"
            )

    def training_problems(self) -> list[AnyProblem]:
        """What the warm start trains on and measures: the task's training problems, each
        under its formatted prompt when there are ``prompts``."""
        train, _ = self.task.split()
        if self.prompts is None:
            return train
        return [
            FormattedProblem(problem, prompt)
            for problem, prompt in zip(train, self.prompts, strict=True)
        ]

    def parts(self) -> dict[str, Any]:
        parts = {
            "task": self.task.model_dump(),
            "shape": self.shape.key_parts(),
            "settings": self.settings.key_parts(),
            "sampler": self.sampler.model_dump(),
            "seed": self.seed,
        }
        if self.prompts is not None:  # every prompt in the key; the first two to read
            text = json.dumps(list(self.prompts))
            parts["prompts"] = {
                "sha256": hashlib.sha256(text.encode()).hexdigest(),
                "first": list(self.prompts[:2]),
            }
        return parts

    def key(self) -> str:
        return fingerprint(self.parts())


def load_or_make(
    spec: WarmStartSpec, tokenizer: Any, cache_dir: Path | None, log: Any = print
) -> tuple[Any, WarmStartResult, Path | None]:
    """The warm-started model for ``spec``: from ``cache_dir/<key>`` when it is there, else
    trained (and saved there atomically, when ``cache_dir`` is given).

    Processes that ask for the same key at once (two seeds' runs of a spread, two test
    sessions sharing a cache) train it once: the first holds ``cache_dir/<key>.lock`` while it
    trains, the others wait for it and read what it saved.

    Returns ``(model, result, checkpoint directory or None)``.
    """
    if cache_dir is None:
        return _load_or_train(spec, tokenizer, None, log)
    directory = Path(cache_dir) / spec.key()
    with _held(directory.with_name(directory.name + ".lock"), log):
        return _load_or_train(spec, tokenizer, directory, log)


@contextmanager
def _held(lock_path: Path, log: Any) -> Iterator[None]:
    """An exclusive ``flock`` on ``lock_path`` for the block (released if the process dies)."""
    import fcntl

    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"warm start: another process is making it ({lock_path}); waiting")
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _load_or_train(
    spec: WarmStartSpec, tokenizer: Any, directory: Path | None, log: Any
) -> tuple[Any, WarmStartResult, Path | None]:
    if directory is not None and (directory / INFO_FILE).is_file():
        info = json.loads((directory / INFO_FILE).read_text())
        model = load_tiny_model(directory)
        result = WarmStartResult(**info["result"])
        log(
            f"warm start: reusing {directory} ({result.steps} steps, sampled success "
            f"{result.success:.3f}, made by Python {result.made_by.get('python')} torch "
            f"{result.made_by.get('torch')})"
        )
        return model, result, directory
    train = spec.training_problems()
    model = tiny_model(tokenizer, spec.shape, spec.seed)
    result = warm_start(model, tokenizer, train, spec.settings, spec.sampler, spec.seed, log)
    log(
        f"warm start: {result.steps} steps, sampled success {result.success:.3f} in "
        f"[{spec.settings.target_low}, {spec.settings.target_high}]"
    )
    if directory is not None:
        save(model, tokenizer, spec, result, directory)
    return model, result, directory


def save(model: Any, tokenizer: Any, spec: WarmStartSpec, result: WarmStartResult, directory: Path):
    """Write the checkpoint and ``warm_start.json`` into ``directory`` atomically (a rename
    of a finished temporary directory)."""
    import os
    import shutil
    import tempfile

    directory.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        model.save_pretrained(temporary)
        tokenizer.save_pretrained(temporary)
        info = {
            "key": spec.key(),
            **spec.parts(),
            "result": asdict(result),
            "argv": sys.argv,
        }
        (temporary / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
        os.chmod(temporary, 0o755)
        try:
            temporary.rename(directory)
        except OSError:  # another process finished the same warm start first: keep theirs
            shutil.rmtree(temporary)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
