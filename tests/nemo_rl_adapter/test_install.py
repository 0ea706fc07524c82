"""``install()`` against the real NeMo-RL (Python 3.13 suite; skipped where it cannot import)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest
import torch
from nemo_rl_support import import_nemo_rl, master_config_from_recipe

pytestmark = pytest.mark.nemo_rl

grpo = import_nemo_rl("nemo_rl.algorithms.grpo")
advantage_module = import_nemo_rl("nemo_rl.algorithms.advantage_estimator")
loss_module = import_nemo_rl("nemo_rl.algorithms.loss")

from nemo_mmpo.nemo_rl import MMPOAdvantageEstimator, install, is_installed
from nemo_mmpo.nemo_rl.hooks import HOOKS, worker_pythonpath
from nemo_mmpo.nemo_rl.loss import MMPOClippedPGLossFn


def test_install_returns_every_hooked_name_and_is_idempotent():
    first = install()
    factory = grpo._create_advantage_estimator
    assert install() == first
    assert grpo._create_advantage_estimator is factory  # not wrapped twice
    assert is_installed()
    expected = []
    for module_name, hooks in HOOKS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            continue
        expected += [f"{module_name}.{name}" for name in hooks if hasattr(module, name)]
    assert first == expected
    assert "nemo_rl.algorithms.grpo.ClippedPGLossFn" in first
    assert "nemo_rl.algorithms.ppo.ClippedPGLossFn" in first


def test_our_names_build_ours_and_builtins_stay_nemo_rls():
    install()
    ours = master_config_from_recipe("mmpo_math_qwen3_1.7b.yaml")
    assert isinstance(grpo._create_advantage_estimator(ours), MMPOAdvantageEstimator)
    theirs = master_config_from_recipe(
        "mmpo_math_qwen3_1.7b.yaml",
        ["grpo.adv_estimator.name=grpo", "loss_fn.name=clipped_pg"],
    )
    estimator = grpo._create_advantage_estimator(theirs)
    assert type(estimator) is advantage_module.GRPOAdvantageEstimator
    loss = grpo.ClippedPGLossFn(theirs.loss_fn)
    assert type(loss) is loss_module.ClippedPGLossFn


@pytest.mark.parametrize(
    ("overrides", "estimator"),
    [
        (["grpo.adv_estimator.estimator=empirical_bayes"], "empirical_bayes"),
        (["grpo.adv_estimator.estimator=unbiased"], "unbiased"),
        (["grpo.adv_estimator.name=pkpo"], "pkpo"),
        (["grpo.adv_estimator.name=maxrl"], "maxrl"),
        (["grpo.adv_estimator.name=passk_chen"], "passk_chen"),
    ],
)
def test_every_registered_estimator_is_reachable_by_its_one_spelling(overrides, estimator):
    install()
    config = master_config_from_recipe("mmpo_math_qwen3_1.7b.yaml", overrides)
    assert grpo._create_advantage_estimator(config).settings.estimator == estimator


def test_our_grpo_estimator_is_reachable_through_mmpo_name():
    install()
    config = master_config_from_recipe(
        "mmpo_math_qwen3_1.7b.yaml", ["grpo.adv_estimator.estimator=grpo"]
    )
    assert grpo._create_advantage_estimator(config).settings.estimator == "grpo"


def test_install_puts_the_package_on_the_workers_pythonpath():
    install()
    assert worker_pythonpath() in os.environ["PYTHONPATH"].split(os.pathsep)


def test_install_after_ray_started_without_the_path_fails_with_the_fix():
    code = """
import os, ray
from nemo_mmpo.nemo_rl import install
os.environ.pop("PYTHONPATH", None)
ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
try:
    install()
except RuntimeError as error:
    print("REFUSED:", error)
finally:
    ray.shutdown()
"""
    environment = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH",)}
    paths = [path for path in sys.path if path]
    result = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path[:0] = {paths!r}\n{code}"],
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
    )
    assert "REFUSED:" in result.stdout, result.stdout + result.stderr
    assert "before init_ray" in result.stdout and "PYTHONPATH=" in result.stdout


def make_loss_batch(seed=3, batch=4, length=6):
    batched = import_nemo_rl("nemo_rl.distributed.batched_data_dict")
    generator = torch.Generator().manual_seed(seed)
    generation = -torch.rand(batch, length, generator=generator)
    current = generation[:, 1:] + 0.3 * torch.randn(batch, length - 1, generator=generator)
    advantages = torch.randn(batch, 1, generator=generator).expand(batch, length).contiguous()
    token_mask = torch.ones(batch, length)
    token_mask[:, -1] = 0
    sample_mask = torch.tensor([1.0, 1.0, 0.0, 1.0])
    data = batched.BatchedDataDict(
        {
            "input_ids": torch.zeros(batch, length, dtype=torch.long),
            "advantages": advantages,
            "prev_logprobs": torch.zeros(batch, length),  # as the trainer fills it when forced
            "generation_logprobs": generation,
            "reference_policy_logprobs": generation - 0.5,
            "token_mask": token_mask,
            "sample_mask": sample_mask,
        }
    )
    valid_tokens = (token_mask[:, 1:] * sample_mask[:, None]).sum()
    return current, data, sample_mask.sum(), valid_tokens


@pytest.mark.parametrize(
    "settings",
    [
        {"force_on_policy_ratio": True},
        {"reference_policy_kl_penalty": 0.05},
        {"use_importance_sampling_correction": True},
        {"ratio_clip_max": 0.28},
    ],
    ids=["force_on_policy_ratio", "kl", "importance_sampling", "clip_higher"],
)
def test_mmpo_loss_equals_nemo_rl_loss_for_the_same_config(settings):
    config = loss_module.ClippedPGLossConfig(name="mmpo", **settings)
    current, data, seqs, toks = make_loss_batch()
    ours, our_metrics = MMPOClippedPGLossFn(config)(current, data, seqs, toks)
    theirs, their_metrics = loss_module.ClippedPGLossFn(config)(current, data, seqs, toks)
    assert torch.equal(ours, theirs)
    for key, value in their_metrics.items():
        assert our_metrics[key] == value
    if settings.get("force_on_policy_ratio"):
        assert our_metrics["probs_ratio"] == pytest.approx(1.0)


def test_non_paper_settings_are_reported_not_rewritten(capsys):
    config = loss_module.ClippedPGLossConfig(name="mmpo", reference_policy_kl_penalty=0.05)
    loss = MMPOClippedPGLossFn(config)
    assert loss.reference_policy_kl_penalty == 0.05
    assert "loss_fn.reference_policy_kl_penalty=0.05 (paper: 0.0)" in capsys.readouterr().out


def test_eval_extra_is_co_installable_with_nemo_rl_lock():
    """The ``eval`` extra pins math-verify's antlr4 runtime to the version NeMo-RL locks."""
    import re
    from pathlib import Path

    import tomllib

    from nemo_mmpo.checkout import find_nemo_rl_root

    lock = (find_nemo_rl_root() / "uv.lock").read_text()
    locked = re.search(r'name = "antlr4-python3-runtime"\nversion = "([^"]+)"', lock).group(1)
    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    math_verify = next(
        item
        for item in project["project"]["optional-dependencies"]["eval"]
        if "math-verify" in item
    )
    major, *rest = locked.split(".")  # math-verify names 4.9.3 "antlr4_9_3"
    assert f"antlr{major}_{'_'.join(rest)}]" in math_verify, (math_verify, locked)
