"""Rollouts grouped by prompt: validation, binarisation and segment sums for ragged groups.

NeMo-RL's GRPO groups rollouts whose prompt-token rows are identical; after dynamic-sampling
filtering a prompt may keep fewer rollouts than the others, so every statistic here is a
segment sum over a group index, never a reshape to ``[num_prompts, group_size]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nemo_mmpo.errors import MMPOInputError


def _row_hash_multipliers(length: int, device: torch.device) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0x5EED)
    multipliers = torch.randint(1, 2**62, (length,), generator=generator, dtype=torch.int64)
    return (multipliers | 1).to(device)


def group_ids_from_prompt_rows(prompt_ids: torch.Tensor) -> torch.Tensor:
    """Group index per rollout from its prompt tokens.

    Rows are hashed to one int64 each (wrapping arithmetic), grouped by the hash, and every row
    is then compared with its group's first row; only if a hash collision merged different
    rows does it fall back to the exact but slower ``torch.unique(dim=0)``. The result is
    always exact.

    Args:
        prompt_ids: ``[batch, prompt_len]`` padded prompt token rows (NeMo-RL groups rollouts
            whose rows are equal), or ``[batch]`` ids.

    Returns:
        ``[batch]`` int64 ids in ``0..num_groups-1``.
    """
    if prompt_ids.dim() == 1:
        return torch.unique(prompt_ids, return_inverse=True)[1]
    if prompt_ids.dim() != 2:
        raise MMPOInputError(
            "prompt_ids must be [batch, prompt_len] or [batch]; "
            f"got shape {tuple(prompt_ids.shape)}"
        )
    rows = prompt_ids.long()
    hashes = (rows * _row_hash_multipliers(rows.shape[1], rows.device)).sum(dim=1)
    _, group_index = torch.unique(hashes, return_inverse=True)
    positions = torch.arange(rows.shape[0], device=rows.device)
    first_row = torch.full_like(positions, rows.shape[0]).scatter_reduce(
        0, group_index, positions, reduce="amin"
    )
    if bool((rows == rows[first_row[group_index]]).all()):
        return group_index
    return torch.unique(rows, dim=0, return_inverse=True)[1]


def _first_index(mask: torch.Tensor) -> int:
    return int(torch.nonzero(mask)[0, 0].item())


def binary_rewards(
    rewards: torch.Tensor,
    valid: torch.Tensor,
    reward_threshold: float | None = None,
) -> torch.Tensor:
    """Check and return 0/1 rewards as float64; invalid entries are ignored and set to 0.

    Raises:
        MMPOInputError: naming the first NaN/inf or non-binary reward and how to fix it.
    """
    rewards = rewards.to(torch.float64)
    bad = valid & ~torch.isfinite(rewards)
    if bool(bad.any()):
        index = _first_index(bad)
        raise MMPOInputError(
            f"reward at index {index} is {rewards[index].item():.6g}; rewards must be finite. "
            "Check the verifier/environment, or mark that rollout invalid with valid_mask"
        )
    if reward_threshold is not None:
        binary = (rewards >= reward_threshold).to(torch.float64)
    else:
        not_binary = valid & (rewards != 0) & (rewards != 1)
        if bool(not_binary.any()):
            index = _first_index(not_binary)
            raise MMPOInputError(
                f"reward at index {index} is {rewards[index].item():.6g}, but moment estimators "
                "need binary 0/1 verifier rewards. Pass reward_threshold=<t> to count "
                "reward >= t as success, or turn off reward scaling/shaping upstream"
            )
        binary = rewards
    return torch.where(valid, binary, torch.zeros_like(binary))


@dataclass(frozen=True)
class RewardGroups:
    """Binary rewards of ``N`` rollouts in ``num_groups`` prompt groups (ragged allowed).

    Attributes:
        rewards: ``[N]`` float64 in {0, 1}; 0 where invalid.
        valid: ``[N]`` bool; invalid rollouts take no part in any statistic.
        group_index: ``[N]`` int64 in ``0..num_groups-1``.
        group_size: ``[num_groups]`` float64, valid rollouts per group.
        success_count: ``[num_groups]`` float64, valid successes per group.
    """

    rewards: torch.Tensor
    valid: torch.Tensor
    group_index: torch.Tensor
    group_size: torch.Tensor
    success_count: torch.Tensor

    @property
    def num_groups(self) -> int:
        return int(self.group_size.shape[0])

    @property
    def failure_count(self) -> torch.Tensor:
        """``[num_groups]`` valid failures per group."""
        return self.group_size - self.success_count

    @property
    def success_rate(self) -> torch.Tensor:
        """``[num_groups]`` ``s_hat``; 0 for groups with no valid rollout."""
        return self.success_count / self.group_size.clamp(min=1)

    def gather(self, per_group: torch.Tensor) -> torch.Tensor:
        """``[num_groups] -> [N]``: each rollout reads its group's value."""
        return per_group[self.group_index]

    def segment_sum(self, per_rollout: torch.Tensor) -> torch.Tensor:
        """``[N] -> [num_groups]``: sum over each group's rollouts (invalid ones included)."""
        out = torch.zeros(self.num_groups, dtype=per_rollout.dtype, device=per_rollout.device)
        return out.index_add_(0, self.group_index, per_rollout)

    @classmethod
    def from_flat(
        cls,
        rewards: torch.Tensor,
        group_ids: torch.Tensor,
        valid_mask: torch.Tensor | None = None,
        reward_threshold: float | None = None,
    ) -> RewardGroups:
        """Validate ``[N]`` rewards, ``[N]`` integer group ids and an optional ``[N]`` mask."""
        rewards = torch.as_tensor(rewards)
        group_ids = torch.as_tensor(group_ids, device=rewards.device)
        if rewards.dim() != 1:
            raise MMPOInputError(
                f"rewards must be 1-D [num_rollouts]; got shape {tuple(rewards.shape)}. "
                "For [num_prompts, group_size] use mmpo_advantages or RewardGroups.from_dense"
            )
        if rewards.numel() == 0:
            raise MMPOInputError("empty batch: rewards has no elements; pass at least one rollout")
        if group_ids.shape != rewards.shape:
            raise MMPOInputError(
                f"group_ids shape {tuple(group_ids.shape)} does not match rewards shape "
                f"{tuple(rewards.shape)}; give one group id per rollout"
            )
        if group_ids.is_floating_point() or group_ids.is_complex() or group_ids.dtype == torch.bool:
            raise MMPOInputError(
                f"group_ids must be an integer tensor; got dtype {group_ids.dtype}. "
                "Use group_ids_from_prompt_rows(prompt_ids) or .long()"
            )
        if valid_mask is None:
            valid = torch.ones_like(rewards, dtype=torch.bool)
        else:
            valid_mask = torch.as_tensor(valid_mask, device=rewards.device)
            if valid_mask.shape != rewards.shape:
                raise MMPOInputError(
                    f"valid_mask shape {tuple(valid_mask.shape)} does not match rewards shape "
                    f"{tuple(rewards.shape)}; give one flag per rollout"
                )
            valid = valid_mask.bool()
        binary = binary_rewards(rewards, valid, reward_threshold)
        group_index = torch.unique(group_ids, return_inverse=True)[1]
        num_groups = int(group_index.max().item()) + 1
        weights = valid.to(torch.float64)
        group_size = torch.zeros(num_groups, dtype=torch.float64, device=rewards.device)
        group_size.index_add_(0, group_index, weights)
        success_count = torch.zeros_like(group_size).index_add_(0, group_index, binary)
        return cls(binary, valid, group_index, group_size, success_count)

    @classmethod
    def from_dense(
        cls, rewards: torch.Tensor, reward_threshold: float | None = None
    ) -> RewardGroups:
        """``[num_prompts, group_size]`` rewards, one row per prompt, every rollout valid."""
        rewards = torch.as_tensor(rewards)
        if rewards.dim() != 2:
            raise MMPOInputError(
                f"dense rewards must be [num_prompts, group_size]; got shape {tuple(rewards.shape)}"
            )
        if rewards.numel() == 0:
            raise MMPOInputError(
                f"empty batch: rewards of shape {tuple(rewards.shape)}; pass at least one rollout"
            )
        num_prompts, group_size = rewards.shape
        flat = rewards.reshape(-1)
        valid = torch.ones_like(flat, dtype=torch.bool)
        binary = binary_rewards(flat, valid, reward_threshold)
        group_index = torch.arange(num_prompts, device=flat.device).repeat_interleave(group_size)
        sizes = torch.full(
            (num_prompts,), float(group_size), dtype=torch.float64, device=flat.device
        )
        success_count = binary.reshape(num_prompts, group_size).sum(dim=1)
        return cls(binary, valid, group_index, sizes, success_count)
