"""Contract tests against the real NeMo-RL (skipped where it is not importable).

``bash scripts/test_nemo_rl.sh`` runs this folder on Python 3.13 against each NeMo-RL
snapshot (or ``NEMO_RL_PATH``); ``nemo_rl.algorithms.advantage_estimator``/``loss``/
``utils.config`` also import on Python 3.11 when NeMo-RL is on ``PYTHONPATH``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from nemo_rl_support import import_nemo_rl

pytestmark = pytest.mark.nemo_rl

advantage_module = import_nemo_rl("nemo_rl.algorithms.advantage_estimator")
loss_module = import_nemo_rl("nemo_rl.algorithms.loss")
batched_module = import_nemo_rl("nemo_rl.distributed.batched_data_dict")
config_module = import_nemo_rl("nemo_rl.utils.config")

from nemo_mmpo import compute_advantages, group_ids_from_prompt_rows, moment_objective
from nemo_mmpo.checkout import find_nemo_rl_root
from nemo_mmpo.nemo_rl import MMPOAdvantageEstimator

ROOT = Path(__file__).resolve().parents[2]


def nemo_rl_estimator_config(**values):
    config_class = getattr(advantage_module, "AdvEstimatorConfig", None)
    if config_class is not None and hasattr(config_class, "model_validate"):
        return config_class(**values)  # NeMo-RL main: a pydantic model
    return dict(values)  # v0.7.0: a TypedDict


def trainer_batch(seed=0):
    generator = torch.Generator().manual_seed(seed)
    prompts = torch.randint(1, 1000, (16, 12), generator=generator)
    prompts[:, -3:] = 0  # padding, as in the trainer's padded prompt matrix
    prompt_ids = prompts.repeat_interleave(8, dim=0)
    rewards = (torch.rand(128, generator=generator) < 0.35).float()
    mask = torch.ones(128, 20)
    return prompt_ids, rewards, mask


@pytest.mark.parametrize("leave_one_out", [False, True])
def test_order_one_equals_nemo_rl_grpo_without_std(leave_one_out):
    prompt_ids, rewards, mask = trainer_batch()
    theirs = advantage_module.GRPOAdvantageEstimator(
        nemo_rl_estimator_config(
            name="grpo", normalize_rewards=False, use_leave_one_out_baseline=leave_one_out
        ),
        None,
    ).compute_advantage(prompt_ids=prompt_ids, rewards=rewards, mask=mask)
    estimator = "unbiased" if leave_one_out else "plugin"
    ours = MMPOAdvantageEstimator(
        {"name": "mmpo", "truncation_order": 1, "estimator": estimator}
    ).compute_advantage(prompt_ids=prompt_ids, rewards=rewards, mask=mask)
    assert torch.allclose(ours, theirs, atol=1e-6)


@pytest.mark.parametrize("leave_one_out", [False, True])
def test_our_grpo_estimator_equals_nemo_rl_grpo_with_std(leave_one_out):
    prompt_ids, rewards, mask = trainer_batch(1)
    theirs = advantage_module.GRPOAdvantageEstimator(
        nemo_rl_estimator_config(
            name="grpo", normalize_rewards=True, use_leave_one_out_baseline=leave_one_out
        ),
        None,
    ).compute_advantage(prompt_ids=prompt_ids, rewards=rewards, mask=mask)
    ours = compute_advantages(
        rewards,
        group_ids_from_prompt_rows(prompt_ids),
        None,
        "grpo",
        leave_one_out=leave_one_out,
    )
    assert torch.allclose(ours, theirs[:, 0], atol=1e-5)


def test_called_as_the_trainer_calls_it_gives_core_values():
    prompt_ids, rewards, mask = trainer_batch(2)
    estimator = MMPOAdvantageEstimator(
        nemo_rl_estimator_config(name="mmpo", truncation_order=4, estimator="unbiased")
    )
    advantages = estimator.compute_advantage(
        prompt_ids=prompt_ids,
        rewards=rewards,
        mask=mask,
        repeated_batch={},
        logprobs_policy=torch.zeros(128, 20),
        logprobs_reference=None,
    )
    expected = compute_advantages(
        rewards, group_ids_from_prompt_rows(prompt_ids), moment_objective("mmpo", 4), "unbiased"
    )
    assert torch.equal(advantages[:, 0], expected)


def test_mmpo_loss_is_the_clipped_surrogate_without_kl():
    from nemo_mmpo.nemo_rl.loss import MMPOClippedPGLossFn

    config = loss_module.ClippedPGLossConfig(name="mmpo", reference_policy_kl_penalty=0.0)
    loss_fn = MMPOClippedPGLossFn(config)
    generator = torch.Generator().manual_seed(3)
    batch, length = 4, 6
    prev = -torch.rand(batch, length, generator=generator)
    current = prev[:, 1:] + 0.3 * torch.randn(batch, length - 1, generator=generator)
    advantages = torch.randn(batch, 1, generator=generator).expand(batch, length).contiguous()
    token_mask = torch.ones(batch, length)
    token_mask[:, -1] = 0
    data = batched_module.BatchedDataDict(
        {
            "input_ids": torch.zeros(batch, length, dtype=torch.long),
            "advantages": advantages,
            "prev_logprobs": prev,
            "generation_logprobs": prev,
            "reference_policy_logprobs": prev - 1.0,
            "token_mask": token_mask,
            "sample_mask": torch.ones(batch),
        }
    )
    valid_tokens = token_mask[:, 1:].sum()
    loss, metrics = loss_fn(current, data, torch.tensor(float(batch)), valid_tokens)
    ratio = torch.exp(current - prev[:, 1:])
    surrogate = torch.minimum(ratio * advantages[:, 1:], ratio.clamp(0.8, 1.2) * advantages[:, 1:])
    expected = -(surrogate * token_mask[:, 1:]).sum() / valid_tokens
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert metrics["kl_penalty"] == 0


def test_recipes_load_with_nemo_rl_own_loader(tmp_path):
    """NeMo-RL's ``load_config`` reads each recipe as the entry point hands it to its
    ``run_grpo.py``: composed, in the run's record."""
    from nemo_mmpo.recipes import load, write_run_record

    root = find_nemo_rl_root()
    if root is None:
        pytest.skip("no NeMo-RL checkout with examples/configs found (set NEMO_RL_PATH)")
    config_module.register_omegaconf_resolvers()
    for recipe in sorted((ROOT / "examples" / "configs").glob("*.yaml")):
        record = write_run_record(load(recipe), tmp_path / recipe.stem)
        config = config_module.load_config(str(record))
        config = config_module.parse_hydra_overrides(
            config, ["grpo.adv_estimator.truncation_order=3"]
        )
        assert config.grpo.adv_estimator.truncation_order == 3
        assert config.policy.megatron_cfg.enabled is True


@pytest.mark.parametrize(
    "recipe",
    sorted(path.name for path in (ROOT / "examples" / "configs").glob("*.yaml")),
)
def test_every_recipe_builds_nemo_rl_master_config(recipe):
    """NeMo-RL's loader, Hydra overrides and ``MasterConfig``, as its ``run_grpo.py`` does (a
    single-controller recipe on a NeMo-RL without one, v0.7.0: refused by our check in one
    line, before NeMo-RL's ``MasterConfig`` refuses its ``grpo.async_grpo: null``)."""
    from nemo_rl_support import master_config_from_recipe

    from nemo_mmpo.launch import trainers
    from nemo_mmpo.launch.rules import check
    from nemo_mmpo.recipes import load

    root = find_nemo_rl_root()
    shipped = load(ROOT / "examples" / "configs" / recipe).config
    if (
        trainers.is_single_controller(shipped)
        and not (root / trainers.SINGLE_CONTROLLER_SCRIPT).is_file()
    ):
        assert check(shipped).errors == [trainers.missing_single_controller(root)]
        return

    config = master_config_from_recipe(recipe, ["grpo.adv_estimator.truncation_order=3"])
    grpo_config = config.grpo
    read = grpo_config.get if isinstance(grpo_config, dict) else grpo_config.__getattribute__
    assert read("skip_reference_policy_logprobs_calculation") is True
    assert config.loss_fn.reference_policy_kl_penalty == 0.0
    async_config = read("async_grpo")
    async_enabled = (
        (async_config or {}).get("enabled")
        if isinstance(async_config, dict)
        else (getattr(async_config, "enabled", False))
    )
    if async_enabled:  # what NeMo-RL's async trainer asserts at its start
        assert config.loss_fn.use_importance_sampling_correction is True
        assert config.policy["generation"]["colocated"]["enabled"] is False
    resolved = config.model_dump()
    assert check(resolved).errors == []
    # the statement NeMo-RL's setup() runs to build the loss (setup() itself needs GPUs)
    from nemo_mmpo.nemo_rl import install
    from nemo_mmpo.nemo_rl.loss import MMPOClippedPGLossFn

    install()
    grpo = import_nemo_rl("nemo_rl.algorithms.grpo")
    loss = grpo.ClippedPGLossFn(config.loss_fn)
    assert isinstance(loss, MMPOClippedPGLossFn) == (config.loss_fn.name == "mmpo")
