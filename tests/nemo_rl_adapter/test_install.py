"""install() against a small stand-in package shaped like NeMo-RL's hook points.

The stand-in is written here (not copied from NeMo-RL): ``nemo_rl.algorithms.grpo`` with an
if/elif ``_create_advantage_estimator`` that raises on unknown names, a ``ClippedPGLossFn``
built by ``setup()``, the metrics logger, and ``grpo_sync`` importing them by name. The
contract tests in ``test_contract_nemo_rl.py`` repeat the important checks on the real one.
"""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

FAKE_GRPO = """
__version__ = "0.0.fake"

class GRPOAdvantageEstimator:
    def __init__(self, estimator_config, loss_config):
        self.config = estimator_config

class ClippedPGLossFn:
    def __init__(self, cfg, use_fused_linear_logprobs=False):
        self.cfg = cfg
        self.use_fused_linear_logprobs = use_fused_linear_logprobs
    def __call__(self, next_token_logprobs, data, global_valid_seqs, global_valid_toks):
        return next_token_logprobs.sum() * 0, {"loss": 0.0}

def _create_advantage_estimator(master_config):
    config = master_config.grpo["adv_estimator"]
    if config["name"] == "grpo":
        return GRPOAdvantageEstimator(config, master_config.loss_fn)
    raise ValueError(f"Invalid adv_estimator name: {config['name']}")

def _log_mixed_rewards_and_advantages_information(
    logger, total_steps, metrics, baseline, advantages
):
    metrics["advantages/mean"] = float(advantages.mean())

def setup(master_config):
    return ClippedPGLossFn(master_config.loss_fn)

def train_step(master_config, prompt_ids, rewards, mask):
    estimator = _create_advantage_estimator(master_config)
    metrics = {}
    advantages = estimator.compute_advantage(prompt_ids=prompt_ids, rewards=rewards, mask=mask)
    _log_mixed_rewards_and_advantages_information(None, 0, metrics, rewards, advantages)
    return advantages, metrics
"""

FAKE_SYNC = """
from nemo_rl.algorithms.grpo import (
    _create_advantage_estimator,
    _log_mixed_rewards_and_advantages_information,
)
"""

FAKE_LOSS_INIT = """
from nemo_rl.algorithms.grpo import ClippedPGLossFn
"""


class Config:
    def __init__(self, grpo, loss_fn):
        self.grpo = grpo
        self.loss_fn = loss_fn


@pytest.fixture
def fake_nemo_rl(tmp_path, monkeypatch):
    package = tmp_path / "nemo_rl"
    (package / "algorithms" / "loss").mkdir(parents=True)
    (package / "__init__.py").write_text('__version__ = "0.0.fake"\n')
    (package / "algorithms" / "__init__.py").write_text("")
    (package / "algorithms" / "grpo.py").write_text(textwrap.dedent(FAKE_GRPO))
    (package / "algorithms" / "grpo_sync.py").write_text(textwrap.dedent(FAKE_SYNC))
    (package / "algorithms" / "loss" / "__init__.py").write_text(textwrap.dedent(FAKE_LOSS_INIT))
    for name in [name for name in sys.modules if name.split(".")[0] == "nemo_rl"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delitem(sys.modules, "nemo_mmpo.nemo_rl.loss", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    import nemo_rl.algorithms.grpo as grpo
    import nemo_rl.algorithms.grpo_sync as grpo_sync

    yield grpo, grpo_sync
    for name in [name for name in sys.modules if name.split(".")[0] == "nemo_rl"]:
        del sys.modules[name]
    sys.modules.pop("nemo_mmpo.nemo_rl.loss", None)


def example_batch():
    prompt_ids = torch.tensor([[1, 2]] * 4 + [[3, 4]] * 4)
    rewards = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 0])
    return prompt_ids, rewards, torch.ones(8, 3)


def test_install_routes_our_names_and_leaves_builtins(fake_nemo_rl):
    from nemo_mmpo.nemo_rl import MMPOAdvantageEstimator, install, is_installed

    grpo, grpo_sync = fake_nemo_rl
    assert not is_installed()
    wrapped = install()
    assert "nemo_rl.algorithms.grpo._create_advantage_estimator" in wrapped
    assert "nemo_rl.algorithms.grpo_sync._create_advantage_estimator" in wrapped
    assert is_installed()
    ours = Config({"adv_estimator": {"name": "mmpo", "truncation_order": 4}}, {})
    theirs = Config({"adv_estimator": {"name": "grpo"}}, {})
    assert isinstance(grpo._create_advantage_estimator(ours), MMPOAdvantageEstimator)
    assert isinstance(grpo_sync._create_advantage_estimator(ours), MMPOAdvantageEstimator)
    assert isinstance(grpo._create_advantage_estimator(theirs), grpo.GRPOAdvantageEstimator)
    with pytest.raises(ValueError, match="Invalid adv_estimator name: nope"):
        grpo._create_advantage_estimator(Config({"adv_estimator": {"name": "nope"}}, {}))


def test_install_is_idempotent(fake_nemo_rl):
    from nemo_mmpo.nemo_rl import install

    grpo, _ = fake_nemo_rl
    first = install()
    hooked = grpo._create_advantage_estimator
    assert install() == []
    assert grpo._create_advantage_estimator is hooked
    assert len(first) == 5  # grpo: 3 hooks; grpo_sync: estimator + logger


def test_sync_trainer_step_logs_our_metrics(fake_nemo_rl):
    from nemo_mmpo.nemo_rl import install

    grpo, _ = fake_nemo_rl
    install()
    config = Config({"adv_estimator": {"name": "mmpo", "truncation_order": 2}}, {})
    advantages, metrics = grpo.train_step(config, *example_batch())
    assert advantages.shape == (8, 3)
    assert "advantages/mean" in metrics
    assert metrics["mmpo/failure_moment_2"] == pytest.approx((3 * 2 / 12 + 0) / 2)
    grpo._create_advantage_estimator(Config({"adv_estimator": {"name": "grpo"}}, {}))
    builtin_metrics = {}
    grpo._log_mixed_rewards_and_advantages_information(
        None, 0, builtin_metrics, torch.zeros(2), torch.zeros(2)
    )
    assert not any(key.startswith("mmpo/") for key in builtin_metrics)


def test_loss_name_selects_our_loss(fake_nemo_rl):
    from nemo_mmpo.nemo_rl import install

    grpo, _ = fake_nemo_rl
    install()
    ours = grpo.setup(Config({}, {"name": "mmpo", "reference_policy_kl_penalty": 0.01}))
    theirs = grpo.setup(Config({}, {"reference_policy_kl_penalty": 0.01}))
    from nemo_mmpo.nemo_rl.loss import MMPOClippedPGLossFn

    assert isinstance(ours, MMPOClippedPGLossFn)
    assert ours.cfg["reference_policy_kl_penalty"] == 0.0
    assert type(theirs).__name__ == "ClippedPGLossFn" and not isinstance(
        theirs, MMPOClippedPGLossFn
    )
    assert theirs.cfg["reference_policy_kl_penalty"] == 0.01


def test_loss_adds_globally_normalised_metrics(fake_nemo_rl):
    from nemo_mmpo.nemo_rl import install

    grpo, _ = fake_nemo_rl
    install()
    loss_fn = grpo.setup(Config({}, {"name": "mmpo"}))
    data = {
        "advantages": torch.tensor([[0.0, 2.0, 2.0, 2.0], [0.0, -1.0, -1.0, -1.0]]),
        "token_mask": torch.tensor([[0.0, 1, 1, 0], [0.0, 1, 1, 1]]),
        "sample_mask": torch.tensor([1.0, 1.0]),
    }
    _, metrics = loss_fn(torch.zeros(2, 3), data, torch.tensor(2.0), torch.tensor(5.0))
    assert metrics["mmpo/advantage_token_mean"] == pytest.approx((2 + 2 - 3) / 5)
    assert metrics["mmpo/advantage_abs_token_mean"] == pytest.approx((4 + 3) / 5)
    assert metrics["mmpo/positive_advantage_token_fraction"] == pytest.approx(2 / 5)


def test_missing_hook_point_names_the_version(fake_nemo_rl):
    from nemo_mmpo.nemo_rl import install

    grpo, _ = fake_nemo_rl
    del grpo._create_advantage_estimator
    with pytest.raises(RuntimeError, match=r"NeMo-RL 0\.0\.fake.*_create_advantage_estimator"):
        install()
