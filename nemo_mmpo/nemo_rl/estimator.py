"""NeMo-RL advantage estimator for MMPO and the paper's baselines.

Implements NeMo-RL's estimator contract (``nemo_rl/algorithms/advantage_estimator.py``):
constructed from ``(estimator_config, loss_config)``; ``compute_advantage(prompt_ids, rewards,
mask, **kwargs)`` returns token-level advantages ``[batch, seq_len]``; ``last_metrics`` holds
the step's diagnostics. The config is ``grpo.adv_estimator``: a plain mapping (NeMo-RL
v0.7.0's TypedDict) or a pydantic model with extra fields (NeMo-RL main).

Config keys (all shipped with defaults in ``examples/configs`` so Hydra overrides work):

- ``name``: ``mmpo`` | ``passk_chen`` | ``pkpo`` | ``maxrl``
- ``truncation_order`` (T, paper default 4) and ``estimator`` (``plugin`` | ``unbiased``)
- ``moment_transform``: ``none`` | ``constant`` | ``beta``, with ``transform_constant``,
  ``transform_alpha``, ``transform_beta`` (moments of U*F, a_k = E[U^k])
- ``k`` for ``passk_chen`` / ``pkpo`` (paper: 3); ``maclaurin_order`` for ``maxrl`` (null:
  the authors' default estimator)
- ``reward_threshold``: null (rewards must be 0/1) or a float (reward >= t is a success)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from nemo_mmpo.diagnostics import group_statistics
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.estimators import advantages_for_groups
from nemo_mmpo.grouping import RewardGroups, group_ids_from_prompt_rows
from nemo_mmpo.objectives import MomentObjective, moment_objective

ESTIMATOR_NAMES = ("mmpo", "passk_chen", "pkpo", "maxrl")
METRIC_PREFIX = "mmpo/"

_ALLOWED = {
    "estimator": ("plugin", "unbiased"),
    "moment_transform": ("none", "constant", "beta"),
}


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


@dataclass(frozen=True)
class EstimatorSettings:
    """The validated ``grpo.adv_estimator`` settings of one of our estimators."""

    name: str = "mmpo"
    truncation_order: int = 4
    estimator: str = "plugin"
    moment_transform: str = "none"
    transform_constant: float | None = None
    transform_alpha: float | None = None
    transform_beta: float | None = None
    k: int = 3
    maclaurin_order: int | None = None
    reward_threshold: float | None = None

    def objective(self) -> MomentObjective:
        """The moment objective the advantages estimate the gradient of."""
        if self.name == "mmpo":
            return moment_objective(
                "mmpo",
                self.truncation_order,
                transform=self.moment_transform,
                constant=self.transform_constant,
                alpha=self.transform_alpha,
                beta=self.transform_beta,
            )
        if self.name in ("passk_chen", "pkpo"):
            return moment_objective("pass_at_k", k=self.k)
        order = self.maclaurin_order if self.maclaurin_order is not None else self.truncation_order
        return moment_objective("maxrl", order)

    def registry_call(self) -> tuple[str, dict[str, Any]]:
        """``(estimator name, options)`` for :func:`nemo_mmpo.compute_advantages`."""
        if self.name == "mmpo":
            return self.estimator, {}
        if self.name in ("passk_chen", "pkpo"):
            return self.name, {"k": self.k}
        return "maxrl", {"maclaurin_order": self.maclaurin_order}


def _setting_error(key: str, value: Any, fix: str) -> MMPOInputError:
    return MMPOInputError(f"grpo.adv_estimator.{key}={value!r} is not valid: {fix}")


def read_estimator_settings(config: Any) -> EstimatorSettings:
    """Validate ``grpo.adv_estimator`` (mapping or pydantic) into :class:`EstimatorSettings`.

    Raises:
        MMPOInputError: naming the offending key, its value and the accepted values.
    """
    name = config_value(config, "name", "mmpo")
    if name not in ESTIMATOR_NAMES:
        raise _setting_error("name", name, f"nemo-mmpo provides {', '.join(ESTIMATOR_NAMES)}")
    values: dict[str, Any] = {"name": name}
    for key, allowed in _ALLOWED.items():
        value = config_value(config, key, EstimatorSettings.__dataclass_fields__[key].default)
        if value not in allowed:
            raise _setting_error(key, value, f"choose one of {', '.join(allowed)}")
        values[key] = value
    for key in ("truncation_order", "k"):
        value = config_value(config, key, EstimatorSettings.__dataclass_fields__[key].default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _setting_error(key, value, "give an integer >= 1")
        values[key] = value
    maclaurin_order = config_value(config, "maclaurin_order", None)
    if maclaurin_order is not None and (
        isinstance(maclaurin_order, bool) or not isinstance(maclaurin_order, int)
    ):
        raise _setting_error("maclaurin_order", maclaurin_order, "give null or an integer >= 1")
    values["maclaurin_order"] = maclaurin_order
    for key in ("transform_constant", "transform_alpha", "transform_beta", "reward_threshold"):
        value = config_value(config, key, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise _setting_error(key, value, "give null or a number")
        values[key] = None if value is None else float(value)
    settings = EstimatorSettings(**values)
    try:
        settings.objective()
    except MMPOInputError as error:
        raise MMPOInputError(f"grpo.adv_estimator: {error}") from None
    return settings


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
        self.objective = self.settings.objective()
        self.estimator_name, self.options = self.settings.registry_call()
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
                groups, self.objective, self.estimator_name, **self.options
            )
        except MMPOInputError as error:
            raise _non_binary_hint(error) from None
        self.last_metrics = self._metrics(groups, advantages)
        output_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
        return advantages.to(output_dtype).unsqueeze(-1).expand(mask.shape)

    def _metrics(self, groups: RewardGroups, advantages: torch.Tensor) -> dict[str, float]:
        stats = group_statistics(groups, self.objective.truncation_order, self.objective)
        kept = advantages[groups.valid]
        stats["advantage_abs_max"] = float(kept.abs().max()) if kept.numel() else 0.0
        stats["advantage_abs_mean"] = float(kept.abs().mean()) if kept.numel() else 0.0
        return {f"{METRIC_PREFIX}{key}": value for key, value in stats.items()}
