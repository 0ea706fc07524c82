"""Shared test helpers."""

from __future__ import annotations

import itertools

import torch


def all_reward_patterns(group_size: int) -> torch.Tensor:
    """``[2**group_size, group_size]`` float64: every binary reward pattern of one group."""
    patterns = list(itertools.product((0.0, 1.0), repeat=group_size))
    return torch.tensor(patterns, dtype=torch.float64)


def pattern_probabilities(patterns: torch.Tensor, success_probability: float) -> torch.Tensor:
    """``[num_patterns]`` probability of each pattern under i.i.d. Bernoulli(success)."""
    successes = patterns.sum(dim=1)
    failures = patterns.shape[1] - successes
    return success_probability**successes * (1.0 - success_probability) ** failures
