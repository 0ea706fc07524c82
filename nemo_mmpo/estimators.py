"""Advantage estimators: the registry, the public entry points and the MMPO estimators.

Each estimator is one function ``fn(groups, objective, **options) -> [N] float64`` registered
with :func:`register_estimator`; the baselines of the paper live in
:mod:`nemo_mmpo.baselines`. Adding an estimator is one decorated function.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from nemo_mmpo.combinatorics import failure_subset_probabilities
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.grouping import RewardGroups
from nemo_mmpo.objectives import MomentObjective, moment_objective


class Estimator(Protocol):
    def __call__(
        self, groups: RewardGroups, objective: MomentObjective, **options: object
    ) -> torch.Tensor: ...


@dataclass(frozen=True)
class GroupSizeNeed:
    """The smallest group size an estimator needs for one objective and set of options.

    ``requirement`` says it in words (``"k=5 <= group size G"``) and ``remedy`` how to meet it;
    the runtime check (:func:`check_group_sizes`) and ``--dry-run`` both print them.
    """

    minimum: int
    requirement: str
    remedy: str


#: ``(objective, options with defaults filled in) -> GroupSizeNeed``, declared at registration.
GroupSizeRule = Callable[[MomentObjective, dict[str, Any]], GroupSizeNeed]


@dataclass(frozen=True)
class RegisteredEstimator:
    """One registry entry: the checked function, its objective kind and group-size rule."""

    function: Estimator
    objective: str
    group_size: GroupSizeRule | None
    defaults: dict[str, Any]  # the options' defaults, read once (the check runs every call)


_REGISTRY: dict[str, RegisteredEstimator] = {}


def register_estimator(
    name: str, objective: str = "mmpo", *, group_size: GroupSizeRule | None = None
) -> Callable[[Estimator], Estimator]:
    """Decorator: make ``fn(groups, objective, **options) -> [N]`` available as ``name``.

    ``objective`` is the kind of :func:`~nemo_mmpo.objectives.moment_objective` the estimator
    targets (``"mmpo"`` for the moment estimators, ``"pass_at_k"``, ``"maxrl"``,
    ``"reinforce"``); integrations such as the NeMo-RL adapter build it from their config.
    The function's keyword parameters after ``objective`` are its options. ``group_size``
    declares the smallest group it needs (:class:`GroupSizeNeed`), once: the returned function
    checks every call against it, and ``--dry-run`` checks the recipe's group size with it.
    """

    def decorate(function: Estimator) -> Estimator:
        if name in _REGISTRY and _REGISTRY[name].function.__wrapped__ is not function:
            raise MMPOInputError(f"an estimator named {name!r} is already registered")

        @functools.wraps(function)
        def checked(groups: RewardGroups, objective: MomentObjective, **options: Any):
            need = group_size_need(name, objective, options)
            if need is not None:
                check_group_sizes(groups, need, name)
            return function(groups, objective, **options)

        defaults = {parameter.name: parameter.default for parameter in _options(function)}
        _REGISTRY[name] = RegisteredEstimator(checked, objective, group_size, defaults)
        return checked

    return decorate


def estimator_objective_kind(name: str) -> str:
    """The objective kind ``name`` was registered with (see :func:`register_estimator`)."""
    return _entry(name).objective


@dataclass(frozen=True)
class EstimatorOption:
    """One keyword option of a registered estimator: its default and its annotation."""

    default: Any
    annotation: Any  # e.g. ``int | None``


def estimator_options(name: str) -> dict[str, EstimatorOption]:
    """``{option: EstimatorOption}`` of the registered estimator ``name``, from its signature."""
    function = _entry(name).function
    hints = typing.get_type_hints(function)
    return {
        parameter.name: EstimatorOption(parameter.default, hints[parameter.name])
        for parameter in _options(function)
    }


def _options(function: Estimator) -> list[inspect.Parameter]:
    """An estimator's options: the parameters after ``(groups, objective)`` that a keyword
    can set."""
    parameters = list(inspect.signature(function).parameters.values())[2:]
    keyword = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [parameter for parameter in parameters if parameter.kind in keyword]


def group_size_need(
    name: str, objective: MomentObjective, options: dict[str, Any]
) -> GroupSizeNeed | None:
    """What ``name`` declared it needs of the group size for ``objective`` and ``options``
    (missing options take their defaults); None when it declared nothing."""
    entry = _entry(name)
    if entry.group_size is None:
        return None
    return entry.group_size(objective, {**entry.defaults, **options})


def _entry(name: str) -> RegisteredEstimator:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise MMPOInputError(
            f"unknown estimator {name!r}; available: {', '.join(available_estimators())}"
        ) from None


def get_estimator(name: str) -> Estimator:
    """The registered estimator ``name`` (checking its declared group-size need on each call)."""
    return _entry(name).function


def available_estimators() -> list[str]:
    """Names of all registered estimators, sorted."""
    return sorted(_REGISTRY)


def _output_dtype(rewards: torch.Tensor) -> torch.dtype:
    return rewards.dtype if rewards.is_floating_point() else torch.get_default_dtype()


def compute_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    objective: MomentObjective | None = None,
    estimator: str = "plugin",
    valid_mask: torch.Tensor | None = None,
    *,
    reward_threshold: float | None = None,
    **options: object,
) -> torch.Tensor:
    """Per-rollout advantages for binary rewards grouped by prompt.

    Args:
        rewards: ``[num_rollouts]`` verifier rewards in {0, 1} (bool, int or float).
        group_ids: ``[num_rollouts]`` integer prompt-group id of each rollout; groups may
            have different sizes.
        objective: the moment objective (default: MMPO with T = 4). Baselines that are not
            moment estimators ignore it.
        estimator: a registered name (see :func:`available_estimators`).
        valid_mask: ``[num_rollouts]`` bool; invalid rollouts take no part in their group's
            statistics and get advantage 0.
        reward_threshold: if given, ``reward >= reward_threshold`` counts as success.
        **options: estimator options (e.g. ``k=3`` for ``passk_chen``).

    Returns:
        ``[num_rollouts]`` advantages in the rewards' floating dtype (float32 for int/bool),
        computed in float64 on the rewards' device.
    """
    rewards = torch.as_tensor(rewards)
    function = get_estimator(estimator)  # an unknown name fails before any work
    groups = RewardGroups.from_flat(rewards, group_ids, valid_mask, reward_threshold)
    advantages = advantages_for_groups(groups, objective, function, **options)
    return advantages.to(_output_dtype(rewards))


def advantages_for_groups(
    groups: RewardGroups,
    objective: MomentObjective | None,
    estimator: str | Estimator,
    **options: object,
) -> torch.Tensor:
    """``[N]`` float64 advantages of already-validated groups; 0 for invalid rollouts."""
    function = get_estimator(estimator) if isinstance(estimator, str) else estimator
    objective = moment_objective("mmpo", 4) if objective is None else objective
    advantages = function(groups, objective, **options)
    return torch.where(groups.valid, advantages, torch.zeros_like(advantages))


def mmpo_advantages(
    rewards: torch.Tensor,
    truncation_order: int = 4,
    estimator: str = "plugin",
    *,
    objective: MomentObjective | None = None,
    reward_threshold: float | None = None,
    **options: object,
) -> torch.Tensor:
    """Dense fast path: ``[num_prompts, group_size]`` rewards -> advantages of the same shape.

    Uses MMPO with ``truncation_order`` unless ``objective`` is given.
    """
    rewards = torch.as_tensor(rewards)
    groups = RewardGroups.from_dense(rewards, reward_threshold)
    if objective is None:
        objective = moment_objective("mmpo", truncation_order)
    advantages = get_estimator(estimator)(groups, objective, **options)
    return advantages.reshape(rewards.shape).to(_output_dtype(rewards))


def check_group_sizes(groups: RewardGroups, need: GroupSizeNeed, estimator: str) -> None:
    """Raise if any group with a valid rollout has fewer than ``need.minimum`` of them."""
    present = groups.group_size > 0
    too_small = present & (groups.group_size < need.minimum)
    if bool(too_small.any()):
        smallest = int(groups.group_size[too_small].min().item())
        count = int(too_small.sum().item())
        raise MMPOInputError(
            f"estimator {estimator!r} needs {need.requirement}, but {count} group(s) have only "
            f"{smallest} valid rollout(s): {need.remedy}"
        )


def _unbiased_group_size(objective: MomentObjective, options: dict[str, Any]) -> GroupSizeNeed:
    order = objective.truncation_order
    return GroupSizeNeed(
        minimum=max(2, order),
        requirement=(
            f"at least 2 rollouts per group and truncation_order T={order} <= group size G "
            "(2 <= G and T <= G)"
        ),
        remedy="raise the group size (num_generations_per_prompt), lower truncation_order, "
        "or use estimator 'plugin'",
    )


@register_estimator("plugin")
def plugin(groups: RewardGroups, objective: MomentObjective) -> torch.Tensor:
    """The paper's biased plug-in advantage (Eq. biased_advantage, its default).

    ``A_ij = w(1 - s_hat_i) (r_ij - s_hat_i)`` with ``s_hat_i`` the group's mean reward and
    ``w(f) = sum_k k a_k f^(k-1)``. With T = 1 it is the mean-baseline REINFORCE/GRPO
    advantage without std normalisation.
    """
    success_rate = groups.success_rate
    weight = objective.weight(1.0 - success_rate)
    return groups.gather(weight) * (groups.rewards - groups.gather(success_rate))


@register_estimator("unbiased", group_size=_unbiased_group_size)
def unbiased(groups: RewardGroups, objective: MomentObjective) -> torch.Tensor:
    """The paper's unbiased leave-one-out advantage (Eq. unbiased_advantage, Appendix A).

    With ``M_-j`` the failures among the other ``G - 1`` rollouts of the group,
    ``A_j = [sum_k k a_k C(M_-j, k-1) / C(G-1, k-1)] (r_j - 1 + M_-j / (G-1))``.
    ``C(M, m)/C(G-1, m)`` is unbiased for ``f^m`` and independent of ``r_j``, so the expected
    score-weighted advantage is exactly ``w(f) ds/dtheta``. Needs ``2 <= T <= G`` in every group.
    """
    order = objective.truncation_order
    others = (groups.gather(groups.group_size) - 1.0).clamp(min=1.0)
    failures_of_others = groups.gather(groups.failure_count) - (1.0 - groups.rewards)
    failures_of_others = failures_of_others.clamp(min=0.0)
    ratios = failure_subset_probabilities(failures_of_others, others, order - 1)
    weight_coefficients = torch.tensor(
        objective.weight_coefficients(), dtype=torch.float64, device=ratios.device
    )
    coefficient = ratios @ weight_coefficients
    return coefficient * (groups.rewards - 1.0 + failures_of_others / others)
