"""The NeMo-RL estimator adapter on CPU, without NeMo-RL: config forms, shapes, masks, errors."""

from __future__ import annotations

import pytest
import torch
from pydantic import BaseModel, ConfigDict

from nemo_mmpo import (
    MMPOInputError,
    compute_advantages,
    group_ids_from_prompt_rows,
    moment_diagnostics,
    moment_objective,
)
from nemo_mmpo.nemo_rl import MMPOAdvantageEstimator, read_estimator_settings


class PydanticEstimatorConfig(BaseModel):
    """Stands in for NeMo-RL main's ``AdvEstimatorConfig`` (a model with extra fields)."""

    model_config = ConfigDict(extra="allow")
    name: str = "grpo"
    normalize_rewards: bool = True
    use_leave_one_out_baseline: bool = True


def batch(num_prompts=4, group_size=8, seq_len=5, seed=0):
    generator = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, 100, (num_prompts, 6), generator=generator)
    prompt_ids = prompts.repeat_interleave(group_size, dim=0)
    permutation = torch.randperm(prompt_ids.shape[0], generator=generator)
    rewards = (torch.rand(prompt_ids.shape[0], generator=generator) < 0.4).float()
    mask = torch.ones(prompt_ids.shape[0], seq_len)
    mask[:, -1] = 0
    return prompt_ids[permutation], rewards, mask


@pytest.mark.parametrize("as_model", [False, True])
@pytest.mark.parametrize(
    ("config", "estimator", "options", "objective"),
    [
        (
            {"name": "mmpo", "truncation_order": 4, "estimator": "plugin"},
            "plugin",
            {},
            moment_objective("mmpo", 4),
        ),
        (
            {"name": "mmpo", "truncation_order": 3, "estimator": "unbiased"},
            "unbiased",
            {},
            moment_objective("mmpo", 3),
        ),
        (
            {
                "name": "mmpo",
                "truncation_order": 4,
                "estimator": "unbiased",
                "moment_transform": "beta",
                "transform_alpha": 0.5,
                "transform_beta": 1.0,
            },
            "unbiased",
            {},
            moment_objective("mmpo", 4, transform="beta", alpha=0.5, beta=1.0),
        ),
        ({"name": "passk_chen", "k": 3}, "passk_chen", {"k": 3}, None),
        ({"name": "pkpo", "k": 2}, "pkpo", {"k": 2}, None),
        ({"name": "maxrl"}, "maxrl", {"maclaurin_order": None}, None),
        ({"name": "maxrl", "maclaurin_order": 4}, "maxrl", {"maclaurin_order": 4}, None),
    ],
)
def test_adapter_gives_the_core_library_values(config, estimator, options, objective, as_model):
    estimator_config = PydanticEstimatorConfig(**config) if as_model else config
    adapter = MMPOAdvantageEstimator(estimator_config, loss_config=None)
    prompt_ids, rewards, mask = batch()
    advantages = adapter.compute_advantage(prompt_ids=prompt_ids, rewards=rewards, mask=mask)
    assert advantages.shape == mask.shape
    expected = compute_advantages(
        rewards, group_ids_from_prompt_rows(prompt_ids), objective, estimator, **options
    )
    assert torch.equal(advantages[:, 0], expected)
    assert torch.equal(advantages, expected[:, None].expand(mask.shape))


def test_valid_mask_excludes_rows_from_group_statistics():
    adapter = MMPOAdvantageEstimator({"name": "mmpo", "truncation_order": 2})
    prompt_ids, rewards, mask = batch()
    valid = torch.ones_like(rewards)
    valid[::3] = 0
    advantages = adapter.compute_advantage(prompt_ids, rewards, mask, valid_mask=valid)
    kept = valid.bool()
    expected = compute_advantages(
        rewards[kept], group_ids_from_prompt_rows(prompt_ids[kept]), moment_objective("mmpo", 2)
    )
    assert torch.equal(advantages[kept, 0], expected)
    assert torch.count_nonzero(advantages[~kept]) == 0


def test_every_metric_equals_the_core_library_on_a_masked_batch():
    """Each ``mmpo/`` metric, value by value, on a batch where ``valid_mask`` drops rows (one
    group entirely): group statistics are ``moment_diagnostics`` of the valid rows, and the
    advantage statistics are over the valid rows' advantages (the masked rows' advantages
    are 0, so a mean over every row would be lower)."""
    adapter = MMPOAdvantageEstimator({"name": "mmpo", "truncation_order": 4})
    prompt_ids, rewards, mask = batch(num_prompts=5, seed=3)
    group_ids = group_ids_from_prompt_rows(prompt_ids)
    valid = torch.ones_like(rewards)
    valid[::3] = 0
    valid[group_ids == group_ids[1]] = 0
    advantages = adapter.compute_advantage(prompt_ids, rewards, mask, valid_mask=valid)[:, 0]
    kept = valid.bool()
    metrics = adapter.last_metrics
    expected = moment_diagnostics(rewards, group_ids, 4, valid)
    assert expected == moment_diagnostics(rewards[kept], group_ids[kept], 4)
    assert expected["num_groups"] == 4  # the emptied group is not counted
    for key, value in expected.items():
        assert metrics[f"mmpo/{key}"] == pytest.approx(value, rel=1e-12), key
    core = compute_advantages(rewards[kept], group_ids[kept], moment_objective("mmpo", 4)).double()
    assert metrics["mmpo/advantage_abs_mean"] == pytest.approx(core.abs().mean().item(), rel=1e-6)
    assert metrics["mmpo/advantage_abs_max"] == pytest.approx(core.abs().max().item(), rel=1e-6)
    assert core.abs().mean() > advantages.double().abs().mean()  # the mask matters here


def test_metrics_are_prefixed_and_describe_the_batch():
    adapter = MMPOAdvantageEstimator({"name": "mmpo", "truncation_order": 4})
    prompt_ids, rewards, mask = batch()
    adapter.compute_advantage(prompt_ids, rewards, mask)
    metrics = adapter.last_metrics
    assert all(key.startswith("mmpo/") for key in metrics)
    for key in (
        "failure_moment_4",
        "truncated_first_success_time",
        "weight_max",
        "no_signal_fraction",
        "advantage_abs_max",
    ):
        assert f"mmpo/{key}" in metrics
    assert metrics["mmpo/num_groups"] == 4
    assert metrics["mmpo/success_rate"] == pytest.approx(float(rewards.mean()))


def test_non_binary_rewards_name_the_nemo_rl_settings():
    adapter = MMPOAdvantageEstimator({"name": "mmpo"})
    prompt_ids, rewards, mask = batch()
    rewards[3] = 0.7
    with pytest.raises(MMPOInputError) as error:
        adapter.compute_advantage(prompt_ids, rewards, mask)
    message = str(error.value)
    for fragment in ("0.7", "grpo.reward_scaling.enabled=false", "reward_threshold"):
        assert fragment in message
    thresholded = MMPOAdvantageEstimator({"name": "mmpo", "reward_threshold": 0.5})
    thresholded.compute_advantage(prompt_ids, rewards, mask)


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({"name": "grpo"}, "grpo.adv_estimator.name='grpo'"),
        ({"name": "mmpo", "estimator": "exact"}, "grpo.adv_estimator.estimator='exact'"),
        ({"name": "mmpo", "truncation_order": 0}, "grpo.adv_estimator.truncation_order=0"),
        ({"name": "mmpo", "moment_transform": "gamma"}, "moment_transform='gamma'"),
        ({"name": "mmpo", "moment_transform": "constant"}, "constant=None"),
        ({"name": "mmpo", "moment_transform": "beta", "transform_alpha": 1.0}, "beta=None"),
        ({"name": "pkpo", "k": "3"}, "grpo.adv_estimator.k='3': give an integer"),
        ({"name": "pkpo", "k": 0}, "grpo.adv_estimator.k=0: give a value >= 1"),
        ({"name": "mmpo", "estimator": "pkpo"}, "estimators with their own name"),
        ({"name": "maxrl", "maclaurin_order": 2.5}, "maclaurin_order=2.5"),
    ],
)
def test_bad_config_is_named(config, fragment):
    with pytest.raises(MMPOInputError) as error:
        read_estimator_settings(config)
    assert fragment in str(error.value)


def test_unbiased_order_above_group_size_is_reported_with_the_group_size():
    adapter = MMPOAdvantageEstimator(
        {"name": "mmpo", "truncation_order": 9, "estimator": "unbiased"}
    )
    prompt_ids, rewards, mask = batch()
    with pytest.raises(MMPOInputError, match="only 8 valid"):
        adapter.compute_advantage(prompt_ids, rewards, mask)


def test_names_come_from_the_core_registry_and_a_new_estimator_needs_no_adapter_edit():
    from nemo_mmpo import estimators, register_estimator
    from nemo_mmpo.nemo_rl import estimator_names
    from nemo_mmpo.nemo_rl.estimator_settings import mmpo_formulas

    # one spelling per estimator: baselines by name, MMPO's formulas as name=mmpo, estimator=X
    assert set(estimator_names()) == {"mmpo", "pkpo", "passk_chen", "maxrl"}
    assert set(mmpo_formulas()) == {"plugin", "unbiased", "empirical_bayes", "grpo"}
    assert "grpo" not in estimator_names()  # NeMo-RL's own name is never shadowed
    with pytest.raises(MMPOInputError, match="name=mmpo, estimator=plugin"):
        read_estimator_settings({"name": "plugin"})

    @register_estimator("halved_plugin_for_test", family="mmpo")
    def halved(groups, objective, scale: float = 0.5):
        return scale * estimators.get_estimator("plugin")(groups, objective)

    try:
        adapter = MMPOAdvantageEstimator(
            {"name": "mmpo", "estimator": "halved_plugin_for_test", "scale": 0.25}
        )
        prompt_ids, rewards, mask = batch()
        advantages = adapter.compute_advantage(prompt_ids, rewards, mask)
        plugin = compute_advantages(
            rewards, group_ids_from_prompt_rows(prompt_ids), moment_objective("mmpo", 4)
        )
        assert torch.equal(advantages[:, 0], 0.25 * plugin)
    finally:
        estimators._REGISTRY.pop("halved_plugin_for_test")


@pytest.mark.parametrize("estimator", ["grpo", "empirical_bayes"])
def test_any_registered_estimator_through_the_mmpo_name(estimator):
    adapter = MMPOAdvantageEstimator({"name": "mmpo", "estimator": estimator})
    prompt_ids, rewards, mask = batch()
    advantages = adapter.compute_advantage(prompt_ids, rewards, mask)
    expected = compute_advantages(
        rewards, group_ids_from_prompt_rows(prompt_ids), adapter.objective, estimator
    )
    assert torch.equal(advantages[:, 0], expected)


@pytest.mark.parametrize(
    ("config", "order"),
    [({"name": "mmpo", "truncation_order": 6}, 6), ({"name": "pkpo", "truncation_order": 5}, 5)],
)
def test_diagnostics_follow_the_configured_truncation_order(config, order):
    adapter = MMPOAdvantageEstimator(config)
    adapter.compute_advantage(*batch())
    assert f"mmpo/failure_moment_{order}" in adapter.last_metrics
    assert f"mmpo/failure_moment_{order + 1}" not in adapter.last_metrics


def test_prompts_sharing_a_prefix_or_first_token_form_their_own_groups():
    shared = torch.tensor(
        [[5, 6, 7, 0], [5, 6, 8, 0], [5, 9, 9, 9], [5, 6, 7, 1], [5, 6, 7, 0], [5, 6, 8, 0]]
    )
    prompt_ids = shared.repeat_interleave(2, dim=0)
    _, inverse = torch.unique(prompt_ids, dim=0, return_inverse=True)
    group_ids = group_ids_from_prompt_rows(prompt_ids)
    assert torch.equal(group_ids[:, None] == group_ids[None, :], inverse[:, None] == inverse)


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({"name": "mmpo", "trunc_order": 3}, "grpo.adv_estimator.trunc_order=3"),
        ({"name": "MMPO"}, "did you mean 'mmpo'"),
        ({"name": "mmpo", "estimator": "grpo", "leave_one_out": "yes"}, "leave_one_out='yes'"),
        ({"name": "pkpo", "k": None}, "grpo.adv_estimator.k=None"),
        ({"name": "maxrl", "epsilon": "small"}, "epsilon='small'"),
    ],
)
def test_unknown_keys_and_values_are_named(config, fragment):
    with pytest.raises(MMPOInputError) as error:
        read_estimator_settings(config)
    assert fragment in str(error.value)


def test_token_weighted_advantage_metrics_follow_the_loss_mask():
    """``mmpo/advantage_token_*`` weigh each rollout by its loss tokens (``mask[:, 1:]``,
    where the trainer's mask is ``token_mask * sample_mask``): a masked rollout counts 0."""
    adapter = MMPOAdvantageEstimator({"name": "mmpo", "truncation_order": 4})
    prompt_ids, rewards, mask = batch(seq_len=7)
    generator = torch.Generator().manual_seed(5)
    mask = (torch.rand(mask.shape, generator=generator) < 0.7).float()
    mask[:, 0] = 1.0  # the first position is not a loss token
    mask[::5] = 0.0  # sample_mask = 0 rows
    advantages = adapter.compute_advantage(prompt_ids, rewards, mask).double()
    tokens = mask[:, 1:].double()
    total = tokens.sum().item()
    metrics = adapter.last_metrics
    loss_advantages = advantages[:, 1:]
    assert metrics["mmpo/advantage_token_mean"] == pytest.approx(
        (loss_advantages * tokens).sum().item() / total, rel=0, abs=1e-6
    )
    assert metrics["mmpo/advantage_abs_token_mean"] == pytest.approx(
        (loss_advantages.abs() * tokens).sum().item() / total, rel=0, abs=1e-6
    )
    assert metrics["mmpo/positive_advantage_token_fraction"] == pytest.approx(
        ((loss_advantages > 0) * tokens).sum().item() / total, rel=0, abs=1e-12
    )


def test_option_types_come_from_the_estimator_signature():
    """``maclaurin_order: int | None`` takes null; ``epsilon: float`` takes an integer."""
    settings = read_estimator_settings({"name": "maxrl", "maclaurin_order": None, "epsilon": 0})
    assert settings.options == {"maclaurin_order": None, "epsilon": 0.0}
