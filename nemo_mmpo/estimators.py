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
from nemo_mmpo.plugins import load_from_environment
from nemo_mmpo.registry import (
    NEMO_RL_ESTIMATORS,
    caller_module,
    check_name,
    refuse_if_frozen,
    registered_by,
)


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
    """One registry entry.

    ``function``: the checked function of reward groups (None for a class entry);
    ``estimator_class``: a class with NeMo-RL's ``compute_advantage`` protocol, built by the
    NeMo-RL adapter from ``(estimator_config, loss_config)`` (None for a function entry);
    ``objective``: the moment-objective kind it targets; ``family``: the ``grpo.adv_estimator``
    name that selects it with ``estimator: <its name>`` (None: selected by its own name);
    ``group_size``: its declared group-size need; ``options``: its keyword options;
    ``registered_by``: the module that registered it (named in refusals).
    """

    function: Estimator | None
    estimator_class: type | None
    objective: str
    family: str | None
    group_size: GroupSizeRule | None
    defaults: dict[str, Any]  # the options' defaults, read once (the check runs every call)
    options: dict[str, EstimatorOption]
    registered_by: str
    source: Any  # the object registered (a re-import registering it again is no conflict)


@dataclass(frozen=True)
class EstimatorOption:
    """One keyword option of a registered estimator: its default and its annotation."""

    default: Any
    annotation: Any  # e.g. ``int | None``


_REGISTRY: dict[str, RegisteredEstimator] = {}


def register_estimator(
    name: str,
    estimator: Any = None,
    *,
    objective: str = "mmpo",
    family: str | None = None,
    group_size: GroupSizeRule | None = None,
    options: dict[str, Any] | None = None,
    nemo_rl_formula: bool = False,
) -> Any:
    """Make an estimator available as ``name``; a decorator when ``estimator`` is omitted.

    ``estimator`` is either a function ``fn(groups, objective, **options) -> [N]`` (its keyword
    parameters after ``objective`` are its options, typed by their annotations) or a class with
    NeMo-RL's protocol (``__init__(estimator_config, loss_config)``, ``compute_advantage(
    prompt_ids, rewards, mask, **kwargs) -> [batch, seq_len]``; its options, the keys it reads
    from ``grpo.adv_estimator``, given as ``options={key: default}``).

    ``objective`` is the kind of :func:`~nemo_mmpo.objectives.moment_objective` it targets
    (``"mmpo"``, ``"pass_at_k"``, ``"maxrl"``, ``"reinforce"``). A recipe selects it with
    ``grpo.adv_estimator.name: <name>``, or, with ``family``, ``name: <family>, estimator:
    <name>`` (the family's first entry is its default). ``group_size`` declares the smallest
    group it needs (:class:`GroupSizeNeed`): checked at every call and by ``--dry-run``.
    ``nemo_rl_formula``: a family member that computes NeMo-RL's estimator of the same name
    may take that name (it is reached only through its family).

    Refused in one line naming the registering module: NeMo-RL's names, a name taken by another
    object or a near miss of one, an option another entry defines differently, a class without
    ``compute_advantage``, and any registration after ``nemo_mmpo.nemo_rl.install()``.
    """
    if estimator is None:
        return lambda function: register_estimator(
            name,
            function,
            objective=objective,
            family=family,
            group_size=group_size,
            options=options,
            nemo_rl_formula=nemo_rl_formula,
        )
    existing = _REGISTRY.get(name)
    if existing is not None and _same_source(existing.source, estimator):
        return existing.function or estimator  # the same module imported again
    refuse_if_frozen("estimator", name)
    origin = getattr(estimator, "__module__", None) or caller_module()
    taken = {key: entry.registered_by for key, entry in _REGISTRY.items()}
    taken.update({key: "an estimator family" for key in estimator_families()})
    reserved = () if (nemo_rl_formula and family) else NEMO_RL_ESTIMATORS
    check_name("estimator", name, taken, reserved)
    if existing is not None:
        raise MMPOInputError(
            f"register_estimator({name!r}) from {origin}: {name!r} is already registered by "
            f"{existing.registered_by}; choose another name"
        )
    if family is not None and family not in estimator_families():
        check_name("estimator", family, taken, NEMO_RL_ESTIMATORS)
    if inspect.isclass(estimator):
        if not callable(getattr(estimator, "compute_advantage", None)):
            raise MMPOInputError(
                f"register_estimator({name!r}, {estimator.__qualname__}) from {origin}: a class "
                "estimator has NeMo-RL's compute_advantage(prompt_ids, rewards, mask, **kwargs) "
                "method; register a function fn(groups, objective, **options) otherwise"
            )
        declared = {
            key: EstimatorOption(default, Any if default is None else type(default))
            for key, default in (options or {}).items()
        }
        function = None
    else:
        if not callable(estimator):
            raise MMPOInputError(
                f"register_estimator({name!r}) from {origin}: {estimator!r} is neither a "
                "function of reward groups nor a class with compute_advantage"
            )
        declared = _function_options(estimator)
        function = _checked_function(name, estimator, origin)
    _refuse_option_conflicts(name, origin, declared)
    _REGISTRY[name] = RegisteredEstimator(
        function=function,
        estimator_class=estimator if function is None else None,
        objective=objective,
        family=family,
        group_size=group_size,
        defaults={key: option.default for key, option in declared.items()},
        options=declared,
        registered_by=origin,
        source=estimator,
    )
    return function or estimator


def _same_source(registered: Any, new: Any) -> bool:
    """The same object, or the same definition imported again (a module imported under two
    names, a plug-in re-imported in a worker)."""
    if registered is new:
        return True
    return registered_by(registered) == registered_by(new) and getattr(
        registered, "__code__", None
    ) == getattr(new, "__code__", None)


def _checked_function(name: str, function: Estimator, origin: str) -> Estimator:
    @functools.wraps(function)
    def checked(groups: RewardGroups, objective: MomentObjective, **options: Any):
        need = group_size_need(name, objective, options)
        if need is not None:
            check_group_sizes(groups, need, name)
        result = function(groups, objective, **options)
        problem = advantage_problem(result, groups.rewards.shape, groups.valid)
        if problem is not None:
            raise MMPOInputError(
                f"estimator {name!r} (registered by {origin}) {problem}; an estimator returns "
                "[num_rollouts] floating advantages, finite for every rollout (masked ones "
                "too), without a gradient"
            )
        return result

    return checked


def advantage_problem(
    result: Any, shape: torch.Size | tuple[int, ...], valid: torch.Tensor | None = None
) -> str | None:
    """What is wrong with an estimator's output for inputs of ``shape`` (its rows' validity
    ``valid``, where known): not a tensor, another shape, not floating, a gradient, a NaN or
    an infinity anywhere; None when nothing is."""
    if not isinstance(result, torch.Tensor):
        return f"returned {type(result).__name__}, not a tensor"
    if tuple(result.shape) != tuple(shape):
        return f"returned shape {list(result.shape)} for inputs of shape {list(shape)}"
    if not result.is_floating_point():
        return f"returned {result.dtype}, not a floating dtype"
    if result.requires_grad:
        return "returned a tensor that requires grad (detach it: advantages are constants)"
    finite = torch.isfinite(result)
    if not bool(finite.all()):
        rows = (~finite).reshape(finite.shape[0], -1).any(dim=-1).nonzero().flatten()
        masked = ""
        if valid is not None and valid.shape[0] == finite.shape[0]:
            on_masked = int((~valid.reshape(valid.shape[0], -1).all(dim=-1))[rows].sum())
            masked = f" ({on_masked} of them masked)" if on_masked else ""
        return f"returned NaN or Inf in {rows.numel()} row(s){masked}, first row {int(rows[0])}"
    return None


def _function_options(function: Estimator) -> dict[str, EstimatorOption]:
    hints = typing.get_type_hints(function, include_extras=True)  # Annotated constraints kept
    return {
        parameter.name: EstimatorOption(parameter.default, hints.get(parameter.name, Any))
        for parameter in _options(function)
    }


def _refuse_option_conflicts(name: str, origin: str, declared: dict[str, EstimatorOption]):
    for key, option in declared.items():
        for other, entry in _REGISTRY.items():
            theirs = entry.options.get(key)
            if theirs is None or theirs == option:
                continue
            raise MMPOInputError(
                f"register_estimator({name!r}) from {origin}: option {key!r} (default "
                f"{option.default!r}, {_type_name(option.annotation)}) differs from the one of "
                f"estimator {other!r} (default {theirs.default!r}, "
                f"{_type_name(theirs.annotation)}, {entry.registered_by}): both read "
                f"grpo.adv_estimator.{key}; give yours another name or the same default and type"
            )


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation)


def estimator_families() -> list[str]:
    """The ``grpo.adv_estimator.name`` values that select a formula with ``estimator:``."""
    return list(dict.fromkeys(e.family for e in _REGISTRY.values() if e.family is not None))


def estimator_family(name: str) -> str | None:
    """The family ``name`` belongs to (None: selected by its own name)."""
    return _entry(name).family


def estimator_class(name: str) -> type | None:
    """The class of a class entry (NeMo-RL's protocol), None for a function entry."""
    return _entry(name).estimator_class


def estimator_registered_by(name: str) -> str:
    return _entry(name).registered_by


def estimator_objective_kind(name: str) -> str:
    """The objective kind ``name`` was registered with (see :func:`register_estimator`)."""
    return _entry(name).objective


def estimator_options(name: str) -> dict[str, EstimatorOption]:
    """``{option: EstimatorOption}`` of the registered estimator ``name``."""
    return dict(_entry(name).options)


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
    if name not in _REGISTRY:
        load_from_environment()  # a Ray worker or actor: the run's plug-ins first
    try:
        return _REGISTRY[name]
    except KeyError:
        raise MMPOInputError(
            f"unknown estimator {name!r}; available: {', '.join(available_estimators())}"
        ) from None


def get_estimator(name: str) -> Estimator:
    """The registered estimator ``name`` (checking its declared group-size need on each call)."""
    return _entry(name).function


def registration_order() -> list[str]:
    """Names of all registered estimators, in the order they were registered."""
    load_from_environment()
    return list(_REGISTRY)


def available_estimators() -> list[str]:
    """Names of all registered estimators, sorted."""
    load_from_environment()
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


@register_estimator("plugin", family="mmpo")
def plugin(groups: RewardGroups, objective: MomentObjective) -> torch.Tensor:
    """The paper's biased plug-in advantage (Eq. biased_advantage, its default).

    ``A_ij = w(1 - s_hat_i) (r_ij - s_hat_i)`` with ``s_hat_i`` the group's mean reward and
    ``w(f) = sum_k k a_k f^(k-1)``. With T = 1 it is the mean-baseline REINFORCE/GRPO
    advantage without std normalisation.
    """
    success_rate = groups.success_rate
    weight = objective.weight(1.0 - success_rate)
    return groups.gather(weight) * (groups.rewards - groups.gather(success_rate))


@register_estimator("unbiased", family="mmpo", group_size=_unbiased_group_size)
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
