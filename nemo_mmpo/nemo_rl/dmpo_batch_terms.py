"""DMPO in NeMo-RL, the part without NeMo-RL imports: settings and per-batch penalty terms.

DMPO's penalty (:mod:`nemo_mmpo.dmpo`) couples the responses of a prompt group, while NeMo-RL
calls the loss on pieces of a batch (data-parallel ranks, micro-batches, packed sequences). So
it is linearised once per batch, on the driver, at ``prev_logprobs``:

    term = sum_j share_j + gradient_j * (phi_j - phi_j_before),

with ``phi_j`` response ``j``'s token-mean log-probability: each response's part needs only its
own tokens, so the sum over any split of the batch is the same, and at the first optimizer step
of a batch its value and gradient are the penalty's, exactly (later steps of the same batch use
the first-order term; the run plan says so). :func:`attach_penalty_terms` adds the terms to
NeMo-RL's ``train_data``; :class:`~nemo_mmpo.nemo_rl.loss.DMPOLossFn` reads them in the workers.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from pydantic import Field

from nemo_mmpo import sections
from nemo_mmpo.dmpo import PAPER_COEFFICIENT, PAPER_TEMPERATURE, linearized_penalty
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.grouping import group_ids_from_prompt_rows
from nemo_mmpo.losses import loss_entry, loss_names
from nemo_mmpo.nemo_rl.names import DMPO_METRICS, near_miss
from nemo_mmpo.settings import Settings, changed_settings, parse

SHARE_KEY = "dmpo_penalty_share"
GRADIENT_KEY = "dmpo_penalty_gradient"


class DMPOSettings(Settings):
    """``loss_fn``'s DMPO keys: ``dmpo_weight`` (lambda, the authors' ``dmpo_beta``),
    ``dmpo_temperature`` (alpha) and ``dmpo_filter_zero_signal`` (true: the authors'
    ``grpo_dmpo_zero``, the default; false: ``grpo_dmpo``)."""

    dmpo_weight: float = Field(PAPER_COEFFICIENT, ge=0.0, allow_inf_nan=False)
    dmpo_temperature: float = Field(PAPER_TEMPERATURE, gt=0.0, allow_inf_nan=False)
    dmpo_filter_zero_signal: bool = True

    @property
    def weight(self) -> float:
        return self.dmpo_weight

    @property
    def temperature(self) -> float:
        return self.dmpo_temperature

    @property
    def filter_zero_signal(self) -> bool:
        return self.dmpo_filter_zero_signal

    def deviations(self) -> list[str]:
        """``loss_fn.key=value (paper: v)`` for each setting that is not the paper's."""
        paper = DMPOSettings()
        return [
            f"loss_fn.{key}={getattr(self, key)!r} (paper: {getattr(paper, key)!r})"
            for key in DMPOSettings.model_fields
            # the YAML spells 1/15 in decimals
            if not math.isclose(getattr(self, key), getattr(paper, key), rel_tol=1e-9)
        ]


def misspelt_dmpo_key(loss_config: Any) -> str | None:
    """Why a key of ``loss_fn`` that looks like one of DMPO's but is none of them is refused
    (``dmpo_wieght``: NeMo-RL keeps unknown ``loss_fn`` keys as extras and nothing would read
    it), or None. Checked whatever ``loss_fn.name`` is, as the estimator's keys are."""
    known = list(DMPOSettings.model_fields)
    for key in sections.present_keys(loss_config):
        if key in known:
            continue
        close = near_miss(key, known)
        if key.lower().startswith("dmpo") or close:
            hint = f"did you mean loss_fn.{close}? " if close else ""
            return (
                f"loss_fn.{key}={sections.value(loss_config, key)!r} is not a setting of DMPO "
                f"(nothing would read it): {hint}DMPO's keys are {', '.join(known)}"
            )
    return None


def refuse_misspelt_dmpo_key(loss_config: Any) -> None:
    problem = None if loss_config is None else misspelt_dmpo_key(loss_config)
    if problem is not None:
        raise MMPOInputError(problem)


def read_dmpo_settings(loss_config: Any) -> DMPOSettings:
    """The ``dmpo_*`` keys of ``loss_fn`` (mapping or pydantic model), validated; a key that
    misspells one of them is refused (:func:`misspelt_dmpo_key`).

    Raises:
        MMPOInputError: naming the key, its value and what is accepted.
    """
    refuse_misspelt_dmpo_key(loss_config)
    values = {
        key: sections.value(loss_config, key)
        for key in sections.present_keys(loss_config)
        if key in DMPOSettings.model_fields
    }
    return parse(DMPOSettings, values, "loss_fn")


def is_dmpo_loss(loss_config: Any) -> bool:
    """Whether ``loss_fn.name`` selects DMPO (the registered loss whose batch terms these are)."""
    entry = loss_entry(sections.value(loss_config, "name"))
    return entry is not None and entry.batch_terms == _THESE_TERMS


#: how :mod:`nemo_mmpo.losses` registers :func:`batch_terms`
_THESE_TERMS = f"{__name__}:batch_terms"


def dmpo_name() -> str:
    """DMPO's ``loss_fn.name``, as registered."""
    return next(name for name in loss_names() if loss_entry(name).batch_terms == _THESE_TERMS)


def batch_terms(train_data: Any, loss_config: Any) -> dict[str, float]:
    """DMPO's per-batch terms (:func:`attach_penalty_terms`) for ``loss_fn``'s settings."""
    return attach_penalty_terms(train_data, read_dmpo_settings(loss_config))


def forced_ratio_problem(loss_config: Any) -> str | None:
    """Why DMPO cannot train with this ``loss_fn``, or None: ``force_on_policy_ratio`` makes
    NeMo-RL skip ``prev_logprobs`` (zeros), where the penalty is linearised."""
    if not is_dmpo_loss(loss_config) or not sections.value(loss_config, "force_on_policy_ratio"):
        return None
    return (
        f"loss_fn.name={dmpo_name()} needs the log-probabilities NeMo-RL computes before training "
        "(prev_logprobs), which loss_fn.force_on_policy_ratio=true skips: set "
        "loss_fn.force_on_policy_ratio=false"
    )


def unread_dmpo_settings(loss_config: Any) -> list[str]:
    """One message for each of DMPO's ``loss_fn`` keys set to a value other than its default
    while ``loss_fn.name`` is not ``dmpo`` (no other loss reads them). Raises on a key that
    misspells one of them (:func:`misspelt_dmpo_key`), whatever the loss."""
    refuse_misspelt_dmpo_key(loss_config)
    if loss_config is None or is_dmpo_loss(loss_config):
        return []
    values = {key: sections.value(loss_config, key) for key in sections.present_keys(loss_config)}
    name = sections.value(loss_config, "name")
    return [
        f"loss_fn.{key}={value!r} is not read with loss_fn.name={name!r}: DMPO's keys are read "
        f"only with loss_fn.name={dmpo_name()}; this run ignores it"
        for key, value in changed_settings(DMPOSettings, values, DMPOSettings.model_fields).items()
    ]


def prompt_groups(
    input_ids: torch.Tensor, token_mask: torch.Tensor, input_lengths: torch.Tensor | None = None
) -> torch.Tensor:
    """``[batch]`` group ids: rows whose prompts (the tokens before the first loss token) match.

    Args:
        input_ids: ``[batch, seq_len]`` prompt and response tokens, right-padded.
        token_mask: ``[batch, seq_len]`` 1 on the tokens the loss trains on (the response).
        input_lengths: ``[batch]`` unpadded lengths; a row with no loss token is all prompt
            (without lengths, all of the row).
    """
    mask = token_mask.bool()
    has_response = mask.any(dim=1)
    if input_lengths is None:
        input_lengths = torch.full_like(has_response, input_ids.shape[1], dtype=torch.long)
    first = torch.where(has_response, mask.int().argmax(dim=1), input_lengths.long())
    width = max(int(first.max().item()), 1)
    positions = torch.arange(width, device=input_ids.device)
    prefix = torch.where(positions < first[:, None], input_ids[:, :width], -1)
    return group_ids_from_prompt_rows(torch.cat([first[:, None], prefix.long()], dim=1))


def token_means(values: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
    """``[batch]`` mean of ``values[:, 1:]`` over the loss tokens ``token_mask[:, 1:]`` (0 if none).

    ``values`` is ``[batch, seq_len]`` (NeMo-RL's ``prev_logprobs``/``advantages`` layout) or
    ``[batch, seq_len - 1]`` (the next-token log-probabilities the loss receives).
    """
    mask = token_mask[:, 1:].to(values.dtype)
    if values.shape[1] == token_mask.shape[1]:
        values = values[:, 1:]
    return (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


def attach_penalty_terms(train_data: Any, settings: DMPOSettings) -> dict[str, float]:
    """Add the linearised penalty (:data:`SHARE_KEY`, :data:`GRADIENT_KEY`) to ``train_data``.

    Args:
        train_data: NeMo-RL's training batch after advantages: ``input_ids``, ``token_mask``,
            ``sample_mask``, ``advantages`` and ``prev_logprobs`` (``[batch, seq_len]``).
        settings: the DMPO settings of ``loss_fn``.

    Returns:
        The step's ``dmpo/`` metrics (:func:`nemo_mmpo.dmpo.linearized_penalty`).
    """
    missing = [
        key
        for key in ("input_ids", "token_mask", "sample_mask", "advantages", "prev_logprobs")
        if key not in train_data
    ]
    if missing:
        raise MMPOInputError(
            f"loss_fn.name={dmpo_name()}: NeMo-RL's train_data lacks {', '.join(missing)}"
        )
    token_mask = train_data["token_mask"]
    prev_logprobs = train_data["prev_logprobs"]
    response_tokens = token_mask[:, 1:].sum(dim=1)
    valid = (train_data["sample_mask"] > 0) & (response_tokens > 0)
    penalty = linearized_penalty(
        token_means(train_data["advantages"].to(torch.float64), token_mask),
        token_means(prev_logprobs.to(torch.float64), token_mask),
        prompt_groups(train_data["input_ids"], token_mask, train_data.get("input_lengths")),
        settings.temperature,
        valid,
        filter_zero_signal=settings.filter_zero_signal,
    )
    train_data[SHARE_KEY] = penalty.shares.to(prev_logprobs.dtype)
    train_data[GRADIENT_KEY] = penalty.gradient.to(prev_logprobs.dtype)
    return {f"{DMPO_METRICS}{key}": value for key, value in penalty.metrics.items()}


def penalty_term(next_token_logprobs: torch.Tensor, data: Any) -> torch.Tensor:
    """This piece of the batch's share of the linearised penalty (a differentiable scalar).

    Args:
        next_token_logprobs: ``[rows, seq_len - 1]`` current log-probabilities (the loss input).
        data: the piece's data, with ``token_mask``, ``prev_logprobs`` and the two keys of
            :func:`attach_penalty_terms`.
    """
    missing = [key for key in (SHARE_KEY, GRADIENT_KEY) if key not in data]
    if missing:
        raise RuntimeError(
            f"loss_fn.name={dmpo_name()}: the training batch has no {', '.join(missing)}. "
            "nemo-mmpo adds them in NeMo-RL's grpo_train and async_grpo_train (after "
            "nemo_mmpo.nemo_rl.install()); this trainer did not call the hooked "
            "_apply_configured_message_level_advantage_penalties. Use those trainers "
            f"(data_plane.enabled=false) or loss_fn.name={loss_names()[0]}"
        )
    token_mask = data["token_mask"]
    phi = token_means(next_token_logprobs, token_mask)
    phi_before = token_means(data["prev_logprobs"].to(phi.dtype), token_mask)
    share = data[SHARE_KEY].to(phi.dtype)
    gradient = data[GRADIENT_KEY].to(phi.dtype)
    return (share + gradient * (phi - phi_before)).sum()
