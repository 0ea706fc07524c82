"""DMPO's distribution-matching penalty (Li et al. 2026, arXiv 2605.19461), framework-free.

DMPO is a loss term, not an advantage: within each prompt group it pulls the policy's
softmax over responses towards a softmax over rewards,

    p_j = softmax_j(r_j / alpha),   q_j = softmax_j(phi_j),
    penalty = (1/G) sum_j (p_j - q_j)^2,

where ``phi_j`` is the token-mean log-probability of response ``j`` under the current
policy; the training loss is ``L_GRPO + lambda * mean over groups of penalty`` (paper:
``lambda = 2``, ``alpha = 1/15``). Gradients flow through ``phi`` only.
"""

from __future__ import annotations

import torch

from nemo_mmpo.errors import MMPOInputError

PAPER_TEMPERATURE = 1.0 / 15.0
PAPER_COEFFICIENT = 2.0


def group_softmax(
    logits: torch.Tensor, group_index: torch.Tensor, num_groups: int, valid: torch.Tensor
) -> torch.Tensor:
    """Softmax of ``[N]`` logits within each group of ``group_index``; 0 where not valid."""
    masked = torch.where(valid, logits, torch.full_like(logits, -torch.inf))
    group_max = torch.full((num_groups,), -torch.inf, dtype=logits.dtype, device=logits.device)
    group_max = group_max.scatter_reduce(0, group_index, masked.detach(), reduce="amax")
    shifted = masked - group_max[group_index].nan_to_num(0.0, neginf=0.0)
    exponentials = torch.where(valid, shifted.exp(), torch.zeros_like(shifted))
    totals = torch.zeros(num_groups, dtype=logits.dtype, device=logits.device)
    totals = totals.index_add(0, group_index, exponentials)
    return exponentials / totals[group_index].clamp(min=torch.finfo(logits.dtype).tiny)


def distribution_matching_penalty(
    rewards: torch.Tensor,
    mean_token_logprobs: torch.Tensor,
    group_ids: torch.Tensor,
    temperature: float = PAPER_TEMPERATURE,
    valid_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean over groups of ``(1/G) sum_j (p_j - q_j)^2`` (a differentiable scalar).

    Args:
        rewards: ``[N]`` rewards (any real values; binary in the paper).
        mean_token_logprobs: ``[N]`` token-mean log-probability of each response under the
            current policy (carries the gradient).
        group_ids: ``[N]`` integer prompt-group ids.
        temperature: ``alpha`` of the reward softmax (> 0).
        valid_mask: ``[N]`` bool; invalid responses are left out of both softmaxes.
    """
    if not temperature > 0:
        raise MMPOInputError(f"DMPO temperature alpha must be > 0 (paper: 1/15); got {temperature}")
    if rewards.shape != mean_token_logprobs.shape or rewards.shape != group_ids.shape:
        raise MMPOInputError(
            f"rewards {tuple(rewards.shape)}, mean_token_logprobs "
            f"{tuple(mean_token_logprobs.shape)} and group_ids {tuple(group_ids.shape)} must all "
            "be [num_responses]"
        )
    valid = torch.ones_like(rewards, dtype=torch.bool) if valid_mask is None else valid_mask.bool()
    group_index = torch.unique(group_ids, return_inverse=True)[1]
    num_groups = int(group_index.max().item()) + 1 if group_index.numel() else 0
    if num_groups == 0:
        raise MMPOInputError("empty batch: no responses to compute the DMPO penalty on")
    dtype = mean_token_logprobs.dtype
    target = group_softmax(rewards.to(dtype) / temperature, group_index, num_groups, valid)
    policy = group_softmax(mean_token_logprobs, group_index, num_groups, valid)
    squared = torch.where(valid, (target.detach() - policy).square(), torch.zeros_like(policy))
    sizes = torch.zeros(num_groups, dtype=dtype, device=rewards.device)
    sizes = sizes.index_add(0, group_index, valid.to(dtype))
    per_group = torch.zeros(num_groups, dtype=dtype, device=rewards.device)
    per_group = per_group.index_add(0, group_index, squared)
    present = sizes > 0
    return (per_group[present] / sizes[present]).mean()
