"""Per-step statistics of a batch's failure-rate distribution, for logging."""

from __future__ import annotations

import torch

from nemo_mmpo.combinatorics import failure_subset_probabilities
from nemo_mmpo.grouping import RewardGroups
from nemo_mmpo.objectives import MomentObjective, moment_objective


def moment_diagnostics(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    truncation_order: int = 4,
    valid_mask: torch.Tensor | None = None,
    *,
    objective: MomentObjective | None = None,
    reward_threshold: float | None = None,
) -> dict[str, float]:
    """Statistics of the failure rate F over the batch's prompts.

    Args:
        rewards: ``[num_rollouts]`` binary rewards.
        group_ids: ``[num_rollouts]`` integer prompt-group ids.
        truncation_order: T, the number of moments reported.
        valid_mask: ``[num_rollouts]`` bool; invalid rollouts are ignored.
        objective: objective whose weight ``w(f_hat)`` is summarised (default MMPO with T).

    Returns:
        ``failure_moment_k`` (k = 1..T): mean over prompts of ``C(F_i, k)/C(n_i, k)``, the
        unbiased estimate of ``E[F^k]`` (plug-in ``f_hat^k`` for a group with ``n_i < k``);
        ``truncated_first_success_time``: ``sum_{k=0..T} E[F^k]``, the expected number of
        attempts to the first success capped at T + 1 (Eq. practical_objective);
        ``weight_mean``/``weight_max`` of ``w(f_hat)`` over prompts; ``no_signal_fraction``
        (all pass or all fail), ``all_pass_fraction``, ``all_fail_fraction``;
        ``success_rate`` (over rollouts) and ``num_groups``.
    """
    groups = RewardGroups.from_flat(rewards, group_ids, valid_mask, reward_threshold)
    return group_statistics(groups, truncation_order, objective)


def group_statistics(
    groups: RewardGroups, truncation_order: int = 4, objective: MomentObjective | None = None
) -> dict[str, float]:
    """:func:`moment_diagnostics` of already-validated groups (same keys)."""
    present = groups.group_size > 0
    size = groups.group_size[present]
    failures = groups.failure_count[present]
    num_groups = int(present.sum().item())
    objective = moment_objective("mmpo", truncation_order) if objective is None else objective
    if num_groups == 0:  # every rollout masked out: nothing to describe, nothing to crash on
        keys = [f"failure_moment_{k}" for k in range(1, truncation_order + 1)]
        keys += [
            "truncated_first_success_time",
            "weight_mean",
            "weight_max",
            "no_signal_fraction",
            "all_pass_fraction",
            "all_fail_fraction",
            "success_rate",
        ]
        return {**dict.fromkeys(keys, float("nan")), "num_groups": 0.0}

    unbiased = failure_subset_probabilities(failures, size, truncation_order)[:, 1:]
    failure_rate = failures / size
    orders = torch.arange(1, truncation_order + 1, dtype=torch.float64, device=size.device)
    plug_in = failure_rate.unsqueeze(-1) ** orders
    estimable = size.unsqueeze(-1) >= orders
    moments = torch.where(estimable, unbiased, plug_in).mean(dim=0)

    weight = objective.weight(failure_rate)
    all_pass = failures == 0
    all_fail = failures == size
    stats = {f"failure_moment_{k}": float(moments[k - 1]) for k in range(1, truncation_order + 1)}
    stats.update(
        truncated_first_success_time=float(1.0 + moments.sum()),
        weight_mean=float(weight.mean()),
        weight_max=float(weight.max()),
        no_signal_fraction=float((all_pass | all_fail).double().mean()),
        all_pass_fraction=float(all_pass.double().mean()),
        all_fail_fraction=float(all_fail.double().mean()),
        success_rate=float(groups.success_count.sum() / groups.group_size.sum()),
        num_groups=float(num_groups),
    )
    return stats
