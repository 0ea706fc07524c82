"""What ``install()`` checks and refuses, against the real NeMo-RL (Python 3.13 suite).

- the trainers nemo-mmpo cannot train with refuse our names where they build the loss or the
  estimator: PPO (``ppo.py``) both, ``grpo_train_sync`` and the single controller DMPO, and
  ``DMPOLossFn`` ``force_on_policy_ratio``, each in one line naming the value and the fix;
- ``validate_sync`` (``grpo_train_sync``'s validation) runs the paper's evaluation with
  ``evaluation.in_loop``, as ``validate`` does;
- NeMo-RL's side of the contract is checked before anything is wrapped: on copies of the
  imported NeMo-RL changed as a release could change it, ``install()`` in a fresh process
  refuses with one error naming every change (a renamed parameter; a renamed hook point; our
  estimator names built by an ``if``/``elif`` or by a registry behind a helper, and NeMo-RL's
  loss reacting to ``loss_fn.name: dmpo``, found by calling them; a hooked function renamed
  with the old name kept as an alias; a trainer that calls a hook through its module;
  ``setup()`` building the loss under another name; a module calling an original past the
  hooks), or installs without the trainer modules it lacks.
"""

from __future__ import annotations

import shutil

import pytest
from nemo_rl_copies import append, edit, nemo_rl_copy, run_in, substitute
from nemo_rl_support import import_nemo_rl, master_config_from_recipe

pytestmark = pytest.mark.nemo_rl

grpo = import_nemo_rl("nemo_rl.algorithms.grpo")
grpo_sync = import_nemo_rl("nemo_rl.algorithms.grpo_sync")
ppo = import_nemo_rl("nemo_rl.algorithms.ppo")
loss_module = import_nemo_rl("nemo_rl.algorithms.loss")

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.nemo_rl import install, wrappers
from nemo_mmpo.nemo_rl.hooks import MARK, SUPPORTED
from nemo_mmpo.nemo_rl.loss import DMPOLossFn
from nemo_mmpo.nemo_rl.names import NEMO_RL_ESTIMATORS
from nemo_mmpo.nemo_rl.refusals import factory_names

DMPO_RECIPE = "dmpo_math_qwen3_1.7b.yaml"


class Config(dict):
    """A config section read both ways, as NeMo-RL's code reads it (``a.b`` and ``a["b"]``)."""

    __getattr__ = dict.__getitem__


def test_nemo_rl_factories_know_exactly_their_own_names():
    install()
    assert factory_names(getattr(grpo._create_advantage_estimator, MARK)) == set(NEMO_RL_ESTIMATORS)
    assert factory_names(getattr(ppo._create_advantage_estimator, MARK)) == {"gae", "raw_reward"}


@pytest.mark.parametrize("name", ["mmpo", "dmpo"])
def test_ppo_refuses_our_loss_names_and_builds_its_own_otherwise(name):
    install()
    with pytest.raises(MMPOInputError, match=rf"loss_fn.name={name}: NeMo-RL's PPO .* run_grpo"):
        ppo.ClippedPGLossFn(loss_module.ClippedPGLossConfig(name=name))
    assert type(ppo.ClippedPGLossFn(loss_module.ClippedPGLossConfig())) is (
        loss_module.ClippedPGLossFn
    )


def test_ppo_refuses_our_estimator_names_and_builds_its_own_otherwise():
    install()
    ours = Config(ppo=Config(adv_estimator=Config(name="mmpo")), loss_fn=None)
    with pytest.raises(MMPOInputError, match=r"ppo.adv_estimator.name=mmpo: .* gae, raw_reward"):
        ppo._create_advantage_estimator(ours)
    section = Config(name="raw_reward", normalize_advantages=True)
    theirs = Config(ppo=Config(adv_estimator=section), loss_fn=None)
    assert type(ppo._create_advantage_estimator(theirs)).__name__ == "RawRewardAdvantageEstimator"


def test_dmpo_is_refused_where_no_trainer_attaches_its_terms():
    install()
    config = master_config_from_recipe(DMPO_RECIPE)
    with pytest.raises(MMPOInputError, match=r"dmpo cannot train in NeMo-RL's grpo_train_sync"):
        grpo_sync._create_advantage_estimator(config)
    try:
        from nemo_rl.algorithms.single_controller_utils import setup as single_controller
    except ModuleNotFoundError:  # v0.7.0 has no single controller
        return
    with pytest.raises(MMPOInputError, match=r"in NeMo-RL's single controller .*=mmpo$"):
        single_controller.ClippedPGLossFn(config.loss_fn)


def test_dmpo_refuses_force_on_policy_ratio_when_built():
    install()
    config = master_config_from_recipe(DMPO_RECIPE, ["loss_fn.force_on_policy_ratio=true"])
    fix = "set loss_fn.force_on_policy_ratio=false"
    with pytest.raises(MMPOInputError, match=fix):
        grpo.ClippedPGLossFn(config.loss_fn)  # what setup() builds
    with pytest.raises(MMPOInputError, match=fix):
        DMPOLossFn(config.loss_fn)  # a driver that builds it itself


def in_loop_config(in_loop: bool) -> Config:
    evaluation = {"enabled": True, "in_loop": in_loop, "benchmarks": {"aime24": None}}
    return Config(grpo=Config(val_period=0), evaluation=evaluation)


def test_validate_sync_runs_the_paper_evaluation_in_the_sync_trainer(monkeypatch):
    install()
    assert hasattr(grpo_sync.validate_sync, MARK) and hasattr(grpo_sync.grpo_train_sync, MARK)
    calls = []

    def recorded(generation, step, settings, master_config=None, tokenizer=None):
        calls.append((generation, step, settings.in_loop))
        return {"accuracy": 0.25, "paper/average": 0.25}, {"total_validation_time": 1.0}

    monkeypatch.setattr(wrappers, "validate_in_loop", recorded)

    def trainer(policy, policy_generation, master_config):
        """NeMo-RL's grpo_train_sync as far as validation: validate_sync, called as at :510."""
        return grpo_sync.validate_sync(
            rollout_actor=None,
            policy=policy,
            val_dataloader=None,
            val_task_to_env=None,
            step=3,
            master_config=master_config,
        )

    trainer.__module__ = grpo_sync.__name__  # whose validate_sync is hooked
    train = wrappers.sync_trainer(trainer)  # as install() wraps grpo_train_sync
    engine = object()
    metrics, timings = train(None, engine, in_loop_config(True))
    assert calls == [(engine, 3, True)]
    assert metrics["accuracy"] == 0.25 and "total_validation_time" in timings
    # NeMo-RL's own validate_sync otherwise (no dataloader: it skips and returns two dicts)
    assert train(None, engine, in_loop_config(False)) == ({}, {})
    assert len(calls) == 1
    with pytest.raises(MMPOInputError, match="outside the hooked grpo_train_sync"):
        trainer(None, engine, in_loop_config(True))


def test_a_changed_contract_is_refused_before_anything_is_hooked(tmp_path):
    algorithms = nemo_rl_copy(tmp_path)
    grpo_file, sync_file = algorithms / "grpo.py", algorithms / "grpo_sync.py"
    # a renamed parameter the metrics hook reads
    edit(
        grpo_file,
        "    total_steps: int,\n    metrics: dict[str, Any],",
        "    total_steps: int,\n    step_metrics: dict[str, Any],",
    )
    # NeMo-RL's factory learns one of our names: in its if/elif, and from a registry behind a
    # helper (.get), which no reading of the factory's source finds
    edit(
        grpo_file,
        '    elif adv_estimator_name == "grpo":',
        '    elif adv_estimator_name == "maxrl":\n        raise NotImplementedError\n'
        '    elif adv_estimator_name == "grpo":',
    )
    substitute(
        grpo_file,
        r"^(    adv_estimator_name = adv_estimator_config.*)$",
        r"\1\n    registered = _registered_estimator(adv_estimator_name)\n"
        r"    if registered is not None:\n"
        r"        return registered(adv_estimator_config, loss_config)",
    )
    append(
        grpo_file,
        "def _registered_estimator(name):\n    return {'pkpo': GRPOAdvantageEstimator}.get(name)",
    )
    # a hooked function renamed, its old name kept as an alias
    substitute(grpo_file, r"\bvalidate\(", "validate_policy(", at_least=3)
    append(grpo_file, "validate = validate_policy")
    # setup() builds the loss under another name
    edit(grpo_file, "    loss_fn = ClippedPGLossFn(", "    loss_fn = _loss_class(")
    append(grpo_file, "_loss_class = ClippedPGLossFn")
    # grpo_train_sync calls the factory through grpo's module, past the hook in its own
    edit(
        sync_file,
        "adv_estimator = _create_advantage_estimator(master_config)",
        "adv_estimator = _grpo_module._create_advantage_estimator(master_config)",
    )
    append(sync_file, "import nemo_rl.algorithms.grpo as _grpo_module")
    # NeMo-RL's loss reacts to one of our loss names
    append(
        algorithms / "loss" / "loss_functions.py",
        "_plain_init = ClippedPGLossFn.__init__\n\n\n"
        "def _init_knowing_dmpo(self, cfg, *args, **kwargs):\n"
        "    if getattr(cfg, 'name', None) == 'dmpo':\n"
        "        raise NotImplementedError('NeMo-RL builds its own dmpo')\n"
        "    _plain_init(self, cfg, *args, **kwargs)\n\n\n"
        "ClippedPGLossFn.__init__ = _init_knowing_dmpo",
    )
    # a hook point renamed
    substitute(algorithms / "ppo.py", r"\b_create_advantage_estimator\(", "_create_estimator(")
    result = run_in(tmp_path)
    output = result.stdout + result.stderr
    assert "REFUSED:" in result.stdout, output
    refusal = result.stdout.split("REFUSED:")[1]
    assert "\n" not in refusal.strip() and SUPPORTED in refusal and "installed: False" in refusal
    for problem in (
        "nemo_rl.algorithms.grpo._log_mixed_rewards_and_advantages_information(logger, "
        "total_steps, step_metrics, baseline, advantages) has no parameter 'metrics'",
        "grpo._create_advantage_estimator, asked for estimator 'maxrl' on a minimal config, "
        "answers NotImplementedError",
        "asked for estimator 'pkpo' on a minimal config",
        "nemo_rl.algorithms.grpo.validate is nemo_rl.algorithms.grpo.validate_policy, a "
        "function of another name",
        "nemo_rl.algorithms.grpo.grpo_train no longer calls validate by that name",
        "nemo_rl.algorithms.grpo.setup no longer calls ClippedPGLossFn by that name",
        "nemo_rl.algorithms.grpo._loss_class is NeMo-RL's",
        "nemo_rl.algorithms.grpo_sync.grpo_train_sync no longer calls "
        "_create_advantage_estimator by that name",
        "nemo_rl.algorithms.ppo has no attribute '_create_advantage_estimator'",
        "grpo.ClippedPGLossFn, asked for loss_fn.name 'dmpo' on a minimal config, answers "
        "NotImplementedError",
    ):
        assert problem in refusal, (problem, refusal)
    for absent in ("estimator 'mmpo'", "'passk_chen'", "loss_fn.name 'mmpo'"):
        assert absent not in refusal  # no clash where NeMo-RL has none


def test_trainer_modules_a_nemo_rl_lacks_are_left_out(tmp_path):
    algorithms = nemo_rl_copy(tmp_path)
    (algorithms / "grpo_sync.py").unlink()
    shutil.rmtree(algorithms / "single_controller_utils", ignore_errors=True)  # main only
    result = run_in(tmp_path)
    assert "HOOKED:" in result.stdout, result.stdout + result.stderr
    hooked = result.stdout.split("HOOKED:")[1].split()
    assert "nemo_rl.algorithms.grpo._create_advantage_estimator" in hooked
    assert "nemo_rl.algorithms.ppo.ClippedPGLossFn" in hooked
    assert not [name for name in hooked if ".grpo_sync." in name or ".single_controller" in name]
