"""A worked plug-in: your own advantage estimator and loss for nemo-mmpo (docs/own-objective.md).

A recipe beside this file selects them::

    nemo_mmpo:
      plugins: [my_objectives]            # this file, beside the recipe
    grpo:
      adv_estimator:
        name: clipped_weight_mmpo
        weight_cap: 4.0
    loss_fn:
      name: entropy_bonus_pg
      entropy_bonus: 0.01

``nemo-mmpo train`` imports this module before it checks the recipe; NeMo-RL's Ray workers import
it again from the environment the launcher sets. It registers at import and does nothing else.
"""

from __future__ import annotations

import torch

from nemo_mmpo import MMPOInputError, MomentObjective, RewardGroups, register_estimator, sections
from nemo_mmpo.losses import register_loss

try:
    from nemo_rl.algorithms.loss import ClippedPGLossFn
except ImportError:  # a dry run on a Python without NeMo-RL: the names register, nothing trains
    ClippedPGLossFn = object  # type: ignore[assignment,misc]


@register_estimator("clipped_weight_mmpo", objective="mmpo")
def clipped_weight_mmpo(
    groups: RewardGroups, objective: MomentObjective, weight_cap: float = 4.0
) -> torch.Tensor:
    """MMPO's plug-in advantage ``w(1 - s) (r - s)`` with its weight capped at ``weight_cap``.

    ``s`` is the group's success rate and ``w(f) = sum_k k a_k f^(k-1)`` the objective's weight
    (10 at f = 1 for T = 4): the cap bounds how hard a nearly unsolved prompt pushes.
    """
    if weight_cap <= 0:
        raise MMPOInputError(f"grpo.adv_estimator.weight_cap={weight_cap}: give a positive cap")
    success_rate = groups.success_rate  # [num_groups]
    weight = objective.weight(1.0 - success_rate).clamp(max=weight_cap)
    return groups.gather(weight) * (groups.rewards - groups.gather(success_rate))  # [N]


@register_loss("entropy_bonus_pg", options={"entropy_bonus": 0.01})
class EntropyBonusPGLossFn(ClippedPGLossFn):
    """NeMo-RL's clipped surrogate minus ``entropy_bonus`` times the sampled tokens' mean
    negative log-probability (an estimate of the policy's entropy: the loss sees the sampled
    tokens' log-probabilities, not the whole vocabulary's)."""

    def __init__(self, cfg, *args, **kwargs):
        super().__init__(cfg, *args, **kwargs)
        # NeMo-RL hands loss_fn over as a mapping or a pydantic model, by version: read either
        self.entropy_bonus = float(sections.value(cfg, "entropy_bonus", 0.01))

    def __call__(self, next_token_logprobs, data, global_valid_seqs, global_valid_toks, *a, **kw):
        loss, metrics = super().__call__(
            next_token_logprobs, data, global_valid_seqs, global_valid_toks, *a, **kw
        )
        # the response tokens of the rows that count, as NeMo-RL's loss masks them
        mask = data["token_mask"][:, 1:] * data["sample_mask"][:, None]
        mask = mask.to(next_token_logprobs.dtype)
        # this micro-batch's share of the batch mean (NeMo-RL sums the micro-batches' losses)
        tokens = torch.as_tensor(global_valid_toks, dtype=mask.dtype).clamp(min=1)
        entropy = -(next_token_logprobs * mask).sum() / tokens
        loss = loss - self.entropy_bonus * entropy
        metrics["loss"] = loss.item()
        metrics["entropy_bonus_pg/sampled_entropy"] = entropy.item()
        return loss, metrics
