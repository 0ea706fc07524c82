"""The first-step checker is transparent: NeMo-RL's logger receives each call exactly as the
trainer made it (NeMo-RL's own unit tests read ``log_metrics``'s keywords), and a recipe that
asks for nothing it checks is not wrapped at all (NeMo-RL's estimators, its unit tests)."""

from __future__ import annotations

from unittest import mock

import pytest

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.nemo_rl import run_state
from nemo_mmpo.nemo_rl.outcomes import FirstStepLogger

OURS = {"grpo": {"adv_estimator": {"name": "mmpo"}}, "loss_fn": {"name": "mmpo"}}
NEMO_RLS = {"grpo": {"adv_estimator": {"name": "grpo"}}, "loss_fn": {}}


def test_calls_pass_through_as_made_and_a_missing_metric_stops_step_one():
    inner = mock.MagicMock()
    logger = FirstStepLogger(inner, "grpo_train", OURS)
    assert logger.checks_anything
    logger.log_metrics({"reward": 1.0}, 1, prefix="train")
    logger.log_metrics({"x": 1}, 1, "timing/other")
    assert inner.log_metrics.call_args_list == [
        mock.call({"reward": 1.0}, 1, prefix="train"),
        mock.call({"x": 1}, 1, "timing/other"),
    ]
    with pytest.raises(MMPOInputError, match="grpo_train logged step 1's metrics with no"):
        logger.log_metrics({}, 1, prefix="timing/train")


def test_the_first_step_counts_its_metrics_under_any_prefix():
    """A NeMo-RL that logs the estimator's metrics apart from ``train`` still shows them;
    one that ends its first step (``timing/train``) without any stops there."""
    logger = FirstStepLogger(mock.MagicMock(), "grpo_train", OURS)
    logger.log_metrics({"reward": 0.5}, 0, prefix="validation")  # val_at_start: not a step
    logger.log_metrics({"mmpo/weight_mean": 1.0}, 1, prefix="estimator")
    logger.log_metrics({"reward": 1.0}, 1, prefix="train")
    logger.log_metrics({}, 1, prefix="timing/train")
    assert not logger.checks_anything  # checked and passed
    silent = FirstStepLogger(mock.MagicMock(), "grpo_train", OURS)
    silent.log_metrics({"mmpo/weight_mean": 1.0}, 0, prefix="validation")  # another step's
    with pytest.raises(MMPOInputError, match="logged step 1's metrics with no mmpo/ metrics"):
        silent.log_metrics({"time": 1.0}, 1, prefix="timing/train")  # no train log at all


def test_a_trainer_that_trains_without_logging_a_step_stops_when_it_returns():
    logger = FirstStepLogger(mock.MagicMock(), "grpo_train", OURS)
    logger.policy = mock.MagicMock(seen=False)
    logger.log_metrics({"reward": 1.0}, 1, prefix="training")  # a prefix it does not know
    logger.check()  # nothing trained: nothing to say (a finished run resumed, say)
    logger.policy.seen = True
    with pytest.raises(MMPOInputError, match="returned without logging a train or timing/"):
        logger.check()
    assert logger.error is not None


def test_nothing_to_check_for_nemo_rls_own_estimator():
    assert not FirstStepLogger(mock.MagicMock(), "grpo_train", NEMO_RLS).checks_anything
    # a config model that lacks a declared section reads as absent, never raises
    assert not FirstStepLogger(mock.MagicMock(), "grpo_train", {}).checks_anything


def test_validation_is_due_at_the_first_multiple_of_its_period_from_the_first_step():
    """A run resumed at step 5 with ``grpo.val_period: 4`` must validate at step 8."""

    config = {
        "grpo": {"adv_estimator": {"name": "grpo"}, "val_period": 4},
        "evaluation": {"enabled": True, "in_loop": True, "benchmarks": {"aime24": None}},
    }
    logger = FirstStepLogger(mock.MagicMock(), "grpo_train", config)
    assert logger.checks_anything
    for step in range(5, 8):
        logger.log_metrics({}, step, prefix="train")
        logger.log_metrics({}, step, prefix="timing/train")
    assert logger.checks_anything  # step 8 not reached
    logger.log_metrics({}, 8, prefix="train")
    with pytest.raises(MMPOInputError, match=r"grpo.val_period=4: .* finished step 8 without"):
        logger.log_metrics({}, 8, prefix="timing/train")
    validated = FirstStepLogger(mock.MagicMock(), "grpo_train", config)
    run_state.RUN.in_loop_steps.append(8)
    for step in range(5, 9):
        validated.log_metrics({}, step, prefix="train")
        validated.log_metrics({}, step, prefix="timing/train")
    assert not validated.checks_anything  # checked, and nothing more to check


def test_advantages_differing_from_the_estimators_are_named():
    import torch

    from nemo_mmpo.nemo_rl.outcomes import advantage_difference, allowed_changes

    rows = torch.tensor([2.0, -1.0, 0.0])
    mask = torch.tensor([[0, 1, 1], [0, 1, 0], [0, 0, 0]], dtype=torch.float32)
    same = rows[:, None].expand(3, 3).clone()
    nothing = allowed_changes({"grpo": {}})
    assert advantage_difference(same, mask, rows, mask, nothing) is None
    # outside the estimator's mask anything goes (NeMo-RL's padding, zeroed rows)
    assert advantage_difference(same * (mask + 1), mask, rows, mask, nothing) is not None
    assert advantage_difference(same * mask, mask, rows, mask, nothing) is None
    clamped = same.clamp(-0.5, 0.5)
    assert "3 of 3 loss tokens differ (e.g. 0.5 where the estimator gave 2)" in (
        advantage_difference(clamped, mask, rows, mask, nothing)
    )
    clip = allowed_changes({"grpo": {"advantage_clip_low": -0.5, "advantage_clip_high": 0.5}})
    assert advantage_difference(clamped, mask, rows, mask, clip) is None
    penalized = same.clone()
    penalized[0, 2] = -3.0
    penalty = allowed_changes({"grpo": {"invalid_tool_call_advantage": -3.0}})
    assert advantage_difference(penalized, mask, rows, mask, penalty) is None
    assert advantage_difference(penalized, mask, rows, mask, nothing) is not None
    fewer = mask.clone()
    fewer[1] = 0
    assert "leaves out 1 and adds 0 of the 3 tokens" in (
        advantage_difference(same, fewer, rows, mask, nothing)
    )
    assert "shape [3, 2]" in advantage_difference(same[:, :2], mask, rows, mask, nothing)


def test_the_policy_check_sees_the_first_training_call_only():
    import torch

    from nemo_mmpo.nemo_rl.outcomes import FirstStepPolicy, allowed_changes

    estimator = mock.MagicMock()
    rows, mask = torch.tensor([1.0, -1.0]), torch.ones(2, 3)
    estimator.last_output = (rows, mask)
    inner = mock.MagicMock(spec=["train", "prepare_for_training"])
    policy = FirstStepPolicy(inner, "grpo_train", lambda: estimator, allowed_changes({}))
    policy.prepare_for_training()
    assert not policy.seen
    assert not hasattr(policy, "write_to_dataplane")  # NeMo-RL's hasattr answers unchanged
    batch = {"advantages": -rows[:, None].expand(2, 3), "token_mask": mask}
    with pytest.raises(MMPOInputError, match=r"grpo_train trains its first step \(train\) on 6"):
        policy.train(batch, "loss")
    assert policy.seen and inner.train.call_count == 0  # stopped before training on them
    policy.train(batch, "loss")  # later calls pass unchecked
    assert inner.train.call_count == 1
