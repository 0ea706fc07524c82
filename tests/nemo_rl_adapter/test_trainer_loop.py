"""NeMo-RL's real GRPO trainers drive our estimator and loss (stand-ins only for GPU parts).

The recipe is loaded by NeMo-RL's own loader into its ``MasterConfig``; the loss is built the
way ``setup()`` builds it (``ClippedPGLossFn(master_config.loss_fn)`` after ``install()``);
then NeMo-RL's ``grpo_train`` runs two steps with the
stand-ins of :mod:`trainer_standins`, real prompts and 0/1 rewards from a Ray environment.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from nemo_rl_support import import_nemo_rl, master_config_from_recipe

pytestmark = pytest.mark.nemo_rl
from trainer_standins import (
    RecordingLogger,
    StandInGeneration,
    StandInPolicy,
    char_tokenizer,
    make_math_env,
    math_dataset,
)

grpo = import_nemo_rl("nemo_rl.algorithms.grpo")
loss_module = import_nemo_rl("nemo_rl.algorithms.loss")
data_interfaces = import_nemo_rl("nemo_rl.data.collate_fn")
checkpoint_module = import_nemo_rl("nemo_rl.utils.checkpoint")
from torchdata.stateful_dataloader import StatefulDataLoader

from nemo_mmpo import compute_advantages, group_ids_from_prompt_rows
from nemo_mmpo.nemo_rl import MMPOAdvantageEstimator, install
from nemo_mmpo.nemo_rl.loss import DMPOLossFn, MMPOClippedPGLossFn

PROMPTS, GROUP = 4, 4
TINY_RUN = [
    f"grpo.num_prompts_per_step={PROMPTS}",
    f"grpo.num_generations_per_prompt={GROUP}",
    "grpo.max_num_steps=2",
    "grpo.max_num_epochs=1",
    "grpo.val_period=0",
    "grpo.val_at_start=false",
    "grpo.val_at_end=false",
    f"policy.train_global_batch_size={PROMPTS * GROUP}",
    "checkpointing.save_period=1",
    "policy.max_total_sequence_length=256",
]


@pytest.fixture
def estimator_calls(monkeypatch):
    """Record every call NeMo-RL makes to our estimator (a spy: the real method runs)."""
    calls = []
    original = MMPOAdvantageEstimator.compute_advantage

    def recording(self, prompt_ids, rewards, mask, *args, **kwargs):
        advantages = original(self, prompt_ids, rewards, mask, *args, **kwargs)
        calls.append(
            {
                "estimator": self,
                "prompt_ids": prompt_ids.clone(),
                "rewards": rewards.clone(),
                "advantages": advantages.clone(),
            }
        )
        return advantages

    monkeypatch.setattr(MMPOAdvantageEstimator, "compute_advantage", recording)
    return calls


def run_trainer(trainer, config, tmp_path, **keywords):
    tokenizer = char_tokenizer()
    dataloader = StatefulDataLoader(
        math_dataset(tokenizer, 16),
        batch_size=PROMPTS,
        shuffle=False,
        collate_fn=data_interfaces.rl_collate_fn,
    )
    policy = StandInPolicy()
    generation = StandInGeneration(tokenizer, config.policy["generation"])
    loss_fn = grpo.ClippedPGLossFn(config.loss_fn)  # what setup() builds, after install()
    logger = RecordingLogger()
    config.checkpointing["checkpoint_dir"] = str(tmp_path / "checkpoints")
    checkpointer = checkpoint_module.CheckpointManager(config.checkpointing)
    environment = make_math_env()
    trainer(
        policy,
        generation,
        dataloader,
        None,
        tokenizer,
        loss_fn,
        {"math": environment},
        None,
        logger,
        checkpointer,
        initial_save_state(),
        config,
        **keywords,
    )
    return policy, logger, checkpointer


def nemo_rl_loss(config, call):
    """NeMo-RL's ``ClippedPGLossFn`` for ``config.loss_fn`` on a recorded ``policy.train`` call."""
    reference = loss_module.ClippedPGLossFn(config.loss_fn)
    loss, metrics = reference(
        call["next_token_logprobs"],
        call["data"],
        call["global_valid_seqs"],
        call["global_valid_toks"],
    )
    return loss.detach(), metrics


def initial_save_state():
    if hasattr(grpo, "_default_grpo_save_state"):  # v0.7.0
        return grpo._default_grpo_save_state()
    return grpo._get_grpo_save_state(None)  # main


@pytest.mark.parametrize("estimator", ["plugin", "unbiased"])
def test_grpo_train_runs_our_estimator_and_loss(
    estimator, ray_cluster, estimator_calls, tmp_path, capsys
):
    install()
    config = master_config_from_recipe(
        "mmpo_math_qwen3_1.7b.yaml", [*TINY_RUN, f"grpo.adv_estimator.estimator={estimator}"]
    )
    policy, logger, _ = run_trainer(grpo.grpo_train, config, tmp_path)

    # our estimator was built from the config and called once per step with NeMo-RL's rows
    assert len(estimator_calls) == 2
    for call in estimator_calls:
        assert call["estimator"].settings.estimator == estimator
        prompt_ids, rewards = call["prompt_ids"], call["rewards"]
        assert prompt_ids.shape[0] == PROMPTS * GROUP
        assert set(rewards.tolist()) <= {0.0, 1.0}
        _, inverse = torch.unique(prompt_ids, dim=0, return_inverse=True)
        group_ids = group_ids_from_prompt_rows(prompt_ids)
        assert torch.equal(group_ids[:, None] == group_ids[None, :], inverse[:, None] == inverse)
        expected = compute_advantages(
            rewards, group_ids, call["estimator"].objective, estimator
        ).to(call["advantages"].dtype)
        assert torch.equal(call["advantages"][:, 0], expected)
    all_rewards = torch.cat([call["rewards"] for call in estimator_calls])
    assert 0 < all_rewards.mean() < 1

    # the loss the trainer handed to policy.train is ours and equals NeMo-RL's for the config
    assert len(policy.train_calls) == 2
    for call, estimate in zip(policy.train_calls, estimator_calls, strict=True):
        assert isinstance(call["loss_fn"], MMPOClippedPGLossFn)
        assert torch.equal(call["data"]["advantages"], estimate["advantages"])
        assert torch.equal(call["loss"], nemo_rl_loss(config, call)[0])

    # our metrics reached NeMo-RL's logger, once per step, without "Skipping aggregation"
    for name in ("train/mmpo/failure_moment_4", "train/mmpo/advantage_token_mean"):
        assert [step for step, _ in logger.metrics[name]] == [1, 2]
        assert all(isinstance(value, float) for _, value in logger.metrics[name])
    steps = [value for _, value in logger.metrics["train/mmpo/success_rate"]]
    assert steps == [pytest.approx(float(call["rewards"].mean())) for call in estimator_calls]
    assert "Skipping aggregation for mmpo/" not in capsys.readouterr().out
    saved = sorted(path.name for path in (tmp_path / "checkpoints").glob("step_*"))
    assert saved == ["step_1", "step_2"]
    for name in saved:  # the policy wrote its weights where the manager finalised the step
        assert (tmp_path / "checkpoints" / name / "policy" / "weights").is_dir()
        assert (tmp_path / "checkpoints" / name / "train_dataloader.pt").is_file()


def test_force_on_policy_ratio_gives_nemo_rl_loss(ray_cluster, tmp_path):
    install()
    config = master_config_from_recipe(
        "mmpo_math_qwen3_1.7b.yaml", [*TINY_RUN, "loss_fn.force_on_policy_ratio=true"]
    )
    policy, _, _ = run_trainer(grpo.grpo_train, config, tmp_path)
    for call in policy.train_calls:
        assert torch.count_nonzero(call["data"]["prev_logprobs"]) == 0  # the trainer skipped it
        theirs, their_metrics = nemo_rl_loss(config, call)
        assert torch.equal(call["loss"], theirs)
        assert call["metrics"]["probs_ratio"] == pytest.approx(their_metrics["probs_ratio"])
        assert call["metrics"]["probs_ratio"] == pytest.approx(1.0)


def test_every_trainer_module_builds_our_estimator_from_the_master_config():
    """``grpo_sync`` and main's single controller import the factory by name: hooked too.

    Their trainers need NeMo-RL's TransferQueue data plane (a git-only dependency), so here
    the hooked factory each of them calls is checked on the real ``MasterConfig``.
    """
    hooked = install()
    config = master_config_from_recipe("mmpo_math_qwen3_1.7b.yaml")
    for module_name in (
        "nemo_rl.algorithms.grpo_sync",
        "nemo_rl.algorithms.single_controller_utils.setup",
    ):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            continue  # not in this NeMo-RL version
        assert f"{module_name}._create_advantage_estimator" in hooked
        estimator = module._create_advantage_estimator(config)
        assert isinstance(estimator, MMPOAdvantageEstimator)
        if hasattr(module, "ClippedPGLossFn"):  # main's single controller builds the loss
            assert isinstance(module.ClippedPGLossFn(config.loss_fn), MMPOClippedPGLossFn)


@pytest.mark.alternating
def test_async_grpo_train_runs_our_estimator_and_loss(ray_cluster, estimator_calls, tmp_path):
    """NeMo-RL's asynchronous trainer with the async recipe: collector and replay buffer are
    NeMo-RL's Ray actors; generation streams through the stand-in's ``generate_async``.

    See :func:`async_trainer`.
    """
    install()
    config = master_config_from_recipe(
        "mmpo_math_qwen3_4b_async.yaml",
        [*TINY_RUN, "grpo.async_grpo.max_trajectory_age_steps=1"],
    )
    assert config.loss_fn.use_importance_sampling_correction is True
    policy, logger, _ = async_trainer(config, tmp_path)
    assert len(estimator_calls) == 2 and len(policy.train_calls) == 2
    for call, estimate in zip(policy.train_calls, estimator_calls, strict=True):
        expected = compute_advantages(
            estimate["rewards"],
            group_ids_from_prompt_rows(estimate["prompt_ids"]),
            estimate["estimator"].objective,
            "plugin",
        ).to(estimate["advantages"].dtype)
        assert torch.equal(estimate["advantages"][:, 0], expected)
        assert isinstance(call["loss_fn"], MMPOClippedPGLossFn)
        assert torch.equal(call["loss"], nemo_rl_loss(config, call)[0])
    assert any(name.endswith("mmpo/failure_moment_4") for name in logger.metrics)


def async_trainer(config, tmp_path):
    """NeMo-RL's ``async_grpo_train`` with its collector and replay buffer on this interpreter,
    as the tiny CPU driver runs them (NeMo-RL's registry puts those two Ray actors in its vLLM
    environment, a uv-built venv with vLLM, which cannot exist here)."""
    from nemo_mmpo.cpu.engines.ray_cluster import collector_on_this_interpreter

    system = import_nemo_rl("nemo_rl.distributed.virtual_cluster").PY_EXECUTABLES.SYSTEM
    with collector_on_this_interpreter(system):
        return run_trainer(grpo.async_grpo_train, config, tmp_path, max_trajectory_age_steps=1)


def dmpo_reference(call, temperature=1 / 15):
    """The authors' penalty (``tests/test_dmpo.py``) at the batch's ``prev_logprobs``: value and
    gradient in the next-token log-probabilities, with groups read from the prompt rows."""
    from test_dmpo import reference

    data = call["data"]
    mask = data["token_mask"][:, 1:].double()
    first_response = data["token_mask"].argmax(dim=1)
    prompts = [
        tuple(row[:start].tolist())
        for row, start in zip(data["input_ids"], first_response, strict=True)
    ]
    groups = torch.tensor([sorted(set(prompts)).index(prompt) for prompt in prompts])
    current = data["prev_logprobs"][:, 1:].double().clone().requires_grad_()
    phi = (current * mask).sum(1) / mask.sum(1).clamp(min=1)
    advantages = (data["advantages"][:, 1:].double() * mask).sum(1) / mask.sum(1).clamp(min=1)
    valid = (data["sample_mask"] > 0) & (mask.sum(1) > 0)
    penalty = reference(advantages[valid], phi[valid], groups[valid], temperature, True)
    (gradient,) = torch.autograd.grad(penalty, current)
    return penalty.item(), gradient, groups


def test_grpo_train_runs_dmpo_with_the_authors_penalty(ray_cluster, tmp_path, capsys):
    install()
    config = master_config_from_recipe("dmpo_math_qwen3_1.7b.yaml", TINY_RUN)
    policy, logger, _ = run_trainer(grpo.grpo_train, config, tmp_path)
    assert len(policy.train_calls) == 2
    for step, call in enumerate(policy.train_calls, start=1):
        data = call["data"]
        assert isinstance(call["loss_fn"], DMPOLossFn)
        penalty, gradient, groups = dmpo_reference(call)
        assert torch.bincount(groups).tolist() == [GROUP] * PROMPTS
        assert penalty > 0  # mixed groups: the policy's softmax is not the target's
        # the first optimizer step of the batch: the policy that computed prev_logprobs
        at_rollout = data["prev_logprobs"][:, 1:].clone().requires_grad_()
        counts = (call["global_valid_seqs"], call["global_valid_toks"])
        ours, _ = call["loss_fn"](at_rollout, data, *counts)
        theirs, _ = loss_module.ClippedPGLossFn(config.loss_fn)(at_rollout, data, *counts)
        (difference_gradient,) = torch.autograd.grad(ours - theirs, at_rollout)
        assert (ours - theirs).item() == pytest.approx(2.0 * penalty, rel=1e-5)
        torch.testing.assert_close(
            difference_gradient.double(), 2.0 * gradient, rtol=1e-4, atol=1e-8
        )
        # what the stand-in trained on: NeMo-RL's surrogate + 2 x the penalty term it reported
        term = call["metrics"]["dmpo/penalty_term"]
        assert call["loss"].item() == pytest.approx(
            nemo_rl_loss(config, call)[0].item() + 2 * term, rel=1e-5
        )
        logged = dict(logger.metrics["train/dmpo/penalty"])
        assert logged[step] == pytest.approx(penalty, rel=1e-5)
    for name in ("target_policy_kl", "total_variation", "counted_fraction", "penalty_term"):
        assert [step for step, _ in logger.metrics[f"train/dmpo/{name}"]] == [1, 2]
    assert "Skipping aggregation for dmpo/" not in capsys.readouterr().out


@pytest.mark.alternating
def test_async_grpo_train_runs_dmpo(ray_cluster, tmp_path):
    """The asynchronous trainer computes ``prev_logprobs`` with the training policy and calls
    the same hook: the batch terms are the authors' penalty at that policy."""
    install()
    config = master_config_from_recipe(
        "mmpo_math_qwen3_4b_async.yaml",
        [*TINY_RUN, "grpo.async_grpo.max_trajectory_age_steps=1", "loss_fn.name=dmpo"],
    )
    policy, logger, _ = async_trainer(config, tmp_path)
    assert len(policy.train_calls) == 2
    for call in policy.train_calls:
        assert isinstance(call["loss_fn"], DMPOLossFn)
        penalty, _, _ = dmpo_reference(call)
        assert call["data"]["dmpo_penalty_share"].sum().item() == pytest.approx(penalty, rel=1e-5)
    assert any(name.endswith("dmpo/penalty") for name in logger.metrics)
