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

import pytest
from nemo_rl_copies import forget_new_modules, load_changed, metrics_argument  # noqa: F401 (fixture)
from nemo_rl_support import import_nemo_rl, master_config_from_recipe

pytestmark = pytest.mark.nemo_rl
grpo = import_nemo_rl("nemo_rl.algorithms.grpo")
import test_trainer_loop
from test_trainer_loop import TINY_RUN, estimator_calls, run_trainer  # noqa: F401 (fixture)

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.nemo_rl import install
from nemo_mmpo.nemo_rl.contract import nemo_rl_version

MMPO, DMPO = "mmpo_math_qwen3_1.7b.yaml", "dmpo_math_qwen3_1.7b.yaml"


def metrics_to_a_copy(source: str) -> str:
    """``grpo_train`` passes the metrics hook ``dict(metrics)``, not the step's metrics."""
    return metrics_argument(source, "dict(metrics)")


def penalty_metrics_elsewhere(source: str) -> str:
    """``grpo_train`` merges the penalties hook's metrics into another dict than the step's."""
    old = "                metrics.update(penalty_metrics)\n"
    assert source.count(old) == 2  # grpo_train's, then async_grpo_train's
    return source.replace(old, "                extra_metrics = dict(penalty_metrics)\n", 1)


def advantages_clamped(source: str) -> str:
    """``_clip_grpo_advantages`` clamps at 0 whatever the config says (every loss token of a
    failed response in a mixed group then differs from the estimator's negative advantage)."""
    changed, count = re.subn(
        r'(def _clip_grpo_advantages\(.*?""".*?"""\n)',
        r"\1    advantages = advantages.clamp(min=0.0)\n",
        source,
        count=1,
        flags=re.DOTALL,
    )
    assert count == 1
    return changed


def first_response_masked(source: str) -> str:
    """``grpo_train`` drops its first response from the loss after the estimator counted it."""
    changed, count = re.subn(
        r"(\n( +)train_results = policy\.train\()",
        r'\n\2train_data["sample_mask"][0] = 0\1',
        source,
        count=1,
    )
    assert count == 1
    return changed


def no_validation_at_its_period(source: str) -> str:
    """``grpo_train`` validates only at the end (a period check gone wrong)."""
    old = "(total_steps + 1) % val_period == 0"
    assert source.count(old) == 1
    return source.replace(old, "(total_steps + 1) % val_period == -1")


def no_validation_without_a_dataloader(source: str) -> str:
    old = "    if val_at_start and current_step == 0:\n"
    assert source.count(old) == 1
    return source.replace(
        old, "    if val_at_start and current_step == 0 and val_dataloader is not None:\n"
    )


@pytest.mark.usefixtures("forget_new_modules")
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
        (advantages_clamped, MMPO, [], "trains its first step (train) on "),
        (
            first_response_masked,
            MMPO,
            [],
            "trains its first step (train) on a loss mask that leaves out",
        ),
        (
            no_validation_at_its_period,
            MMPO,
            ["grpo.val_period=1", "evaluation.enabled=true", "evaluation.in_loop=true"],
            "grpo.val_period=1: NeMo-RL",
        ),
    ],
    ids=[
        "metrics-to-a-copy",
        "dmpo-metrics-elsewhere",
        "validation-skipped",
        "advantages-clamped",
        "first-response-masked",
        "no-validation-at-its-period",
    ],
)
def test_a_first_step_without_its_outcome_stops_the_run_in_one_line(
    change, recipe, overrides, says, ray_cluster, tmp_path, monkeypatch
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
    # it stopped at the end of step 1 (NeMo-RL saves a step before logging it): no step 2;
    # advantages that are not the estimator's stop it before the policy trains on them
    trained_step_1 = "trains its first step" not in says
    assert (tmp_path / "checkpoints" / "step_1").exists() == trained_step_1
    assert not (tmp_path / "checkpoints" / "step_2").exists()


@pytest.mark.parametrize(
    "overrides",
    [
        ["grpo.advantage_clip_low=-0.5", "grpo.advantage_clip_high=0.5"],
        ["grpo.val_period=1", "evaluation.enabled=true", "evaluation.in_loop=true"],
    ],
    ids=["the-recipes-own-clip", "validation-every-step"],
)
def test_what_the_recipe_asks_for_passes_the_same_checks(
    overrides,
    ray_cluster,
    tmp_path,
    monkeypatch,
    estimator_calls,  # noqa: F811 (the imported fixture)
):
    """The unchanged trainer, with a clip the recipe sets (allowed for: NeMo-RL clamps as
    asked) or the paper's evaluation at every step, trains both steps (the evaluation itself
    recorded: the stand-in engine cannot sample it)."""
    from nemo_mmpo.nemo_rl import wrappers

    evaluated = []

    def evaluation(generation, step, settings, master_config=None, tokenizer=None):
        evaluated.append(step)
        return {"accuracy": 0.25}, {"total_validation_time": 1.0}

    monkeypatch.setattr(wrappers, "validate_in_loop", evaluation)
    install()
    config = master_config_from_recipe(MMPO, [*TINY_RUN, *overrides])
    policy, _, _ = run_trainer(grpo.grpo_train, config, tmp_path)
    assert (tmp_path / "checkpoints" / "step_2").exists()
    assert evaluated == ([1, 2] if "grpo.val_period=1" in overrides else [])
    if "grpo.advantage_clip_low=-0.5" in overrides:  # the clip did change the advantages
        assert max(float(call["advantages"].abs().max()) for call in estimator_calls) > 0.5
        trained = [call["data"]["advantages"] for call in policy.train_calls]
        assert max(float(advantages.abs().max()) for advantages in trained) <= 0.5


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
