"""The tiny task: additions of numbers below 100, with a ``\\boxed{}`` answer.

``What is 47 + 38?`` is answered ``\\boxed{85}``, graded 0/1 by NeMo-RL's Math-Verify math
environment. Problems fall in four difficulty strata (:data:`STRATA`): two one-digit operands;
one one-digit and one two-digit operand; two two-digit operands without a carry; and with a
carry (a units carry, a tens carry, or both). The held-out set takes the same number of
problems from each stratum, so that an evaluation reports every stratum on an equal footing;
the training set is a uniform sample of the rest (so it is mostly two-digit problems, as the
space is).

Everything here is plain Python: the warm start and the evaluation use it without NeMo-RL.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.io import write_jsonl_atomic
from nemo_mmpo.settings import Settings

#: Difficulty strata, easiest first (the held-out set is stratified over them).
STRATA = ("one_digit", "mixed_digits", "two_digit_no_carry", "two_digit_carry")
PROMPT = "What is {a} + {b}?"
RESPONSE = "\\boxed{{{total}}}"
#: The held-out problems as an evaluation benchmark (``python -m nemo_mmpo.eval``).
BENCHMARK = "arithmetic"


@dataclass(frozen=True)
class Problem:
    """``a + b`` with its prompt, gold answer and difficulty stratum."""

    a: int
    b: int

    @property
    def id(self) -> str:
        return f"{self.a}+{self.b}"

    @property
    def prompt(self) -> str:
        return PROMPT.format(a=self.a, b=self.b)

    @property
    def answer(self) -> str:
        return str(self.a + self.b)

    @property
    def response(self) -> str:
        """The supervised warm start's target (what a correct sample looks like)."""
        return RESPONSE.format(total=self.a + self.b)

    @property
    def stratum(self) -> str:
        digits = (self.a >= 10) + (self.b >= 10)
        if digits == 0:
            return "one_digit"
        if digits == 1:
            return "mixed_digits"
        carry = self.a % 10 + self.b % 10 >= 10 or self.a // 10 + self.b // 10 >= 10
        return "two_digit_carry" if carry else "two_digit_no_carry"


@dataclass(frozen=True)
class FormattedProblem:
    """A sum under a recipe's formatting: ``prompt`` is the text NeMo-RL's data processor makes
    of ``problem.prompt`` for the recipe (its prompt file, system prompt and chat template), the
    text whose tokens the policy is given; answer and response are the sum's."""

    problem: Problem
    prompt: str

    @property
    def id(self) -> str:
        return self.problem.id

    @property
    def answer(self) -> str:
        return self.problem.answer

    @property
    def response(self) -> str:
        return self.problem.response

    @property
    def stratum(self) -> str:
        return self.problem.stratum


#: A sum as the warm start and the measures take it: as it is, or under a recipe's formatting.
AnyProblem = Problem | FormattedProblem


class AdditionTask(Settings):
    """All sums ``a + b`` with ``0 <= a, b < 100``, split into training and held-out problems.

    Attributes:
        held_out_per_stratum: held-out problems drawn from each of :data:`STRATA`.
        train_size: training problems (a uniform sample of the problems not held out).
        split_seed: the split's seed (fixed across a study's seeds, so every run is evaluated
            on the same held-out problems).
    """

    held_out_per_stratum: int = Field(60, ge=1, le=99)  # the smallest stratum has 100
    train_size: int = Field(2000, ge=1)
    split_seed: int = 0

    @model_validator(mode="after")
    def _room_for_training(self) -> AdditionTask:
        room = 100 * 100 - self.held_out_per_stratum * len(STRATA)
        if self.train_size > room:
            raise MMPOInputError(
                f"train_size={self.train_size} with held_out_per_stratum="
                f"{self.held_out_per_stratum} leaves room for {room} training problems"
            )
        return self

    @staticmethod
    def _by_stratum() -> dict[str, list[Problem]]:
        strata: dict[str, list[Problem]] = {name: [] for name in STRATA}
        for a in range(100):
            for b in range(100):
                problem = Problem(a, b)
                strata[problem.stratum].append(problem)
        return strata

    def split(self) -> tuple[list[Problem], list[Problem]]:
        """``(train, held_out)``: disjoint, each in a seeded random order."""
        generator = random.Random(self.split_seed)
        held_out: list[Problem] = []
        rest: list[Problem] = []
        for problems in self._by_stratum().values():
            shuffled = list(problems)
            generator.shuffle(shuffled)
            held_out.extend(shuffled[: self.held_out_per_stratum])
            rest.extend(shuffled[self.held_out_per_stratum :])
        generator.shuffle(rest)
        generator.shuffle(held_out)
        return rest[: self.train_size], held_out


def solved_rows(tokenizer: Any, problems: list[AnyProblem]) -> tuple[Any, list[int], list[int]]:
    """Each problem's ``prompt + response + <eos>`` tokens, right-padded with the tokenizer's pad
    token: ``(input_ids [num_problems, width] int64, row lengths, prompt lengths)``."""
    import torch

    rows, prompt_lengths = [], []
    for problem in problems:
        prompt = tokenizer.encode(problem.prompt, add_special_tokens=False)
        response = tokenizer.encode(problem.response, add_special_tokens=False)
        prompt_lengths.append(len(prompt))
        rows.append([*prompt, *response, tokenizer.eos_token_id])
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    for index, row in enumerate(rows):
        input_ids[index, : len(row)] = torch.tensor(row)
    return input_ids, [len(row) for row in rows], prompt_lengths


def datum(tokenizer: Any, problem: Problem, index: int) -> dict[str, Any]:
    """One NeMo-RL ``DatumSpec`` (what its math data processor produces) for ``problem``."""
    import torch

    token_ids = torch.tensor(tokenizer.encode(problem.prompt, add_special_tokens=False))
    return {
        "message_log": [{"role": "user", "content": problem.prompt, "token_ids": token_ids}],
        "length": len(token_ids),
        "extra_env_info": {"ground_truth": problem.answer},
        "loss_multiplier": 1.0,
        "idx": index,
        "task_name": "math",
    }


def benchmark_records(problems: list[Problem]) -> list[dict[str, Any]]:
    """Problems as evaluation records (:mod:`nemo_mmpo.data`'s schema, plus the stratum)."""
    return [
        {
            "id": problem.id,
            "problem": problem.prompt,
            "answer": problem.answer,
            "source": BENCHMARK,
            "stratum": problem.stratum,
        }
        for problem in problems
    ]


def write_benchmark_file(path: Path, problems: list[Problem]) -> Path:
    """The problems as a local benchmark file for ``python -m nemo_mmpo.eval`` (atomic)."""
    write_jsonl_atomic(benchmark_records(problems), path)
    return path
