"""The first-step checker is transparent: NeMo-RL's logger receives each call exactly as the
trainer made it (NeMo-RL's own unit tests read ``log_metrics``'s keywords), and a recipe that
asks for nothing it checks is not wrapped at all (NeMo-RL's estimators, its unit tests)."""

from __future__ import annotations

from unittest import mock

import pytest

from nemo_mmpo.errors import MMPOInputError
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
    with pytest.raises(MMPOInputError, match="grpo_train logged step 1's train metrics with no"):
        logger.log_metrics({}, 1, prefix="timing/train")


def test_nothing_to_check_for_nemo_rls_own_estimator():
    assert not FirstStepLogger(mock.MagicMock(), "grpo_train", NEMO_RLS).checks_anything
    # a config model that lacks a declared section reads as absent, never raises
    assert not FirstStepLogger(mock.MagicMock(), "grpo_train", {}).checks_anything
