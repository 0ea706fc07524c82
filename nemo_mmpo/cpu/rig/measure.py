"""What the tiny policy can do, measured two ways on a set of problems.

- :func:`success_rate` / :func:`success_counts`: samples at the run's sampler, graded by
  NeMo-RL's Math-Verify scorer (what the RL reward sees; noisy by construction);
- :func:`expected_success`: the mean over problems of the probability that one sample is
  exactly the correct response (``\\boxed{85}`` then end of sequence), computed from the
  policy's log-probabilities at the sampling temperature, with no sampling at all. For this
  task it is a lower bound on the success rate (Math-Verify also accepts a few other
  spellings), and it moves only when the policy does: the statistic the learning test uses.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from pydantic import Field

from nemo_mmpo.cpu.engines.sampling import sample_texts, token_logprobs
from nemo_mmpo.cpu.rig.task import AnyProblem, solved_rows
from nemo_mmpo.eval.verify import make_scorer
from nemo_mmpo.settings import Settings


class Sampler(Settings):
    """How the RL run samples (the warm start measures success the same way)."""

    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(12, ge=1)


def success_rate(
    model: Any, tokenizer: Any, problems: list[AnyProblem], samples: int, sampler: Sampler
) -> float:
    """Share of correct samples (NeMo-RL's Math-Verify scorer, as the training reward)."""
    return float(sum(success_counts(model, tokenizer, problems, samples, sampler))) / (
        samples * len(problems)
    )


def success_counts(
    model: Any, tokenizer: Any, problems: list[AnyProblem], samples: int, sampler: Sampler
) -> list[int]:
    """Correct samples out of ``samples`` for each problem."""
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    score = make_scorer()
    texts = sample_texts(
        model,
        tokenizer,
        [problem.prompt for problem in problems],
        samples,
        sampler.temperature,
        sampler.top_p,
        sampler.max_new_tokens,
    )
    return [
        sum(score(problem.answer, text) >= 1.0 for text in responses)
        for problem, responses in zip(problems, texts, strict=True)
    ]


def expected_success(
    model: Any, tokenizer: Any, problems: list[AnyProblem], temperature: float = 1.0
) -> float:
    """Mean over ``problems`` of ``p(correct response + <eos> | prompt)`` at ``temperature``."""
    return float(success_probabilities(model, tokenizer, problems, temperature).mean())


def success_profile(
    model: Any, tokenizer: Any, problems: list[AnyProblem], temperature: float = 1.0
) -> dict[str, float]:
    """How per-problem success spreads: the mean of :func:`success_probabilities` and the
    shares of problems below 0.2 and above 0.8 (a problem's success rate under sampling is at
    least its probability, the verifier accepting other spellings too)."""
    probabilities = success_probabilities(model, tokenizer, problems, temperature)
    return {
        "mean": float(probabilities.mean()),
        "below_0.2": float((probabilities < 0.2).double().mean()),
        "above_0.8": float((probabilities > 0.8).double().mean()),
    }


def success_probabilities(
    model: Any, tokenizer: Any, problems: list[AnyProblem], temperature: float = 1.0
) -> torch.Tensor:
    """``p(correct response + <eos> | prompt)`` at ``temperature`` per problem, float64
    ``[num_problems]``, from one forward pass."""
    input_ids, lengths, starts = solved_rows(tokenizer, problems)
    with torch.no_grad():
        logprobs = token_logprobs(model, input_ids, torch.tensor(lengths), temperature).double()
    positions = torch.arange(input_ids.shape[1])
    response = positions[None, :] >= torch.tensor(starts)[:, None]
    return torch.exp((logprobs * response).sum(dim=1))
