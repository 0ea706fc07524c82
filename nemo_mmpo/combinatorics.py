"""Ratios of binomial coefficients, computed by stable products (no factorials)."""

from __future__ import annotations

import torch


def failure_subset_probabilities(
    failures: torch.Tensor, pool: torch.Tensor, max_order: int
) -> torch.Tensor:
    """``C(failures, m) / C(pool, m)`` for ``m = 0..max_order``.

    This is the probability that ``m`` rollouts drawn without replacement from ``pool``
    rollouts, ``failures`` of which failed, all failed; it is the unbiased estimator of
    ``f^m`` from a group of ``pool`` rollouts. Built as the running product
    ``prod_{i<m} (failures - i) / (pool - i)``, exact to rounding for any group size.
    Orders above ``pool`` (no such subsets) give 0.

    Args:
        failures: ``[N]`` failure counts (float64, ``0 <= failures <= pool``).
        pool: ``[N]`` pool sizes (float64).
        max_order: highest ``m`` (>= 0).

    Returns:
        ``[N, max_order + 1]`` float64; column 0 is 1.
    """
    failures = failures.to(torch.float64)
    pool = pool.to(torch.float64)
    columns = [torch.ones_like(failures)]
    running = columns[0]
    for i in range(max_order):
        remaining = pool - i
        factor = torch.where(
            remaining > 0,
            ((failures - i) / remaining.clamp(min=1)).clamp(min=0),
            torch.zeros_like(remaining),
        )
        running = running * factor
        columns.append(running)
    return torch.stack(columns, dim=-1)
