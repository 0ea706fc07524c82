"""DMPO's distribution-matching penalty (Li et al. 2026, arXiv 2605.19461), framework-free.

DMPO is a loss term, not an advantage. The working definition is the authors' code (verl-recipe
pull request #105, ``dmpo/dmpo_core_algos.py``): within each prompt group it pulls the
policy's softmax over responses towards a softmax over the responses' GRPO advantages,

    p_j = softmax_j(A_j / alpha),   q_j = softmax_j(phi_j),
    penalty = sum_j w_j (p_j - q_j)^2 / max(sum_j w_j, 1),

a mean over *samples* (not over groups), where ``A_j`` is the GRPO advantage of response
``j`` (its token mean when advantages are per token), ``phi_j`` the token-mean log-probability
of response ``j`` under the current policy, and both softmaxes divide by ``sum + 1e-10`` as the
authors' do. With ``filter_zero_signal`` (the authors' ``grpo_dmpo_zero``, their launch
script's default) ``w_j = 0`` in groups whose advantages span at most 1e-5 (all pass or all
fail); without it (``grpo_dmpo``) ``w_j = 1``. The training loss is
``L_GRPO + lambda * penalty`` (paper: ``lambda = 2``, ``alpha = 1/15``). Gradients flow through
``phi`` only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nemo_mmpo.errors import MMPOInputError

PAPER_TEMPERATURE = 1.0 / 15.0
PAPER_COEFFICIENT = 2.0
SOFTMAX_EPSILON = 1e-10  # the authors' denominator guard
ZERO_SIGNAL_SPREAD = 1e-5  # a group whose advantages span no more than this has no signal


def group_softmax(
    logits: torch.Tensor, group_index: torch.Tensor, num_groups: int, valid: torch.Tensor
) -> torch.Tensor:
    """``exp(x - group max) / (group sum + 1e-10)`` within each group; 0 where not valid.

    Args:
        logits: ``[N]``.
        group_index: ``[N]`` group of each entry, in ``[0, num_groups)``.
        valid: ``[N]`` bool; invalid entries take no part.
    """
    masked = torch.where(valid, logits, torch.full_like(logits, -torch.inf))
    group_max = torch.full((num_groups,), -torch.inf, dtype=logits.dtype, device=logits.device)
    group_max = group_max.scatter_reduce(0, group_index, masked.detach(), reduce="amax")
    shifted = masked - group_max[group_index].nan_to_num(0.0, neginf=0.0)
    exponentials = torch.where(valid, shifted.exp(), torch.zeros_like(shifted))
    totals = torch.zeros(num_groups, dtype=logits.dtype, device=logits.device)
    totals = totals.index_add(0, group_index, exponentials)
    return exponentials / (totals[group_index] + SOFTMAX_EPSILON)


def signal_weights(
    advantages: torch.Tensor, group_index: torch.Tensor, num_groups: int, valid: torch.Tensor
) -> torch.Tensor:
    """``[N]`` 1.0 for valid responses of groups whose advantages span more than 1e-5."""
    low = torch.full((num_groups,), torch.inf, dtype=advantages.dtype, device=advantages.device)
    high = torch.full_like(low, -torch.inf)
    low = low.scatter_reduce(0, group_index, advantages.masked_fill(~valid, torch.inf), "amin")
    high = high.scatter_reduce(0, group_index, advantages.masked_fill(~valid, -torch.inf), "amax")
    has_signal = (high - low) > ZERO_SIGNAL_SPREAD
    return (has_signal[group_index] & valid).to(advantages.dtype)


def _checked_inputs(
    advantages: torch.Tensor,
    mean_token_logprobs: torch.Tensor,
    group_ids: torch.Tensor,
    temperature: float,
    valid_mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    if not temperature > 0:
        raise MMPOInputError(f"DMPO temperature alpha must be > 0 (paper: 1/15); got {temperature}")
    if advantages.shape != mean_token_logprobs.shape or advantages.shape != group_ids.shape:
        raise MMPOInputError(
            f"advantages {tuple(advantages.shape)}, mean_token_logprobs "
            f"{tuple(mean_token_logprobs.shape)} and group_ids {tuple(group_ids.shape)} must all "
            "be [num_responses]"
        )
    if advantages.numel() == 0:
        raise MMPOInputError("empty batch: no responses to compute the DMPO penalty on")
    valid = (
        torch.ones_like(advantages, dtype=torch.bool) if valid_mask is None else valid_mask.bool()
    )
    group_index = torch.unique(group_ids, return_inverse=True)[1]
    return valid, group_index, int(group_index.max().item()) + 1


@dataclass(frozen=True)
class PenaltyTerms:
    """The penalty's per-response parts (all ``[num_responses]``).

    ``shares`` sum to the penalty (``w_j (p_j - q_j)^2 / W``) and carry the gradient through
    the policy log-probabilities; ``target`` is ``p``, ``policy`` is ``q``, ``weights`` is
    ``w`` (1.0 for responses the mean counts).
    """

    shares: torch.Tensor
    target: torch.Tensor
    policy: torch.Tensor
    weights: torch.Tensor
    group_index: torch.Tensor
    num_groups: int


def penalty_terms(
    advantages: torch.Tensor,
    mean_token_logprobs: torch.Tensor,
    group_ids: torch.Tensor,
    temperature: float = PAPER_TEMPERATURE,
    valid_mask: torch.Tensor | None = None,
    *,
    filter_zero_signal: bool = True,
) -> PenaltyTerms:
    """The penalty split by response; arguments as :func:`distribution_matching_penalty`."""
    valid, group_index, num_groups = _checked_inputs(
        advantages, mean_token_logprobs, group_ids, temperature, valid_mask
    )
    dtype = mean_token_logprobs.dtype
    advantages = advantages.detach().to(dtype)
    with torch.no_grad():
        target = group_softmax(advantages / temperature, group_index, num_groups, valid)
        if filter_zero_signal:
            weights = signal_weights(advantages, group_index, num_groups, valid)
        else:
            weights = valid.to(dtype)
    policy = group_softmax(mean_token_logprobs, group_index, num_groups, valid)
    squared = torch.where(valid, (target - policy).square(), torch.zeros_like(policy))
    shares = squared * weights / weights.sum().clamp(min=1.0)
    return PenaltyTerms(shares, target, policy, weights, group_index, num_groups)


def distribution_matching_penalty(
    advantages: torch.Tensor,
    mean_token_logprobs: torch.Tensor,
    group_ids: torch.Tensor,
    temperature: float = PAPER_TEMPERATURE,
    valid_mask: torch.Tensor | None = None,
    *,
    filter_zero_signal: bool = True,
) -> torch.Tensor:
    """DMPO's penalty ``sum_j w_j (p_j - q_j)^2 / max(sum_j w_j, 1)`` (a differentiable scalar).

    Args:
        advantages: ``[N]`` GRPO advantage of each response (the token mean when per token).
        mean_token_logprobs: ``[N]`` token-mean log-probability of each response under the
            current policy (carries the gradient).
        group_ids: ``[N]`` integer prompt-group ids; groups may differ in size and order.
        temperature: ``alpha`` of the advantage softmax (> 0; paper 1/15).
        valid_mask: ``[N]`` bool; invalid responses take no part in softmaxes or the mean.
        filter_zero_signal: leave out groups without signal (the authors' ``grpo_dmpo_zero``,
            default); False keeps them (``grpo_dmpo``).

    Returns:
        The penalty; 0 (with a zero gradient) when no response is left.
    """
    terms = penalty_terms(
        advantages,
        mean_token_logprobs,
        group_ids,
        temperature,
        valid_mask,
        filter_zero_signal=filter_zero_signal,
    )
    return terms.shares.sum()


@dataclass(frozen=True)
class LinearizedPenalty:
    """The penalty at the rollout policy, as per-response constants (all ``[num_responses]``).

    With ``phi_j`` the token-mean log-probability, the term
    ``sum_j share_j + gradient_j * (phi_j - phi_j_at_rollout)`` has the penalty's value and
    gradient at the rollout policy, and each response's part needs only its own tokens, so it
    can be summed over any split of the batch (micro-batches, data-parallel ranks, packed
    sequences). ``metrics`` are the step's diagnostics (see :func:`linearized_penalty`).
    """

    shares: torch.Tensor
    gradient: torch.Tensor
    metrics: dict[str, float]


def linearized_penalty(
    advantages: torch.Tensor,
    mean_token_logprobs: torch.Tensor,
    group_ids: torch.Tensor,
    temperature: float = PAPER_TEMPERATURE,
    valid_mask: torch.Tensor | None = None,
    *,
    filter_zero_signal: bool = True,
) -> LinearizedPenalty:
    """Per-response value and gradient of the penalty at ``mean_token_logprobs``.

    ``gradient_j = d penalty / d phi_j`` (by autograd through :func:`penalty_terms`, so it is
    the authors' gradient by construction), computed in float64.

    Metrics (means over the groups the penalty counts): ``penalty``, ``target_policy_kl``
    (``KL(p || q)``), ``total_variation`` (``0.5 sum |p - q|``), ``counted_fraction`` (share of
    valid responses the mean counts), ``counted_groups``.
    """
    phi = mean_token_logprobs.detach().to(torch.float64).requires_grad_(True)
    with torch.enable_grad():
        terms = penalty_terms(
            advantages.detach().to(torch.float64),
            phi,
            group_ids,
            temperature,
            valid_mask,
            filter_zero_signal=filter_zero_signal,
        )
        penalty = terms.shares.sum()
        (gradient,) = torch.autograd.grad(penalty, phi)
    shares = terms.shares.detach()
    policy = terms.policy.detach()
    target, weights, index = terms.target, terms.weights, terms.group_index
    kl_parts = torch.special.xlogy(target, target) - torch.special.xlogy(target, policy)
    per_group = torch.zeros((3, terms.num_groups), dtype=torch.float64, device=phi.device)
    per_group[0].index_add_(0, index, kl_parts * weights)
    per_group[1].index_add_(0, index, 0.5 * (target - policy).abs() * weights)
    per_group[2].index_add_(0, index, weights)
    counted = per_group[2] > 0
    num_counted = int(counted.sum())
    valid_count = float(len(weights) if valid_mask is None else valid_mask.bool().sum())
    metrics = {
        "penalty": float(penalty.detach()),
        "target_policy_kl": float(per_group[0][counted].sum()) / max(num_counted, 1),
        "total_variation": float(per_group[1][counted].sum()) / max(num_counted, 1),
        "counted_fraction": float(weights.sum()) / max(valid_count, 1.0),
        "counted_groups": float(num_counted),
    }
    return LinearizedPenalty(shares, gradient, metrics)
