"""Our estimator names in NeMo-RL's ``Literal`` estimator config, in #3773's merged shape: two
``MasterConfig`` s (``grpo``'s, and the single controller's, where ``grpo`` is optional beside
``ppo``) hold one ``GRPOConfig``; each accepts our names whichever is rebuilt first. Models
written here in that shape; on NeMo-RL's own: ``nemo_rl_adapter/test_next_estimator_api.py``."""

from __future__ import annotations

from typing import Literal, Optional

import pytest
from pydantic import BaseModel, Field, ValidationError

from nemo_mmpo.nemo_rl.newer_nemo_rl import accept_our_estimator_names, unreachable_literal


def merged_shape():
    class AdvEstimatorConfig(BaseModel, extra="allow"):
        name: Literal["grpo", "gdpo", "opd", "reinforce_plus_plus"] = "grpo"

    class GAEConfig(BaseModel, extra="allow"):
        name: Literal["gae", "raw_reward"] = "gae"

    class GRPOConfig(BaseModel, extra="allow"):
        adv_estimator: AdvEstimatorConfig = Field(default_factory=AdvEstimatorConfig)

    class PPOConfig(BaseModel, extra="allow"):
        adv_estimator: GAEConfig = Field(default_factory=GAEConfig)

    class MasterConfig(BaseModel, extra="allow"):  # grpo.py's
        grpo: GRPOConfig

    class SingleControllerMasterConfig(BaseModel, extra="allow"):
        grpo: Optional[GRPOConfig] = None  # noqa: UP045 (as NeMo-RL writes it)
        ppo: Optional[PPOConfig] = None  # noqa: UP045

    return MasterConfig, SingleControllerMasterConfig, PPOConfig


@pytest.mark.parametrize("first", [0, 1], ids=["grpo-first", "single-controller-first"])
def test_both_master_configs_accept_our_names_whichever_is_rebuilt_first(first):
    grpo_master, sc_master, ppo = merged_shape()
    masters = [grpo_master, sc_master]
    for master in (masters[first], masters[1 - first]):
        with pytest.raises(ValidationError):
            master(grpo={"adv_estimator": {"name": "mmpo"}})
        accept_our_estimator_names(master)
        assert master(grpo={"adv_estimator": {"name": "mmpo"}}).grpo.adv_estimator.name == "mmpo"
        assert unreachable_literal(master) is None
    for master in masters:
        assert master(grpo={"adv_estimator": {"name": "gdpo"}})
        with pytest.raises(ValidationError):
            master(grpo={"adv_estimator": {"name": "mmpoo"}})
        assert accept_our_estimator_names(master) == []  # idempotent: all current
    with pytest.raises(ValidationError):  # PPO's estimator names are not ours to widen
        ppo(adv_estimator={"name": "mmpo"})


def test_a_literal_behind_a_union_of_models_is_named():
    class One(BaseModel):
        name: Literal["grpo"] = "grpo"

    class Other(BaseModel):
        name: Literal["gae"] = "gae"

    class GRPOConfig(BaseModel):
        adv_estimator: One | Other = Field(default_factory=One)

    class MasterConfig(BaseModel):
        grpo: GRPOConfig

    assert accept_our_estimator_names(MasterConfig) == []
    problem = unreachable_literal(MasterConfig)
    assert problem is not None and "grpo.adv_estimator.name is a Literal" in problem
    assert "cannot reach" in problem and "\n" not in problem
