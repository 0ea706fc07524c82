"""First-step outcome checks (:mod:`nemo_mmpo.nemo_rl.outcomes`), on NeMo-RL's real
``grpo_train`` changed as a release could change it, with every hook point kept: the trainer
hands its estimator metrics a copy of the step's metrics (they never reach the logger), merges
DMPO's batch-term metrics into another dict, or skips the validation at start without a
validation dataloader (the paper's in-loop evaluation never runs). Each run stops at the end of
step 1 in one line naming the trainer and NeMo-RL's version. The unchanged trainers pass the
same check in ``test_trainer_loop.py``'s runs.
"""

from __future__ import annotations

import re
import sys

import pytest
from nemo_rl_copies import load_changed
from nemo_rl_support import import_nemo_rl, master_config_from_recipe

pytestmark = pytest.mark.nemo_rl
grpo = import_nemo_rl("nemo_rl.algorithms.grpo")
import test_trainer_loop
from test_trainer_loop import TINY_RUN, run_trainer

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.nemo_rl import install
from nemo_mmpo.nemo_rl.contract import nemo_rl_version

MMPO, DMPO = "mmpo_math_qwen3_1.7b.yaml", "dmpo_math_qwen3_1.7b.yaml"


def metrics_to_a_copy(source: str) -> str:
    """``grpo_train`` passes the metrics hook ``dict(metrics)``, not the step's metrics."""
    changed, count = re.subn(
        r"(_log_mixed_rewards_and_advantages_information\(\s*logger=logger,\s*"
        r"total_steps=total_steps,\s*)metrics=metrics,",
        r"\1metrics=dict(metrics),",
        source,
    )
    assert count == 1
    return changed


def penalty_metrics_elsewhere(source: str) -> str:
    """``grpo_train`` merges the penalties hook's metrics into another dict than the step's."""
    old = "                metrics.update(penalty_metrics)\n"
    assert source.count(old) == 2  # grpo_train's, then async_grpo_train's
    return source.replace(old, "                extra_metrics = dict(penalty_metrics)\n", 1)


def no_validation_without_a_dataloader(source: str) -> str:
    old = "    if val_at_start and current_step == 0:\n"
    assert source.count(old) == 1
    return source.replace(
        old, "    if val_at_start and current_step == 0 and val_dataloader is not None:\n"
    )


@pytest.fixture
def forget_new_modules():
    imported_before = set(sys.modules)
    yield
    for name in set(sys.modules) - imported_before:
        if name.startswith("nemo_rl."):
            del sys.modules[name]


@pytest.mark.parametrize(
    ("change", "recipe", "overrides", "says"),
    [
        (metrics_to_a_copy, MMPO, [], "with no mmpo/ metrics (grpo.adv_estimator.name=mmpo)"),
        (penalty_metrics_elsewhere, DMPO, [], "with no dmpo/counted_groups (loss_fn.name=dmpo)"),
        (
            no_validation_without_a_dataloader,
            MMPO,
            ["grpo.val_at_start=true", "evaluation.enabled=true", "evaluation.in_loop=true"],
            "finished step 1 without running the paper's evaluation",
        ),
    ],
    ids=["metrics-to-a-copy", "dmpo-metrics-elsewhere", "validation-skipped"],
)
def test_a_first_step_without_its_outcome_stops_the_run_in_one_line(
    change, recipe, overrides, says, ray_cluster, tmp_path, monkeypatch, forget_new_modules
):
    changed = load_changed(grpo, change, monkeypatch)
    monkeypatch.setattr(test_trainer_loop, "grpo", changed)  # its loss built as setup() does
    install()
    config = master_config_from_recipe(recipe, [*TINY_RUN, *overrides])
    with pytest.raises(MMPOInputError) as error:
        run_trainer(changed.grpo_train, config, tmp_path)
    message = str(error.value)
    assert "\n" not in message and says in message, message
    assert f"NeMo-RL {nemo_rl_version()}'s grpo_train" in message, message
    # it stopped at the end of step 1 (NeMo-RL saves a step before logging it): no step 2
    assert (tmp_path / "checkpoints" / "step_1").exists()
    assert not (tmp_path / "checkpoints" / "step_2").exists()


def test_the_checking_logger_travels_as_nemo_rls_would():
    """NeMo-RL may copy its logger or hand it to a Ray actor (pickled): the wrapper survives
    both (its attribute lookups reach the logger only once it is built)."""
    import copy
    import pickle

    from trainer_standins import RecordingLogger

    from nemo_mmpo.nemo_rl.outcomes import FirstStepLogger

    checking = FirstStepLogger(RecordingLogger(), "grpo_train", {"loss_fn": {"name": "mmpo"}})
    for travelled in (pickle.loads(pickle.dumps(checking)), copy.deepcopy(checking)):
        travelled.log_metrics({"reward": 0.5}, 1, prefix="train")
        assert travelled._logger.metrics == {"train/reward": [(1, 0.5)]}
