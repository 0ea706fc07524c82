"""An empirical-Bayes plug-in estimator of the MMPO weight (beyond the paper).

The paper attributes MMPO's drop at larger T to noisy high-order moment estimates: the
plug-in weight ``w(1 - s_hat)`` of a group of G rollouts swings between 1 and T(T+1)/2.
Here the weight is shrunk towards the batch: a Beta(alpha, beta) prior on the success rate is
fitted across the batch's groups by the beta-binomial method of moments, and each group
uses the posterior mean of its weight,

    E[w(F) | c successes of n] = sum_k k a_k E[F^(k-1)],
    F | data ~ Beta(beta + n - c, alpha + c),  E[F^m] = prod_{j<m} (b + j) / (a + b + j),

a closed form in Beta functions. The baseline stays the group mean, as in ``plugin``.
"""

from __future__ import annotations

import torch

from nemo_mmpo.estimators import register_estimator
from nemo_mmpo.grouping import RewardGroups
from nemo_mmpo.objectives import MomentObjective

_SMALL = 1e-3


def fit_beta_prior(groups: RewardGroups) -> tuple[torch.Tensor, torch.Tensor]:
    """Beta-binomial method-of-moments prior ``(alpha, beta)`` from the groups' success rates."""
    present = groups.group_size > 0
    size = groups.group_size[present]
    rate = groups.success_count[present] / size
    mean = rate.mean().clamp(_SMALL, 1 - _SMALL)
    variance = rate.var(unbiased=False) if rate.numel() > 1 else torch.zeros_like(mean)
    typical_size = size.mean()
    # Var(s_hat) = m (1 - m) [1 + (n - 1) rho] / n with rho = 1 / (alpha + beta + 1)
    rho = (typical_size * variance / (mean * (1 - mean)) - 1) / (typical_size - 1).clamp(min=1)
    rho = rho.clamp(_SMALL, 1 - _SMALL)
    concentration = 1.0 / rho - 1.0
    return mean * concentration, (1 - mean) * concentration


def posterior_weight(
    objective: MomentObjective, failure_shape: torch.Tensor, success_shape: torch.Tensor
) -> torch.Tensor:
    """``E[w(F)]`` for ``F ~ Beta(failure_shape, success_shape)`` elementwise."""
    total = failure_shape + success_shape
    moment = torch.ones_like(failure_shape)  # E[F^0]
    weight = torch.zeros_like(failure_shape)
    for power, coefficient in enumerate(objective.weight_coefficients()):
        if power > 0:
            moment = moment * (failure_shape + power - 1) / (total + power - 1)
        weight = weight + coefficient * moment
    return weight


@register_estimator("empirical_bayes", family="mmpo")
def empirical_bayes(groups: RewardGroups, objective: MomentObjective) -> torch.Tensor:
    """Plug-in advantage with the weight replaced by its empirical-Bayes posterior mean."""
    alpha, beta = fit_beta_prior(groups)
    failure_shape = beta + groups.failure_count
    success_shape = alpha + groups.success_count
    weight = posterior_weight(objective, failure_shape, success_shape)
    success_rate = groups.success_rate
    return groups.gather(weight) * (groups.rewards - groups.gather(success_rate))
