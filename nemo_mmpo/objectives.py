"""Moment objectives of the failure rate F, stored as coefficient sequences.

An objective is ``J = sum_{k=1..T} a_k E[F^k]`` where ``F = 1 - s(X)`` is the failure
probability of a random problem. The paper (*Beyond the Mean: Multi-Moment Policy
Optimization for LLM Reasoning*) writes MMPO as ``a_k = 1`` (Eq. mmpo_objective), MaxRL as
``a_k = 1/k``, pass@K training as the single moment ``a_K = 1`` and REINFORCE/GRPO as
``a_1 = 1`` (Table 1). Its generalised transform optimises the moments of ``U F`` for a
[0, 1]-valued ``U`` independent of ``F``, i.e. ``a_k = E[U^k]`` (Theorem 1 and after).

Differentiating ``J`` gives ``-grad J = E[w(f) grad s]`` with the per-problem weight
``w(f) = sum_k k a_k f^(k-1)`` (Eq. mmpo_weight for ``a_k = 1``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from nemo_mmpo.errors import MMPOInputError

OBJECTIVE_KINDS = ("mmpo", "maxrl", "pass_at_k", "reinforce", "explicit")
TRANSFORMS = ("none", "constant", "beta")
#: the objective kind a transform applies to (moments of U F, a_k = E[U^k])
TRANSFORM_KIND = OBJECTIVE_KINDS[0]
#: The parameters of :func:`moment_objective` each transform reads.
TRANSFORM_PARAMETERS = {"none": (), "constant": ("constant",), "beta": ("alpha", "beta")}


@dataclass(frozen=True)
class MomentObjective:
    """``J = sum_{k=1..T} a_k E[F^k]``; ``coefficients[k-1]`` holds ``a_k``."""

    coefficients: tuple[float, ...]
    name: str = "explicit"

    def __post_init__(self) -> None:
        coefficients = tuple(float(value) for value in self.coefficients)
        if not coefficients:
            raise MMPOInputError(
                "a moment objective needs at least one coefficient (truncation order T >= 1); "
                "got an empty list"
            )
        for order, value in enumerate(coefficients, start=1):
            if not math.isfinite(value):
                raise MMPOInputError(
                    f"moment coefficient a_{order} = {value} is not finite; give finite numbers"
                )
        object.__setattr__(self, "coefficients", coefficients)

    @property
    def truncation_order(self) -> int:
        """T: the highest moment order that carries a coefficient."""
        return len(self.coefficients)

    def weight_coefficients(self) -> tuple[float, ...]:
        """``k a_k`` for k = 1..T: coefficients of ``f^(k-1)`` in the weight ``w(f)``."""
        return tuple(order * value for order, value in enumerate(self.coefficients, start=1))

    def weight(self, failure_rate: torch.Tensor) -> torch.Tensor:
        """``w(f) = sum_k k a_k f^(k-1)``, elementwise (Horner's rule), same shape as input."""
        failure_rate = torch.as_tensor(failure_rate)
        result = torch.zeros_like(failure_rate)
        for coefficient in reversed(self.weight_coefficients()):
            result = result * failure_rate + coefficient
        return result

    def value(self, failure_rate: torch.Tensor) -> torch.Tensor:
        """``sum_k a_k f^k``, elementwise: the objective's per-problem contribution."""
        failure_rate = torch.as_tensor(failure_rate)
        result = torch.zeros_like(failure_rate)
        for coefficient in reversed(self.coefficients):
            result = (result + coefficient) * failure_rate
        return result


def _check_truncation_order(truncation_order: int | None, kind: str) -> int:
    if truncation_order is None or isinstance(truncation_order, bool):
        raise MMPOInputError(
            f"objective {kind!r} needs an integer truncation_order >= 1; got {truncation_order!r}"
        )
    if int(truncation_order) != truncation_order or truncation_order < 1:
        raise MMPOInputError(
            f"truncation_order must be an integer >= 1 (the paper's default is 4); "
            f"got {truncation_order!r}"
        )
    return int(truncation_order)


def beta_moments(alpha: float, beta: float, truncation_order: int) -> tuple[float, ...]:
    """``E[U^k] = prod_{j<k} (alpha+j)/(alpha+beta+j)`` for ``U ~ Beta(alpha, beta)``, k = 1..T."""
    if not (alpha > 0 and beta > 0 and math.isfinite(alpha) and math.isfinite(beta)):
        raise MMPOInputError(
            f"Beta(alpha, beta) needs alpha > 0 and beta > 0; got alpha={alpha!r}, beta={beta!r}"
        )
    moments = []
    moment = 1.0
    for j in range(truncation_order):
        moment *= (alpha + j) / (alpha + beta + j)
        moments.append(moment)
    return tuple(moments)


def moment_objective(
    kind: str = "mmpo",
    truncation_order: int | None = 4,
    *,
    transform: str = "none",
    constant: float | None = None,
    alpha: float | None = None,
    beta: float | None = None,
    k: int | None = None,
    coefficients: Sequence[float] | None = None,
) -> MomentObjective:
    """Build a moment objective.

    Args:
        kind: ``"mmpo"`` (a_k = 1, or E[U^k] with a transform), ``"maxrl"`` (a_k = 1/k),
            ``"pass_at_k"`` (only a_K = 1, needs ``k``), ``"reinforce"`` (only a_1 = 1; GRPO's
            objective) or ``"explicit"`` (``coefficients`` as given).
        truncation_order: T for ``mmpo`` and ``maxrl``; ignored by the other kinds.
        transform: for ``mmpo`` only: ``"none"`` (U = 1), ``"constant"`` (U = ``constant`` in
            (0, 1], a_k = c^k) or ``"beta"`` (U ~ Beta(``alpha``, ``beta``); ``beta=1`` with a
            small ``alpha`` = lambda approaches MaxRL up to scale).
        k: K for ``pass_at_k``.
        coefficients: a_1..a_T for ``explicit``.

    Returns:
        A :class:`MomentObjective`.
    """
    if kind not in OBJECTIVE_KINDS:
        raise MMPOInputError(f"unknown objective kind {kind!r}; choose one of {OBJECTIVE_KINDS}")
    if transform not in TRANSFORMS:
        raise MMPOInputError(f"unknown moment transform {transform!r}; choose one of {TRANSFORMS}")
    if transform != "none" and kind != "mmpo":
        raise MMPOInputError(
            f"transform={transform!r} applies to kind='mmpo' only (it replaces a_k = 1 by "
            f"E[U^k]); got kind={kind!r}. Use kind='mmpo' or transform='none'"
        )

    if kind == "explicit":
        if coefficients is None:
            raise MMPOInputError("kind='explicit' needs coefficients=[a_1, ..., a_T]")
        return MomentObjective(tuple(coefficients), name="explicit")
    if kind == "reinforce":
        return MomentObjective((1.0,), name="reinforce")
    if kind == "pass_at_k":
        if k is None or isinstance(k, bool) or int(k) != k or k < 1:
            raise MMPOInputError(f"kind='pass_at_k' needs an integer k >= 1 (paper: 3); got {k!r}")
        return MomentObjective((0.0,) * (int(k) - 1) + (1.0,), name=f"pass_at_{int(k)}")

    order = _check_truncation_order(truncation_order, kind)
    if kind == "maxrl":
        return MomentObjective(tuple(1.0 / j for j in range(1, order + 1)), name=f"maxrl_T{order}")

    # kind == "mmpo"
    if transform == "none":
        return MomentObjective((1.0,) * order, name=f"mmpo_T{order}")
    if transform == "constant":
        if constant is None or not (0.0 < constant <= 1.0):
            raise MMPOInputError(
                f"transform='constant' needs constant in (0, 1] (U = c, a_k = c^k); "
                f"got constant={constant!r}"
            )
        return MomentObjective(
            tuple(constant**j for j in range(1, order + 1)), name=f"mmpo_T{order}_U{constant:g}"
        )
    if alpha is None or beta is None:
        raise MMPOInputError(
            f"transform='beta' needs both alpha and beta (U ~ Beta(alpha, beta)); "
            f"got alpha={alpha!r}, beta={beta!r}"
        )
    return MomentObjective(
        beta_moments(float(alpha), float(beta), order),
        name=f"mmpo_T{order}_beta{alpha:g}_{beta:g}",
    )
