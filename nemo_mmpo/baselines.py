"""The paper's baseline advantage estimators, each with its source's exact formula.

All take binary rewards grouped by prompt (see :class:`nemo_mmpo.grouping.RewardGroups`);
``n`` is a group's number of valid rollouts and ``c`` its successes.
"""

from __future__ import annotations

import torch

from nemo_mmpo.combinatorics import failure_subset_probabilities
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.estimators import GroupSizeNeed, register_estimator
from nemo_mmpo.grouping import RewardGroups
from nemo_mmpo.objectives import MomentObjective


def _subset_probability(failures: torch.Tensor, pool: torch.Tensor, order: int) -> torch.Tensor:
    """``C(failures, order) / C(pool, order)`` (0 where ``order > pool``)."""
    return failure_subset_probabilities(failures, pool, order)[..., order]


def _check_k(k: object, estimator: str) -> int:
    if k is None or isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise MMPOInputError(f"estimator {estimator!r} needs an integer k >= 1; got k={k!r}")
    return k


def _k_group_size(estimator: str):
    """Pass@k estimators need ``k <= G`` in every group (``k`` checked first)."""

    def need(objective: MomentObjective, options: dict) -> GroupSizeNeed:
        k = _check_k(options["k"], estimator)
        return GroupSizeNeed(
            minimum=k,
            requirement=f"k={k} <= group size G in every group",
            remedy="raise the group size (num_generations_per_prompt) or lower k",
        )

    return need


@register_estimator("grpo", objective="reinforce", family="mmpo", nemo_rl_formula=True)
def grpo(
    groups: RewardGroups,
    objective: MomentObjective,
    normalize_std: bool = True,
    leave_one_out: bool = False,
    epsilon: float = 1e-6,
) -> torch.Tensor:
    """GRPO (Shao et al. 2024): ``A = (r - baseline) / (std + epsilon)``, as NeMo-RL computes it.

    Without ``leave_one_out`` the baseline is the group mean and ``std`` the Bessel-corrected
    group standard deviation; with it, both are taken over the other ``n - 1`` rollouts
    (RLOO). Groups with one valid rollout get 0; groups with ``std = 0`` are not divided.
    The objective is ignored (GRPO optimises the first moment).
    """
    size = groups.gather(groups.group_size)
    total = groups.gather(groups.success_count)
    total_square = groups.gather(groups.segment_sum(groups.rewards.square()))
    if leave_one_out:
        count = size - 1.0
        total = total - groups.rewards
        total_square = total_square - groups.rewards.square()
    else:
        count = size
    safe_count = count.clamp(min=1.0)
    baseline = total / safe_count
    variance = (total_square / safe_count - baseline.square()).clamp(min=0.0)
    variance = torch.where(
        count > 1, variance * count / (count - 1.0).clamp(min=1.0), torch.zeros_like(variance)
    )
    std = variance.sqrt()
    advantages = torch.where(size > 1, groups.rewards - baseline, torch.zeros_like(baseline))
    if normalize_std:
        advantages = torch.where(std > 0, advantages / (std + epsilon), advantages)
    return advantages


@register_estimator("passk_chen", objective="pass_at_k", group_size=_k_group_size("passk_chen"))
def passk_chen(
    groups: RewardGroups, objective: MomentObjective, k: int = 3, epsilon: float = 1e-6
) -> torch.Tensor:
    """Pass@k training, analytic advantages (Chen et al. 2025, arXiv 2508.10751).

    ``R = 1 - C(n-c, k)/C(n, k)``, ``sigma = sqrt(R (1-R))``;
    positives ``(1 - R)/sigma``, negatives ``(1 - R - C(n-c-1, k-1)/C(n-1, k-1))/sigma``
    (``sigma + epsilon`` as in the authors' code; ``sigma = 0`` gives 0). Needs ``k <= n``.
    """
    size = groups.gather(groups.group_size)
    failures = groups.gather(groups.failure_count)
    group_pass = 1.0 - _subset_probability(failures, size, k)
    sigma = (group_pass * (1.0 - group_pass)).clamp(min=0.0).sqrt()
    other_failures = (failures - 1.0).clamp(min=0.0)
    negative_shift = _subset_probability(other_failures, size - 1.0, k - 1)
    numerator = torch.where(groups.rewards > 0, 1.0 - group_pass, 1.0 - group_pass - negative_shift)
    return torch.where(sigma > 0, numerator / (sigma + epsilon), torch.zeros_like(sigma))


@register_estimator("pkpo", objective="pass_at_k", group_size=_k_group_size("pkpo"))
def pkpo(groups: RewardGroups, objective: MomentObjective, k: int = 3) -> torch.Tensor:
    """PKPO's unbiased pass@k transform, "loo-minus-one" (Walder & Karkhanis, arXiv 2505.15201).

    Binary case: a correct rollout gets ``(k/n) C(n-c, k-1)/C(n-1, k-1)``, an incorrect one 0
    (the transformed reward minus its leave-one-out pass@(k-1) baseline). Needs ``k <= n``.
    """
    size = groups.gather(groups.group_size)
    failures = groups.gather(groups.failure_count)
    positive = (k / size.clamp(min=1.0)) * _subset_probability(failures, size - 1.0, k - 1)
    return torch.where(groups.rewards > 0, positive, torch.zeros_like(positive))


@register_estimator("maxrl", objective="maxrl")
def maxrl(
    groups: RewardGroups,
    objective: MomentObjective,
    maclaurin_order: int | None = None,
    epsilon: float = 1e-6,
) -> torch.Tensor:
    """MaxRL (Tajwar et al. 2026, arXiv 2602.02710).

    ``maclaurin_order=None`` (the authors' default): ``A = (r - s_hat)/(s_hat + epsilon)``,
    i.e. ``r n/c - 1``, 0 when ``c = 0``. With ``maclaurin_order = T`` the order-T Maclaurin
    estimator of ``sum_{k<=T} grad pass@k / k``: success weight 1, failure weight
    ``-sum_{m=1..T-1} C(F-1, m)/C(n-1, m)`` (``F`` failures), i.e. the authors' weights scaled by
    ``n`` so that T = 1 is REINFORCE on the raw reward.
    """
    if maclaurin_order is None:
        success_rate = groups.gather(groups.success_rate)
        return (groups.rewards - success_rate) / (success_rate + epsilon)
    if isinstance(maclaurin_order, bool) or not isinstance(maclaurin_order, int):
        raise MMPOInputError(
            f"maxrl maclaurin_order must be an integer >= 1 or None; got {maclaurin_order!r}"
        )
    if maclaurin_order < 1:
        raise MMPOInputError(f"maxrl maclaurin_order must be >= 1; got {maclaurin_order}")
    size = groups.gather(groups.group_size)
    other_failures = (groups.gather(groups.failure_count) - 1.0).clamp(min=0.0)
    ratios = failure_subset_probabilities(other_failures, size - 1.0, maclaurin_order - 1)
    failure_weight = -ratios[:, 1:].sum(dim=-1)
    return torch.where(groups.rewards > 0, torch.ones_like(failure_weight), failure_weight)
