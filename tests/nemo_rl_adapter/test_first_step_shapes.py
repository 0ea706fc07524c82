"""Issue 69's last two shapes of NeMo-RL under which ``install()`` passed its checks and training
differed without a word, applied to NeMo-RL's real ``grpo.py`` (loaded changed, in-process, as
in ``test_first_step_outcomes.py``) and run with the stand-ins of ``test_trainer_loop.py``:

- a trainer that reads estimator metrics only for NeMo-RL's own estimator classes: ``grpo_train``
  calls the metrics hook (where ``install()`` adds the ``mmpo/`` step metrics) only for them,
  or hands it a throwaway dict otherwise; ``async_grpo_train`` reads ``last_metrics`` only from
  its ``OPDAdvantageEstimator`` (the one class of NeMo-RL's that has them);
- a metrics call gated by a logger setting (``logger.log_advantage_stats``, off by default):
  ``grpo_train``'s metrics hook, ``async_grpo_train``'s ``last_metrics`` read.

Each run stops at the end of step 1 in one line naming the trainer and NeMo-RL's version (on
v0.7.0, ``async_grpo_train`` catches it and returns; the hooked trainer raises it again:
:data:`ASYNC_SHAPE`); the gated ``grpo_train`` with the setting on trains both
steps, and the unchanged trainers pass the same check in ``test_trainer_loop.py``
(``test_grpo_train_runs_our_estimator_and_loss``,
``test_async_grpo_train_runs_our_estimator_and_loss``). And ``async_grpo_train`` gaining
``grpo.async_grpo.overlap_validation`` (the paper's evaluation on a background thread) is
refused with ``evaluation.in_loop`` when the trainer starts, in one line, before step 1.
"""

from __future__ import annotations

import re
import sys

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

MMPO, ASYNC = "mmpo_math_qwen3_1.7b.yaml", "mmpo_math_qwen3_4b_async.yaml"
ASYNC_RUN = [*TINY_RUN, "grpo.async_grpo.max_trajectory_age_steps=1"]
NO_MMPO_METRICS = "with no mmpo/ metrics (grpo.adv_estimator.name=mmpo)"
#: NeMo-RL's estimator classes that grpo.py imports (v0.7.0 and main)
NEMO_RL_ESTIMATORS = (
    "(GRPOAdvantageEstimator, GDPOAdvantageEstimator, ReinforcePlusPlusAdvantageEstimator)"
)
#: the logger setting a release could gate the estimator metrics by (off unless set)
LOG_SETTING = 'master_config.logger.get("log_advantage_stats", False)'
LAST_METRICS_READ = (
    '                        hasattr(adv_estimator, "last_metrics")\n'
    "                        and adv_estimator.last_metrics\n"
)


#: v0.7.0's ``async_grpo_train`` prints what its loop raises and returns (grpo.py:4321-4325;
#: main's re-raises, grpo.py:5426): the hooked trainer raises the check's error again when it
#: returns (``wrappers.checking_first_step``), so the async shapes stop on both snapshots.
ASYNC_SHAPE = [pytest.mark.alternating]


def metrics_hook_only_if(condition: str, source: str) -> str:
    """``grpo_train`` calls ``_log_mixed_rewards_and_advantages_information`` only if
    ``condition`` holds (the call block indented under an ``if``)."""

    def guarded(match: re.Match) -> str:
        indent, call = match.group(1), match.group(0)
        body = "".join(f"    {line}" if line.strip() else line for line in call.splitlines(True))
        return f"{indent}if {condition}:\n{body}"

    changed, count = re.subn(
        r"^( +)_log_mixed_rewards_and_advantages_information\(\n.*?^\1\)\n",
        guarded,
        source,
        flags=re.MULTILINE | re.DOTALL,
    )
    assert count == 1  # grpo_train's (async_grpo_train reads last_metrics)
    return changed


def metrics_hook_for_nemo_rls_estimators(source: str) -> str:
    """``grpo_train`` logs the rewards' baseline and advantages only for NeMo-RL's estimators."""
    return metrics_hook_only_if(f"isinstance(adv_estimator, {NEMO_RL_ESTIMATORS})", source)


def throwaway_metrics_for_other_estimators(source: str) -> str:
    """``grpo_train`` hands the metrics hook the step's metrics for NeMo-RL's estimators only,
    a dict nobody reads otherwise."""
    return metrics_argument(
        source, f"metrics if isinstance(adv_estimator, {NEMO_RL_ESTIMATORS}) else {{}}"
    )


def metrics_hook_gated_by_a_logger_setting(source: str) -> str:
    return metrics_hook_only_if(LOG_SETTING, source)


def last_metrics_only_from_opd(source: str) -> str:
    """``async_grpo_train`` reads ``last_metrics`` from NeMo-RL's OPD estimator only."""
    assert source.count(LAST_METRICS_READ) == 1
    return source.replace(
        LAST_METRICS_READ,
        "                        isinstance(adv_estimator, OPDAdvantageEstimator)\n"
        "                        and adv_estimator.last_metrics\n",
    )


def last_metrics_gated_by_a_logger_setting(source: str) -> str:
    assert source.count(LAST_METRICS_READ) == 1
    return source.replace(
        LAST_METRICS_READ,
        f"                        {LOG_SETTING}\n                        and "
        + LAST_METRICS_READ.lstrip(),
    )


ASYNC_UTILS = "nemo_rl.algorithms.async_utils"


def async_run(trainer, config, tmp_path):
    """``trainer`` (a changed ``async_grpo_train``) as ``test_trainer_loop.async_trainer`` runs
    NeMo-RL's: its collector and replay buffer on this interpreter."""
    from nemo_mmpo.cpu.engines.ray_cluster import collector_on_this_interpreter

    system = import_nemo_rl("nemo_rl.distributed.virtual_cluster").PY_EXECUTABLES.SYSTEM
    with collector_on_this_interpreter(system):
        return run_trainer(trainer, config, tmp_path, max_trajectory_age_steps=1)


def run_changed(change, recipe, overrides, tmp_path, monkeypatch, trainer="grpo_train"):
    changed = load_changed(grpo, change, monkeypatch)
    monkeypatch.setattr(test_trainer_loop, "grpo", changed)  # its loss built as setup() does
    # a collector an earlier test imported holds another grpo's MasterConfig: Ray would pickle
    # its class by value and refuse this grpo's config (isinstance), so install() imports it
    # again against the changed grpo (the earlier one restored after the test)
    for name in [name for name in sys.modules if name.startswith(ASYNC_UTILS)]:
        monkeypatch.delitem(sys.modules, name)
    install()
    config = master_config_from_recipe(recipe, overrides)
    if trainer == "async_grpo_train":
        return async_run(changed.async_grpo_train, config, tmp_path)
    return run_trainer(getattr(changed, trainer), config, tmp_path)


SHAPES = [
    pytest.param(metrics_hook_for_nemo_rls_estimators, "grpo_train", id="hook-for-own-classes"),
    pytest.param(throwaway_metrics_for_other_estimators, "grpo_train", id="throwaway-metrics"),
    pytest.param(metrics_hook_gated_by_a_logger_setting, "grpo_train", id="hook-gated"),
    pytest.param(
        last_metrics_only_from_opd,
        "async_grpo_train",
        id="async-last-metrics-own-class",
        marks=ASYNC_SHAPE,
    ),
    pytest.param(
        last_metrics_gated_by_a_logger_setting,
        "async_grpo_train",
        id="async-last-metrics-gated",
        marks=ASYNC_SHAPE,
    ),
]


@pytest.mark.usefixtures("forget_new_modules")
@pytest.mark.parametrize(("change", "trainer"), SHAPES)
def test_estimator_metrics_that_never_reach_the_logger_stop_the_run_at_step_one(
    change, trainer, ray_cluster, tmp_path, monkeypatch
):
    recipe, overrides = (ASYNC, ASYNC_RUN) if trainer == "async_grpo_train" else (MMPO, TINY_RUN)
    with pytest.raises(MMPOInputError) as error:
        run_changed(change, recipe, overrides, tmp_path, monkeypatch, trainer)
    message = str(error.value)
    assert "\n" not in message and NO_MMPO_METRICS in message, message
    assert f"NeMo-RL {nemo_rl_version()}'s {trainer}" in message, message
    # the end of step 1 (NeMo-RL saves a step before logging it), and no step 2
    assert (tmp_path / "checkpoints" / "step_1").exists()
    assert not (tmp_path / "checkpoints" / "step_2").exists()


@pytest.mark.usefixtures("forget_new_modules")
def test_the_same_copy_with_its_logger_setting_on_trains_both_steps(
    ray_cluster, tmp_path, monkeypatch
):
    """The gate is the only change: with ``logger.log_advantage_stats`` set, our metrics reach
    the logger at both steps and the check passes (``grpo_train``; ``async_grpo_train``'s read
    is the same expression, and its run stops at the end of step 1 above, not before)."""
    overrides = [*TINY_RUN, "++logger.log_advantage_stats=true"]
    _, logger, _ = run_changed(
        metrics_hook_gated_by_a_logger_setting, MMPO, overrides, tmp_path, monkeypatch
    )
    assert (tmp_path / "checkpoints" / "step_2").exists()
    logged = logger.metrics["train/mmpo/failure_moment_4"]
    assert [step for step, _ in logged] == [1, 2]


def overlapped_validation(source: str) -> str:
    """``async_grpo_train`` gains ``grpo.async_grpo.overlap_validation``: its periodic
    validation submitted to a background thread while the next step trains (main's
    ``AsyncGRPOConfig`` declares the key; v0.7.0's reads it from its dict)."""
    declared = "    recompute_kv_cache_after_weight_updates: bool = False\n"
    if source.count(declared) == 1:  # main: a pydantic AsyncGRPOConfig
        source = source.replace(declared, declared + "    overlap_validation: bool = False\n")
        read = "master_config.grpo.async_grpo.overlap_validation"
    else:  # v0.7.0: a TypedDict
        read = 'master_config.grpo["async_grpo"].get("overlap_validation", False)'
    start = "def async_grpo_train(\n"
    head, body = source.split(start)
    old = (
        "                # Run validation if it's a validation step or last step with val_at_end\n"
    )
    assert body.count(old) == 1
    overlapped = (
        f"                if should_run_validation and {read}:\n"
        "                    import threading\n\n"
        "                    threading.Thread(\n"
        "                        target=validate,\n"
        "                        args=(policy_generation, val_dataloader, tokenizer),\n"
        "                        kwargs=dict(\n"
        "                            val_task_to_env=val_task_to_env,\n"
        "                            step=step + 1,\n"
        "                            master_config=master_config,\n"
        "                            logger=logger,\n"
        "                        ),\n"
        "                        daemon=True,\n"
        "                    ).start()\n"
        "                    should_run_validation = False\n"
    )
    return head + start + body.replace(old, overlapped + old)


@pytest.mark.usefixtures("forget_new_modules")
def test_overlapped_validation_in_a_copy_is_refused_before_step_one(
    ray_cluster,
    tmp_path,
    monkeypatch,
    estimator_calls,  # noqa: F811
):
    overrides = [
        *ASYNC_RUN,
        "++grpo.async_grpo.overlap_validation=true",
        "evaluation.enabled=true",
        "evaluation.in_loop=true",
    ]
    with pytest.raises(MMPOInputError) as error:
        run_changed(
            overlapped_validation, ASYNC, overrides, tmp_path, monkeypatch, "async_grpo_train"
        )
    message = str(error.value)
    assert "\n" not in message, message
    assert message.startswith(
        "evaluation.in_loop=true with grpo.async_grpo.overlap_validation=true: "
        f"NeMo-RL {nemo_rl_version()}'s async_grpo_train would run the hooked validate"
    ), message
    # refused when the trainer starts: no estimator call, nothing saved
    assert estimator_calls == []
    assert not list((tmp_path / "checkpoints").glob("step_*"))
