"""NeMo-RL advantage estimator for MMPO and the paper's baselines.

NeMo-RL's estimator contract: built from ``(estimator_config, loss_config)``;
``compute_advantage(prompt_ids, rewards, mask, **kwargs)`` returns token-level advantages. The
step's ``mmpo/`` metrics travel in an ``AdvantageResult`` where NeMo-RL has one, else in
``last_metrics`` (the async trainer) and through the logging hook
(:meth:`MMPOAdvantageEstimator.take_step_metrics`). With ``streaming_chunks=True`` (the single
controller) each chunk's metrics are combined into the step's (:func:`combine_chunk_metrics`).
"""

from __future__ import annotations

from typing import Any

import torch

from nemo_mmpo.diagnostics import group_statistics
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.estimators import advantages_for_groups
from nemo_mmpo.grouping import RewardGroups, group_ids_from_prompt_rows
from nemo_mmpo.nemo_rl.estimator_settings import (
    read_estimator_settings,
    unread_estimator_settings,
)
from nemo_mmpo.nemo_rl.names import ESTIMATOR_METRICS
from nemo_mmpo.nemo_rl.newer_nemo_rl import VALID_MASK, advantage_result_type, row_mask_keywords
from nemo_mmpo.settings import report_unread


def _non_binary_hint(error: MMPOInputError) -> MMPOInputError:
    message = str(error)
    if "binary" not in message:
        return error
    return MMPOInputError(
        f"{message}. In NeMo-RL: set grpo.reward_scaling.enabled=false and "
        "grpo.reward_shaping.enabled=false, or set grpo.adv_estimator.reward_threshold"
    )


#: how each metric of :meth:`MMPOAdvantageEstimator._metrics` combines over chunks of one step
#: (chunks hold whole groups): the weight of its per-chunk mean, or ``max`` / ``sum``
_GROUP_MEAN, _ROLLOUT_MEAN, _VALID_MEAN, _TOKEN_MEAN = "groups", "rollouts", "valid", "tokens"
_COMBINED_BY = {
    "success_rate": _ROLLOUT_MEAN,
    "advantage_abs_mean": _VALID_MEAN,
    "advantage_token_mean": _TOKEN_MEAN,
    "advantage_abs_token_mean": _TOKEN_MEAN,
    "positive_advantage_token_fraction": _TOKEN_MEAN,
    "weight_max": "max",
    "advantage_abs_max": "max",
    "num_groups": "sum",
}


def combine_chunk_metrics(chunks: list[tuple[dict[str, float], dict[str, float]]]) -> dict:
    """One step's metrics from its chunks' ``(metrics, weights)``: per-group means weighted by
    groups, ``success_rate`` by rollouts, ``advantage_abs_mean`` by valid rollouts, the token
    statistics by loss tokens; maxima and counts over all. A chunk with no weight for a mean
    (no group, no token) takes no part in it; a mean no chunk has weight for is what one call
    on the step reports: NaN for the group statistics
    (:func:`~nemo_mmpo.diagnostics.group_statistics`), 0 for the advantage statistics."""
    if len(chunks) == 1:
        return dict(chunks[0][0])
    combined: dict[str, float] = {}
    for key in dict.fromkeys(key for metrics, _ in chunks for key in metrics):
        how = _COMBINED_BY.get(key.removeprefix(ESTIMATOR_METRICS), _GROUP_MEAN)
        values = [(metrics[key], weights) for metrics, weights in chunks if key in metrics]
        if how == "sum":
            combined[key] = float(sum(value for value, _ in values))
            continue
        if how == "max":
            present = [value for value, weights in values if weights[_VALID_MEAN] > 0]
            combined[key] = float(max(present)) if present else values[-1][0]
            continue
        total = sum(weights[how] for _, weights in values)
        if total <= 0:
            combined[key] = 0.0 if how in (_TOKEN_MEAN, _VALID_MEAN) else float("nan")
            continue
        combined[key] = float(
            sum(value * weights[how] for value, weights in values if weights[how] > 0) / total
        )
    return combined


class MMPOAdvantageEstimator:
    """MMPO (and baseline) advantages for NeMo-RL's GRPO trainers.

    Paper: *Beyond the Mean: Multi-Moment Policy Optimization for LLM Reasoning*;
    Eq. biased_advantage (``estimator: plugin``) and Eq. unbiased_advantage
    (``estimator: unbiased``), or the baselines of :mod:`nemo_mmpo.baselines`.
    """

    def __init__(
        self, estimator_config: Any, loss_config: Any = None, streaming_chunks: bool = False
    ) -> None:
        #: whether it is called once per streaming chunk of a step (the single controller),
        #: the step's metrics then combining every chunk's until :meth:`take_step_metrics`
        self.streaming_chunks = streaming_chunks
        self._chunks: list[tuple[dict[str, float], dict[str, float]]] = []
        self.settings = read_estimator_settings(estimator_config)
        #: keys of the section this estimator does not read (reported once per process)
        self.unread_settings = unread_estimator_settings(estimator_config)
        report_unread(self.unread_settings)
        self.objective = self.settings.objective
        self.last_metrics: dict[str, float] = {}
        self.result_type = advantage_result_type()
        #: the keywords row validity may arrive under, read from NeMo-RL's estimator
        self.row_mask_keywords = row_mask_keywords()
        self._untaken_metrics: dict[str, float] = {}
        #: ``(advantages [batch], mask [batch, seq_len])`` of the last call: what the first-step
        #: check compares the loss's advantages with (``nemo_mmpo.nemo_rl.outcomes``)
        self.last_output: tuple[torch.Tensor, torch.Tensor] | None = None

    def compute_advantage(
        self,
        prompt_ids: torch.Tensor,
        rewards: torch.Tensor,
        mask: torch.Tensor,
        valid_mask: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> Any:
        """Token-level advantages (an ``AdvantageResult`` where NeMo-RL has that type).

        Args:
            prompt_ids: ``[batch, prompt_len]`` padded prompt tokens; equal rows form a group.
            rewards: ``[batch]`` verifier rewards (0/1 unless ``reward_threshold`` is set).
            mask: ``[batch, seq_len]`` token mask (``token_mask * sample_mask``), used for
                the output shape and the token-weighted metrics, as in NeMo-RL's estimators.
            valid_mask: optional ``[batch]``; 0 rows take no part in their group's statistics
                (also read under the ``*_mask`` keyword NeMo-RL's own GRPO estimator declares:
                :func:`row_mask_keywords`).

        Returns:
            ``[batch, seq_len]`` advantages (each row constant), rewards' dtype and device.
        """
        if valid_mask is None:  # under NeMo-RL's own keyword (row_mask_keywords)
            keywords = getattr(self, "row_mask_keywords", (VALID_MASK,))
            given = [kwargs[key] for key in keywords if kwargs.get(key) is not None]
            valid_mask = given[0] if given else None
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
        self.last_output = (advantages.detach().clone(), mask)
        if self.streaming_chunks:
            self._chunks.append((dict(self.last_metrics), self._chunk_weights(groups, mask)))
        output_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
        token_advantages = advantages.to(output_dtype).unsqueeze(-1).expand(mask.shape)
        if self.result_type is not None:
            return self.result_type(
                advantages=token_advantages, returns=None, metrics=dict(self.last_metrics)
            )
        self._untaken_metrics = dict(self.last_metrics)
        return token_advantages

    def take_step_metrics(self) -> dict[str, float]:
        """The last step's metrics for a trainer that reads neither an ``AdvantageResult`` nor
        ``last_metrics``; empty once taken, and when they travelled in the result. With
        ``streaming_chunks``: every chunk's since the last call, combined
        (:func:`combine_chunk_metrics`)."""
        if self.streaming_chunks:
            chunks, self._chunks = self._chunks, []
            self._untaken_metrics = {}
            return combine_chunk_metrics(chunks) if chunks else {}
        metrics, self._untaken_metrics = self._untaken_metrics, {}
        return metrics

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled (as Ray hands the single controller's estimator to its actor): in that
        process, NeMo-RL's step-metric reduction takes this estimator's metrics."""
        self.__dict__.update(state)
        if self.streaming_chunks:
            from nemo_mmpo.nemo_rl.actor_hooks import install_in_actor

            install_in_actor(self)

    @staticmethod
    def _chunk_weights(groups: RewardGroups, mask: torch.Tensor) -> dict[str, float]:
        """What each of this call's means is over (:func:`combine_chunk_metrics`)."""
        present = groups.group_size > 0
        return {
            _GROUP_MEAN: float(present.sum()),
            _ROLLOUT_MEAN: float(groups.group_size.sum()),
            _VALID_MEAN: float(groups.valid.sum()),
            _TOKEN_MEAN: float(mask[:, 1:].double().sum()),
        }

    def _metrics(
        self, groups: RewardGroups, advantages: torch.Tensor, mask: torch.Tensor
    ) -> dict[str, float]:
        """Group statistics plus advantage statistics of the whole step.

        ``advantage_abs_max``/``advantage_abs_mean`` are over the valid rollouts; the token
        statistics weigh each rollout by its loss tokens (``mask[:, 1:]``: tokens after the
        first), so ``advantage_token_mean`` is the mean advantage NeMo-RL's token-level loss
        sees.
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
        return {f"{ESTIMATOR_METRICS}{key}": value for key, value in stats.items()}
