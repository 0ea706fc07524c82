"""A researcher's own estimator and loss, in a file in a folder of their own named by the recipe
(``nemo_mmpo.plugins``), train in NeMo-RL's real ``grpo_train`` and ``async_grpo_train`` (the
stand-in policy and generation of :mod:`trainer_standins`): the estimator's advantages reach the
loss, the ``mmpo/`` metrics and the loss's own metrics are logged at every step; a loss that
returns a vector stops the run at step 1 in one line naming it."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from nemo_rl_support import import_nemo_rl, master_config_from_recipe

pytestmark = pytest.mark.nemo_rl
grpo = import_nemo_rl("nemo_rl.algorithms.grpo")
from test_trainer_loop import TINY_RUN, async_trainer, run_trainer

from nemo_mmpo import compute_advantages, estimators, group_ids_from_prompt_rows, losses
from nemo_mmpo.nemo_rl import install
from nemo_mmpo.plugins import load_plugins

MODULE = "objectives_of_a_researcher"
PLUGIN = """
import torch
from nemo_rl.algorithms.loss import ClippedPGLossFn

from nemo_mmpo import register_estimator
from nemo_mmpo.estimators import get_estimator
from nemo_mmpo.losses import register_loss
from nemo_mmpo.sections import value


@register_estimator("scaled_plugin_of_a_researcher")
def scaled_plugin(groups, objective, advantage_scale: float = 1.0):
    return advantage_scale * get_estimator("plugin")(groups, objective)


@register_loss("surrogate_plus_of_a_researcher", options={"extra_weight": 0.0})
class SurrogatePlus(ClippedPGLossFn):
    def __init__(self, cfg, *args, **kwargs):
        super().__init__(cfg, *args, **kwargs)
        self.extra_weight = value(cfg, "extra_weight", 0.0)  # a mapping or NeMo-RL's model

    def __call__(self, next_token_logprobs, data, *args, **kwargs):
        loss, metrics = super().__call__(next_token_logprobs, data, *args, **kwargs)
        extra = next_token_logprobs.mean()
        metrics["researcher/extra_term"] = extra.item()
        return loss + self.extra_weight * extra, metrics


class TokenAdvantages:
    # NeMo-RL's estimator protocol: token-level advantages, metrics in last_metrics

    def __init__(self, estimator_config, loss_config):
        self.scale = value(estimator_config, "class_scale", 1.0)
        self.last_metrics = {}

    def compute_advantage(self, prompt_ids, rewards, mask, **kwargs):
        from nemo_mmpo import compute_advantages, group_ids_from_prompt_rows

        groups = group_ids_from_prompt_rows(prompt_ids)
        advantages = self.scale * compute_advantages(rewards, groups, None, "plugin")
        self.last_metrics = {"researcher/class_advantage_abs": advantages.abs().mean().item()}
        return advantages.unsqueeze(-1).expand(mask.shape).to(torch.float32)


register_estimator("class_of_a_researcher", TokenAdvantages, options={"class_scale": 1.0})


@register_loss("vector_loss_of_a_researcher")
class VectorLoss(ClippedPGLossFn):
    def __call__(self, next_token_logprobs, data, *args, **kwargs):
        loss, metrics = super().__call__(next_token_logprobs, data, *args, **kwargs)
        return loss * torch.ones(3), metrics
"""


@pytest.fixture
def researchers_folder(tmp_path, monkeypatch):
    """The plug-in file in a folder of its own, imported as ``nemo-mmpo train`` imports it;
    its registrations and module gone afterwards."""
    folder = tmp_path / "my_project"
    folder.mkdir()
    (folder / f"{MODULE}.py").write_text(PLUGIN)
    monkeypatch.setattr(estimators, "_REGISTRY", dict(estimators._REGISTRY))
    monkeypatch.setattr(losses, "_LOSSES", dict(losses._LOSSES))
    for variable in ("NEMO_MMPO_PLUGINS", "NEMO_MMPO_PLUGIN_PATH"):
        monkeypatch.setenv(variable, "")
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # restored after
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert MODULE in load_plugins([MODULE], folder)
    yield folder
    sys.modules.pop(MODULE, None)


def plugin_config(recipe, loss="surrogate_plus_of_a_researcher", *extra):
    return master_config_from_recipe(
        recipe,
        [
            *TINY_RUN,
            "grpo.adv_estimator.name=scaled_plugin_of_a_researcher",
            "++grpo.adv_estimator.advantage_scale=0.5",
            f"loss_fn.name={loss}",
            "++loss_fn.extra_weight=0.01",
            *extra,
        ],
    )


def assert_trained_with_the_plugins(policy, logger):
    loss_class = sys.modules[MODULE].SurrogatePlus
    assert len(policy.train_calls) == 2
    for call in policy.train_calls:
        assert isinstance(call["loss_fn"], loss_class)
        data = call["data"]
        advantages = data["advantages"][:, 0]
        rewards = data["total_reward"] if "total_reward" in data else None
        if rewards is not None:
            expected = 0.5 * compute_advantages(
                rewards, group_ids_from_prompt_rows(data["input_ids"][:, :1]), None, "plugin"
            )
            assert torch.allclose(advantages.double(), expected.double(), atol=1e-6)
    for metric in ("mmpo/failure_moment_1", "researcher/extra_term"):
        steps = [
            step
            for name, values in logger.metrics.items()
            if name.endswith(metric)
            for step, _ in values
        ]
        assert sorted(set(steps)) == [1, 2], (metric, sorted(logger.metrics))


def test_grpo_train_trains_a_researchers_estimator_and_loss(
    ray_cluster, researchers_folder, tmp_path
):
    install()
    config = plugin_config("mmpo_math_qwen3_1.7b.yaml")
    policy, logger, _ = run_trainer(grpo.grpo_train, config, tmp_path)
    assert_trained_with_the_plugins(policy, logger)


@pytest.mark.alternating
def test_async_grpo_train_trains_a_researchers_estimator_and_loss(
    ray_cluster, researchers_folder, tmp_path
):
    install()
    config = plugin_config(
        "mmpo_math_qwen3_4b_async.yaml",
        "surrogate_plus_of_a_researcher",
        "grpo.async_grpo.max_trajectory_age_steps=1",
    )
    policy, logger, _ = async_trainer(config, tmp_path)
    assert_trained_with_the_plugins(policy, logger)


def test_a_loss_returning_a_vector_stops_at_step_one_naming_it(
    ray_cluster, researchers_folder, tmp_path
):
    install()
    config = plugin_config("mmpo_math_qwen3_1.7b.yaml", "vector_loss_of_a_researcher")
    with pytest.raises(Exception) as raised:
        run_trainer(grpo.grpo_train, config, tmp_path)
    message = str(raised.value)
    assert "loss 'vector_loss_of_a_researcher'" in message and MODULE in message
    assert "a loss is a scalar tensor" in message


def test_the_single_controllers_actor_imports_the_plugin_and_trains_it(
    researchers_folder, monkeypatch
):
    """NeMo-RL main's single controller builds the estimator on the driver and unpickles it in
    its actor, a process where only the environment says which plug-ins the run has: the
    registration and module are removed before the unpickling (as a fresh actor lacks them);
    the actor's lookup imports the module from the environment and trains the step with it."""
    single_controller = pytest.importorskip("test_single_controller_first_step")
    from nemo_mmpo import plugins, registry

    def a_fresh_actor_process():
        estimators._REGISTRY.pop("scaled_plugin_of_a_researcher")
        sys.modules.pop(MODULE)
        monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(researchers_folder)])
        monkeypatch.setattr(plugins, "_loaded", set())
        monkeypatch.setattr(plugins, "_environment_loaded", [])
        monkeypatch.setattr(registry, "_frozen_by", [])  # install() never ran in the actor

    actor, step = single_controller.train_one_step(
        monkeypatch,
        overrides=[
            "grpo.adv_estimator.name=scaled_plugin_of_a_researcher",
            "++grpo.adv_estimator.advantage_scale=0.5",
        ],
        in_the_actor=a_fresh_actor_process,
    )
    assert MODULE in sys.modules  # imported again, from NEMO_MMPO_PLUGIN_PATH
    assert actor._train_steps == 1 and len(step.put) == 3
    logged = actor._logger._logger.logged
    train = next(metrics for prefix, _, metrics in logged if prefix == "train")
    assert any(key.startswith("mmpo/") for key in train)


def test_ray_workers_import_the_plugin_to_unpickle_its_loss(researchers_folder, ray_cluster):
    """A Ray worker of this cluster gets the checked loss as NeMo-RL's policy workers do (by
    pickle), imports the plug-in from the environment the launcher set, and its first call is
    checked there: the vector loss is refused inside the worker."""
    import ray

    install()
    config = plugin_config("mmpo_math_qwen3_1.7b.yaml", "vector_loss_of_a_researcher")
    loss = grpo.ClippedPGLossFn(config.loss_fn)

    @ray.remote(runtime_env={"env_vars": {k: os.environ[k] for k in ENVIRONMENT}})
    def call_in_a_worker(loss):
        logprobs = torch.zeros(2, 3, requires_grad=True)
        data = {
            "advantages": torch.ones(2, 4),
            "prev_logprobs": torch.zeros(2, 4),
            "generation_logprobs": torch.zeros(2, 4),
            "reference_policy_logprobs": torch.zeros(2, 4),
            "token_mask": torch.ones(2, 4),
            "sample_mask": torch.ones(2),
        }
        try:
            loss(logprobs, data, torch.tensor(2), torch.tensor(6))
        except Exception as error:
            return type(loss).__module__, str(error)
        return type(loss).__module__, ""

    module, error = ray.get(call_in_a_worker.remote(loss))
    assert module == MODULE
    assert "loss 'vector_loss_of_a_researcher'" in error and "a loss is a scalar" in error


ENVIRONMENT = ("NEMO_MMPO_PLUGINS", "NEMO_MMPO_PLUGIN_PATH", "PYTHONPATH")


def test_grpo_train_trains_a_researchers_class_estimator(ray_cluster, researchers_folder, tmp_path):
    """A class with NeMo-RL's ``compute_advantage`` protocol: built as NeMo-RL builds its own,
    its output checked, its ``last_metrics`` logged at every step."""
    install()
    config = master_config_from_recipe(
        "mmpo_math_qwen3_1.7b.yaml",
        [
            *TINY_RUN,
            "grpo.adv_estimator.name=class_of_a_researcher",
            "++grpo.adv_estimator.class_scale=2.0",
        ],
    )
    policy, logger, _ = run_trainer(grpo.grpo_train, config, tmp_path)
    assert len(policy.train_calls) == 2
    for call in policy.train_calls:
        assert type(call["loss_fn"]).__name__ == "MMPOClippedPGLossFn"
    steps = [
        step
        for name, values in logger.metrics.items()
        if name.endswith("researcher/class_advantage_abs")
        for step, _ in values
    ]
    assert sorted(set(steps)) == [1, 2]


def test_the_single_controller_refuses_a_class_estimator_in_one_line(researchers_folder):
    """The single controller calls its estimator once per streaming chunk; nemo-mmpo combines
    the chunks' metrics for function estimators only, so a class is refused when it is built."""
    setup = pytest.importorskip("nemo_rl.algorithms.single_controller_utils.setup")
    from nemo_mmpo.errors import MMPOInputError

    install()
    config = master_config_from_recipe(
        "mmpo_math_qwen3_1.7b.yaml", ["grpo.adv_estimator.name=class_of_a_researcher"]
    )
    with pytest.raises(MMPOInputError) as raised:
        setup._create_advantage_estimator(config)
    message = str(raised.value)
    assert "'class_of_a_researcher'" in message and MODULE in message and "\n" not in message
