"""NeMo-RL advantage estimator for MMPO and the paper's baselines.

Implements NeMo-RL's estimator contract (``nemo_rl/algorithms/advantage_estimator.py``):
constructed from ``(estimator_config, loss_config)``; ``compute_advantage(prompt_ids, rewards,
mask, **kwargs)`` returns token-level advantages ``[batch, seq_len]``; ``last_metrics`` holds
the step's diagnostics. The config is ``grpo.adv_estimator``: a plain mapping (NeMo-RL
v0.7.0's TypedDict) or a pydantic model with extra fields (NeMo-RL main).

Config keys (all shipped with defaults in ``examples/configs`` so Hydra overrides work):

- ``name``: ``mmpo``, or any estimator registered in :mod:`nemo_mmpo.estimators` whose name
  is not one of NeMo-RL's own (:data:`NEMO_RL_BUILTIN_ESTIMATORS`): ``passk_chen``, ``pkpo``,
  ``maxrl``, ``empirical_bayes``, ``plugin``, ``unbiased``. A new registered estimator is
  reachable without an edit here.
- ``estimator``: with ``name: mmpo``, any registered estimator (``plugin``, the paper's
  default; ``unbiased``; ``empirical_bayes``; ``grpo`` for ours with NeMo-RL's formula, ...)
- ``truncation_order`` (T, paper default 4); ``moment_transform``: ``none`` | ``constant`` |
  ``beta``, with ``transform_constant``, ``transform_alpha``, ``transform_beta`` (moments of
  U*F, a_k = E[U^k])
- the estimator's own options, by their parameter names (``k`` for ``passk_chen``/``pkpo``,
  paper 3; ``maclaurin_order`` for ``maxrl``; ``leave_one_out``/``normalize_std`` for ``grpo``)
- ``reward_threshold``: null (rewards must be 0/1) or a float (reward >= t is a success)

Keys that neither we nor NeMo-RL's estimators read are refused with the list of known keys.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from nemo_mmpo.diagnostics import group_statistics
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.estimators import (
    EstimatorOption,
    advantages_for_groups,
    available_estimators,
    estimator_objective_kind,
    estimator_options,
)
from nemo_mmpo.grouping import RewardGroups, group_ids_from_prompt_rows
from nemo_mmpo.objectives import MomentObjective, moment_objective

METRIC_PREFIX = "mmpo/"
MMPO_NAME = "mmpo"
#: ``grpo.adv_estimator.name`` values that NeMo-RL's ``_create_advantage_estimator`` builds
#: itself (v0.7.0 and main); ours never shadow them.
NEMO_RL_BUILTIN_ESTIMATORS = ("grpo", "gdpo", "opd", "reinforce_plus_plus")
#: Keys NeMo-RL's own estimators read (v0.7.0 and main); they may sit beside ours in a shared
#: config. The installed NeMo-RL's ``AdvEstimatorConfig`` fields are added when importable.
NEMO_RL_ESTIMATOR_KEYS = (
    "normalize_rewards",
    "use_leave_one_out_baseline",
    "minus_baseline",
    "reward_weights",
)


def _nemo_rl_estimator_keys() -> set[str]:
    keys = set(NEMO_RL_ESTIMATOR_KEYS)
    for module_name in ("nemo_rl.algorithms.advantage_estimator", "nemo_rl.algorithms.grpo"):
        module = sys.modules.get(module_name)  # only what the process already imported
        config_class = getattr(module, "AdvEstimatorConfig", None)
        keys |= set(getattr(config_class, "model_fields", None) or {})
        keys |= set(getattr(config_class, "__annotations__", None) or {})
    return keys


MOMENT_KEYS = {
    "truncation_order": 4,
    "moment_transform": "none",
    "transform_constant": None,
    "transform_alpha": None,
    "transform_beta": None,
}
TRANSFORMS = ("none", "constant", "beta")


def estimator_names() -> tuple[str, ...]:
    """``grpo.adv_estimator.name`` values nemo-mmpo serves, read from the core registry."""
    registered = [name for name in available_estimators() if name not in NEMO_RL_BUILTIN_ESTIMATORS]
    return (MMPO_NAME, *registered)


def is_our_estimator(name: Any) -> bool:
    """Whether ``grpo.adv_estimator.name`` selects a nemo-mmpo estimator."""
    return name in estimator_names()


def known_estimator_keys() -> tuple[str, ...]:
    """Every key ``grpo.adv_estimator`` may hold when one of ours is selected."""
    options = {key for name in available_estimators() for key in estimator_options(name)}
    keys = {"name", "estimator", "reward_threshold", *MOMENT_KEYS, *options}
    return tuple(sorted(keys | _nemo_rl_estimator_keys()))


def config_value(config: Any, key: str, default: Any = None) -> Any:
    """``config[key]`` for a mapping, ``config.key`` (or its pydantic extras) otherwise."""
    if config is None:
        return default
    if isinstance(config, Mapping):
        return config.get(key, default)
    if hasattr(config, key):
        return getattr(config, key)
    extra = getattr(config, "model_extra", None) or {}
    return extra.get(key, default)


def config_keys(config: Any) -> list[str]:
    """The keys set in ``config`` (mapping, or pydantic model with extras)."""
    if config is None:
        return []
    if isinstance(config, Mapping):
        return list(config)
    fields = list(getattr(config, "model_fields_set", None) or [])
    return fields + list(getattr(config, "model_extra", None) or {})


@dataclass(frozen=True)
class EstimatorSettings:
    """The validated ``grpo.adv_estimator`` settings of one of our estimators.

    ``estimator`` is the core registry name, ``objective`` the moment objective it estimates
    the gradient of, ``options`` the estimator's keyword options and ``truncation_order`` the
    number of failure moments reported in the metrics.
    """

    name: str
    estimator: str
    objective: MomentObjective
    options: dict[str, Any] = field(default_factory=dict)
    truncation_order: int = 4
    reward_threshold: float | None = None

    def describe(self) -> str:
        options = ", ".join(f"{key}={value!r}" for key, value in self.options.items())
        return (
            f"{self.name} -> estimator {self.estimator}({options}), objective "
            f"{self.objective.name}, a_k = {list(self.objective.coefficients)}"
        )


def _setting_error(key: str, value: Any, fix: str) -> MMPOInputError:
    return MMPOInputError(f"grpo.adv_estimator.{key}={value!r} is not valid: {fix}")


def _integer(key: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _setting_error(key, value, f"give an integer >= {minimum}")
    return value


def _number_or_none(key: str, value: Any) -> float | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise _setting_error(key, value, "give null or a number")
    return None if value is None else float(value)


def _option_value(key: str, value: Any, option: EstimatorOption) -> Any:
    """``value`` checked against the option's annotated types (integers are orders: >= 1)."""
    if value is None:
        if type(None) in option.types:
            return None
        raise _setting_error(key, value, "give a value (null is not accepted here)")
    if bool in option.types:
        if not isinstance(value, bool):
            raise _setting_error(key, value, "give true or false")
        return value
    if int in option.types:
        return _integer(key, value)
    if float in option.types:
        return _number_or_none(key, value)
    return value


def _objective(kind: str, truncation_order: int, values: dict[str, Any]) -> MomentObjective:
    if kind == "mmpo":
        return moment_objective(
            "mmpo",
            truncation_order,
            transform=values["moment_transform"],
            constant=values["transform_constant"],
            alpha=values["transform_alpha"],
            beta=values["transform_beta"],
        )
    if kind == "pass_at_k":
        return moment_objective("pass_at_k", k=values["options"]["k"])
    if kind == "maxrl":
        order = values["options"].get("maclaurin_order") or truncation_order
        return moment_objective("maxrl", order)
    return moment_objective(kind, truncation_order)


def read_estimator_settings(config: Any) -> EstimatorSettings:
    """Validate ``grpo.adv_estimator`` (mapping or pydantic) into :class:`EstimatorSettings`.

    Raises:
        MMPOInputError: naming the offending key, its value and the accepted values.
    """
    name = config_value(config, "name", MMPO_NAME)
    names = estimator_names()
    if name not in names:
        hint = ""
        if isinstance(name, str) and name.lower() in names:
            hint = f" (names are case-sensitive: did you mean {name.lower()!r}?)"
        raise _setting_error(
            "name",
            name,
            f"nemo-mmpo provides {', '.join(names)}; NeMo-RL provides "
            f"{', '.join(NEMO_RL_BUILTIN_ESTIMATORS)}{hint}",
        )
    unknown = sorted(set(config_keys(config)) - set(known_estimator_keys()))
    if unknown:
        raise _setting_error(
            unknown[0],
            config_value(config, unknown[0]),
            f"no estimator reads it; known keys: {', '.join(known_estimator_keys())}",
        )
    estimator = config_value(config, "estimator", "plugin") if name == MMPO_NAME else name
    if estimator not in available_estimators():
        raise _setting_error(
            "estimator", estimator, f"choose one of {', '.join(available_estimators())}"
        )
    truncation_order = _integer(
        "truncation_order",
        config_value(config, "truncation_order", MOMENT_KEYS["truncation_order"]),
    )
    transform = config_value(config, "moment_transform", "none")
    if transform not in TRANSFORMS:
        raise _setting_error(
            "moment_transform", transform, f"choose one of {', '.join(TRANSFORMS)}"
        )
    values: dict[str, Any] = {"moment_transform": transform}
    for key in ("transform_constant", "transform_alpha", "transform_beta"):
        values[key] = _number_or_none(key, config_value(config, key, None))
    options = {}
    for key, option in estimator_options(estimator).items():
        options[key] = _option_value(key, config_value(config, key, option.default), option)
    values["options"] = options
    try:
        objective = _objective(estimator_objective_kind(estimator), truncation_order, values)
    except MMPOInputError as error:
        raise MMPOInputError(f"grpo.adv_estimator: {error}") from None
    return EstimatorSettings(
        name=name,
        estimator=estimator,
        objective=objective,
        options=options,
        truncation_order=truncation_order,
        reward_threshold=_number_or_none(
            "reward_threshold", config_value(config, "reward_threshold", None)
        ),
    )


def _non_binary_hint(error: MMPOInputError) -> MMPOInputError:
    message = str(error)
    if "binary" not in message:
        return error
    return MMPOInputError(
        f"{message}. In NeMo-RL: set grpo.reward_scaling.enabled=false and "
        "grpo.reward_shaping.enabled=false, or set grpo.adv_estimator.reward_threshold"
    )


class MMPOAdvantageEstimator:
    """MMPO (and baseline) advantages for NeMo-RL's GRPO trainers.

    Paper: *Beyond the Mean: Multi-Moment Policy Optimization for LLM Reasoning*;
    Eq. biased_advantage (``estimator: plugin``) and Eq. unbiased_advantage
    (``estimator: unbiased``), or the baselines of :mod:`nemo_mmpo.baselines`.
    """

    def __init__(self, estimator_config: Any, loss_config: Any = None) -> None:
        self.settings = read_estimator_settings(estimator_config)
        self.objective = self.settings.objective
        self.last_metrics: dict[str, float] = {}

    def compute_advantage(
        self,
        prompt_ids: torch.Tensor,
        rewards: torch.Tensor,
        mask: torch.Tensor,
        valid_mask: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Token-level advantages.

        Args:
            prompt_ids: ``[batch, prompt_len]`` padded prompt tokens; equal rows form a group.
            rewards: ``[batch]`` verifier rewards (0/1 unless ``reward_threshold`` is set).
            mask: ``[batch, seq_len]`` token mask (``token_mask * sample_mask``), used for
                the output shape only, as in NeMo-RL's GRPO estimator.
            valid_mask: optional ``[batch]``; 0 rows take no part in their group's statistics.

        Returns:
            ``[batch, seq_len]`` advantages (each row constant), rewards' dtype and device.
        """
        group_ids = group_ids_from_prompt_rows(prompt_ids.to(rewards.device))
        valid = None if valid_mask is None else valid_mask.to(rewards.device).bool()
        try:
            groups = RewardGroups.from_flat(
                rewards, group_ids, valid, self.settings.reward_threshold
            )
            advantages = advantages_for_groups(
                groups, self.objective, self.settings.estimator, **self.settings.options
            )
        except MMPOInputError as error:
            raise _non_binary_hint(error) from None
        self.last_metrics = self._metrics(groups, advantages, mask)
        output_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
        return advantages.to(output_dtype).unsqueeze(-1).expand(mask.shape)

    def _metrics(
        self, groups: RewardGroups, advantages: torch.Tensor, mask: torch.Tensor
    ) -> dict[str, float]:
        """Group statistics plus token-weighted advantage statistics of the whole step.

        The token weights are the loss's (``mask[:, 1:]``: tokens after the first), so
        ``advantage_token_mean`` is the mean advantage NeMo-RL's token-level loss sees.
        """
        stats = group_statistics(groups, self.settings.truncation_order, self.objective)
        kept = advantages[groups.valid]
        tokens = mask[:, 1:].to(advantages.device, torch.float64).sum(dim=1)  # loss tokens per row
        total = tokens.sum().clamp(min=1.0)
        token_sums = torch.stack(
            [
                (advantages * tokens).sum(),
                (advantages.abs() * tokens).sum(),
                tokens[advantages > 0].sum(),
                kept.abs().max() if kept.numel() else advantages.new_zeros(()),
                kept.abs().mean() if kept.numel() else advantages.new_zeros(()),
            ]
        )
        token_mean, abs_token_mean, positive, abs_max, abs_mean = token_sums.div(
            torch.stack([total, total, total, total.new_ones(()), total.new_ones(())])
        ).tolist()
        stats.update(
            advantage_abs_max=abs_max,
            advantage_abs_mean=abs_mean,
            advantage_token_mean=token_mean,
            advantage_abs_token_mean=abs_token_mean,
            positive_advantage_token_fraction=positive,
        )
        return {f"{METRIC_PREFIX}{key}": value for key, value in stats.items()}
