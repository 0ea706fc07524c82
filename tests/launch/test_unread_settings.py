"""Every setting a user writes is either read or reported: a key that validates but that the
chosen estimator, loss or configuration does not read is named by ``--dry-run``, by the
estimator at construction and once in a run's log; each estimator's group-size need is
declared once, with its registration, and both the runtime check and ``--dry-run`` use it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import patience
import pytest
import torch
from nemo_rl_support import nemo_rl_checkout

from nemo_mmpo import MMPOInputError, compute_advantages, moment_objective, settings
from nemo_mmpo.estimators import _REGISTRY, GroupSizeNeed, register_estimator
from nemo_mmpo.launch.rules import check
from nemo_mmpo.nemo_rl.advantage_estimator import MMPOAdvantageEstimator
from nemo_mmpo.nemo_rl.estimator_settings import unread_estimator_settings
from nemo_mmpo.recipes import load

ROOT = Path(__file__).resolve().parents[2]
ENTRY_POINT = ROOT / "examples" / "run_mmpo_math.py"
RECIPES = ROOT / "examples" / "configs"

# The four settings the issue found accepted and then ignored, and what --dry-run must name.
IGNORED_BEFORE = [
    (
        ["grpo.adv_estimator.name=maxrl", "grpo.adv_estimator.k=7"],
        ["grpo.adv_estimator.k=7 is not read", "name=maxrl", "passk_chen, pkpo"],
    ),
    (
        ["grpo.adv_estimator.estimator=plugin", "grpo.adv_estimator.maclaurin_order=3"],
        ["grpo.adv_estimator.maclaurin_order=3 is not read", "estimator=plugin", "maxrl"],
    ),
    (
        ["grpo.adv_estimator.transform_alpha=0.5"],
        ["grpo.adv_estimator.transform_alpha=0.5 is not read", "moment_transform=beta"],
    ),
    (
        ["++loss_fn.dmpo_weight=5"],
        ["loss_fn.dmpo_weight=5 is not read", "loss_fn.name='mmpo'", "loss_fn.name=dmpo"],
    ),
]


@pytest.fixture(autouse=True)
def checkout():
    return nemo_rl_checkout()


@pytest.fixture
def fresh_reports(monkeypatch):
    """A process that has reported nothing yet (reports are once per process)."""
    monkeypatch.setattr(settings, "_REPORTED", set())


def warnings_of(recipe: str, *overrides: str) -> list[str]:
    findings = check(load(RECIPES / recipe, list(overrides)).config)
    assert not findings.errors, findings.errors
    return findings.warnings


@pytest.mark.parametrize(
    ("overrides", "fragments"), IGNORED_BEFORE, ids=["k", "maclaurin", "alpha", "dmpo"]
)
def test_dry_run_names_each_setting_that_nothing_reads(overrides, fragments):
    result = patience.run(
        [sys.executable, str(ENTRY_POINT), "--dry-run", *overrides],
        capture_output=True,
        text=True,
        timeout=patience.COMMAND_S,
    )
    assert result.returncode == 0, result.stdout + result.stderr  # reported, not refused
    warnings = [line for line in result.stdout.splitlines() if line.startswith("WARNING: ")]
    for fragment in fragments:
        assert any(fragment in line for line in warnings), (fragment, warnings)


def test_shipped_recipes_carry_no_unread_setting():
    from nemo_mmpo.checkout import find_nemo_rl_root
    from nemo_mmpo.launch import trainers

    root = find_nemo_rl_root()
    has_single_controller = (root / trainers.SINGLE_CONTROLLER_SCRIPT).is_file()
    for recipe in sorted(RECIPES.glob("*.yaml")):
        config = load(recipe).config
        single_controller = trainers.is_single_controller(config)
        findings = check(config)
        if single_controller and not has_single_controller:
            # refused in one line there (v0.7.0); every other rule still reads the recipe
            assert findings.errors == [trainers.missing_single_controller(root)]
        else:
            assert not findings.errors, (recipe.name, findings.errors)
        unread = [item for item in findings.warnings if "not read" in item]
        assert unread == [], (recipe.name, unread)


def test_read_settings_and_defaults_are_not_reported():
    # pass@K reads k; a key at its default is not "set"; MaxRL reads maclaurin_order
    assert unread_estimator_settings({"name": "passk_chen", "k": 5}) == []
    assert unread_estimator_settings({"name": "maxrl", "k": 3}) == []  # k's default
    assert unread_estimator_settings({"name": "maxrl", "maclaurin_order": 4}) == []
    assert (
        unread_estimator_settings(
            {
                "name": "mmpo",
                "moment_transform": "beta",
                "transform_alpha": 0.5,
                "transform_beta": 1.0,
            }
        )
        == []
    )
    # NeMo-RL's own keys ride along in its base recipes and are NeMo-RL's business
    assert unread_estimator_settings({"name": "mmpo", "use_leave_one_out_baseline": True}) == []


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"name": "maxrl", "estimator": "unbiased"}, "grpo.adv_estimator.estimator='unbiased'"),
        ({"name": "passk_chen", "moment_transform": "constant"}, "moment_transform='constant'"),
        ({"name": "mmpo", "estimator": "unbiased", "epsilon": 0.1}, "epsilon=0.1"),
        ({"name": "mmpo", "transform_constant": 0.5}, "transform_constant=0.5"),
    ],
)
def test_each_unread_estimator_key_is_named(section, key):
    (message,) = unread_estimator_settings(section)
    assert key in message and "this run ignores it" in message


def test_estimator_reports_unread_keys_at_construction_once_per_process(fresh_reports, capsys):
    estimator = MMPOAdvantageEstimator({"name": "maxrl", "k": 7})
    assert len(estimator.unread_settings) == 1 and "k=7" in estimator.unread_settings[0]
    MMPOAdvantageEstimator({"name": "maxrl", "k": 7})
    printed = capsys.readouterr().out
    assert printed.count("[nemo-mmpo] WARNING: grpo.adv_estimator.k=7 is not read") == 1


def test_the_plan_marks_what_it_printed_so_the_run_does_not_repeat_it(fresh_reports, capsys):
    from nemo_mmpo.launch.train import check_and_plan

    check_and_plan(
        RECIPES / "mmpo_math_qwen3_1.7b.yaml", ["grpo.adv_estimator.transform_alpha=0.5"], False
    )
    MMPOAdvantageEstimator({"name": "mmpo", "transform_alpha": 0.5})
    printed = capsys.readouterr().out
    assert printed.count("transform_alpha=0.5 is not read") == 1


def test_disabled_sections_and_async_only_cpu_keys_are_reported():
    evaluation_off = warnings_of(
        "mmpo_math_qwen3_1.7b.yaml", "evaluation.enabled=false", "evaluation.samples=4"
    )
    assert any(
        "evaluation.enabled=false" in item and "evaluation.samples=4" in item
        for item in evaluation_off
    )
    synchronous = warnings_of(
        "mmpo_tiny_cpu.yaml",
        "cpu_backend.stall_timeout_s=60",
        "+cpu_backend.placement.generation={num_cpus: 1}",
    )
    assert any("cpu_backend.stall_timeout_s=60" in item for item in synchronous)
    assert any("cpu_backend.placement.generation=" in item for item in synchronous)
    asynchronous = warnings_of("mmpo_tiny_cpu_async.yaml", "cpu_backend.stall_timeout_s=60")
    assert not any("not read" in item for item in asynchronous)
    tiny_off = warnings_of(
        "mmpo_tiny_cpu.yaml",
        "cpu_backend.enabled=false",
        "cpu_backend.seed=3",
        "evaluation.in_loop=false",
    )
    assert any(
        "cpu_backend.enabled=false" in item and "cpu_backend.seed=3" in item for item in tiny_off
    )


def test_dmpo_keys_are_read_under_dmpo_and_reported_under_clipped_pg():
    assert not any("not read" in item for item in warnings_of("dmpo_math_qwen3_1.7b.yaml"))
    under_clipped_pg = warnings_of(
        "grpo_math_qwen3_1.7b.yaml", "loss_fn.name=clipped_pg", "++loss_fn.dmpo_temperature=0.5"
    )
    assert any("loss_fn.dmpo_temperature=0.5 is not read" in item for item in under_clipped_pg)


def test_a_new_estimators_group_size_need_reaches_the_run_and_the_dry_run():
    """One declaration with the registration: the call is checked and --dry-run refuses."""

    def at_least_order_plus_one(objective, options):
        order = objective.truncation_order
        return GroupSizeNeed(order + 1, f"G > truncation_order T={order}", "lower truncation_order")

    @register_estimator(
        "needs_more_than_order_for_test", family="mmpo", group_size=at_least_order_plus_one
    )
    def estimator(groups, objective):
        return groups.rewards - groups.gather(groups.success_rate)

    try:
        rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
        group_ids = torch.zeros(4, dtype=torch.long)
        compute_advantages(
            rewards, group_ids, moment_objective("mmpo", 3), "needs_more_than_order_for_test"
        )
        with pytest.raises(MMPOInputError, match=r"G > truncation_order T=4.*only 4 valid"):
            compute_advantages(
                rewards, group_ids, moment_objective("mmpo", 4), "needs_more_than_order_for_test"
            )
        with pytest.raises(MMPOInputError, match="T=4"):  # the decorated function is checked too
            from nemo_mmpo.grouping import RewardGroups

            estimator(RewardGroups.from_dense(rewards[None]), moment_objective("mmpo", 4))
        overrides = [
            "grpo.adv_estimator.estimator=needs_more_than_order_for_test",
            "grpo.num_generations_per_prompt=4",
            "policy.train_global_batch_size=16",
        ]
        findings = check(load(RECIPES / "mmpo_math_qwen3_1.7b.yaml", overrides).config)
        assert any(
            "estimator=needs_more_than_order_for_test with grpo.num_generations_per_prompt=4"
            in error
            and "G > truncation_order T=4" in error
            for error in findings.errors
        ), findings.errors
    finally:
        _REGISTRY.pop("needs_more_than_order_for_test")


def test_a_section_that_does_not_validate_is_named_once_by_its_own_rule():
    config = load(RECIPES / "mmpo_math_qwen3_1.7b.yaml", ["+grpo.adv_estimator.trunc_order=3"])
    errors = check(config.config).errors
    assert sum("trunc_order=3 is not a setting" in error for error in errors) == 1, errors


def test_the_single_controller_reads_none_of_the_rigs_engine_settings():
    """NeMo-RL's single controller places and drives its own vLLM engine and watches itself:
    the rig's per-rollout seeds, stall timeout and generation placement are named unread."""
    from nemo_mmpo.cpu.rig.rig_settings import unread_cpu_settings

    section = {"enabled": True, "policy": "megatron", "engine": "vllm"}
    changed = dict(section, seeded_rollouts=True, stall_timeout_s=60)
    unread = unread_cpu_settings(changed, asynchronous=False, single_controller=True)
    assert [line.split(" is not read")[0] for line in unread] == [
        "cpu_backend.seeded_rollouts=True",
        "cpu_backend.stall_timeout_s=60",
    ]
    assert all("NeMo-RL's single controller (async_rl)" in line for line in unread)
    assert unread_cpu_settings(section, asynchronous=False, single_controller=True) == []
