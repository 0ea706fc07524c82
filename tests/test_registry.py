"""The public registry (:mod:`nemo_mmpo.registry`, :func:`nemo_mmpo.register_estimator`,
:func:`nemo_mmpo.losses.register_loss`) and plug-in modules (:mod:`nemo_mmpo.plugins`): what a
researcher's own objective may be, and each bad one refused in one line naming it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Annotated

import pytest
import torch
from pydantic import Field

from nemo_mmpo import estimators, losses, plugins, registry
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.estimators import compute_advantages, mmpo_advantages, register_estimator
from nemo_mmpo.losses import register_loss

REPO = Path(__file__).resolve().parents[1]
REWARDS = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]])


@pytest.fixture
def scratch_registry(monkeypatch):
    """Registrations made in the test are gone after it."""
    monkeypatch.setattr(estimators, "_REGISTRY", dict(estimators._REGISTRY))
    monkeypatch.setattr(losses, "_LOSSES", dict(losses._LOSSES))
    monkeypatch.setattr(registry, "_frozen_by", [])


def test_a_registered_function_is_selected_by_its_name(scratch_registry):
    @register_estimator("halved_for_test")
    def halved(groups, objective, scale: float = 0.5):
        return scale * estimators.get_estimator("plugin")(groups, objective)

    assert "halved_for_test" in estimators.available_estimators()
    assert estimators.estimator_family("halved_for_test") is None
    assert torch.equal(
        mmpo_advantages(REWARDS, estimator="halved_for_test", scale=0.25),
        0.25 * mmpo_advantages(REWARDS),
    )
    # the same definition imported again (a worker, a re-import) is no conflict
    assert register_estimator("halved_for_test", halved.__wrapped__) is not None


@pytest.mark.parametrize(
    ("result", "fragment"),
    [
        (
            lambda groups: groups.rewards.unsqueeze(-1),
            "returned shape [8, 1] for inputs of shape [8]",
        ),
        (lambda groups: groups.rewards.long(), "not a floating dtype"),
        (lambda groups: groups.rewards.clone().requires_grad_(), "requires grad"),
        (lambda groups: [0.0] * 8, "returned list, not a tensor"),
    ],
)
def test_a_bad_output_stops_in_one_line_naming_the_plugin(scratch_registry, result, fragment):
    @register_estimator("bad_for_test")
    def bad(groups, objective):
        return result(groups)

    with pytest.raises(MMPOInputError) as raised:
        mmpo_advantages(REWARDS, estimator="bad_for_test")
    message = str(raised.value)
    assert fragment in message and "'bad_for_test'" in message and __name__ in message
    assert "\n" not in message


def test_a_nan_on_a_masked_row_is_refused_though_the_mask_would_hide_it(scratch_registry):
    @register_estimator("nan_when_masked_for_test")
    def nan_when_masked(groups, objective):
        plain = estimators.get_estimator("plugin")(groups, objective)
        return torch.where(groups.valid, plain, torch.full_like(plain, float("nan")))

    valid = torch.tensor([True, True, True, False, True, True, True, True])
    group_ids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    with pytest.raises(MMPOInputError, match=r"NaN or Inf in 1 row\(s\) \(1 of them masked\)"):
        compute_advantages(REWARDS.flatten(), group_ids, None, "nan_when_masked_for_test", valid)


@pytest.mark.parametrize(
    ("name", "keywords", "fragment"),
    [
        ("grpo", {}, "NeMo-RL's own estimator"),
        ("gdpo", {"family": "mmpo"}, "NeMo-RL's own estimator"),
        ("MMPO", {}, "too close to 'mmpo'"),
        ("plugn", {}, "too close to 'plugin'"),
        ("maxrl", {}, "already registered by nemo_mmpo.baselines"),
        ("not a name", {}, "lowercase identifier"),
    ],
)
def test_names_that_shadow_or_nearly_miss_are_refused(scratch_registry, name, keywords, fragment):
    with pytest.raises(MMPOInputError, match=fragment) as raised:
        register_estimator(name, lambda groups, objective: groups.rewards, **keywords)
    assert "\n" not in str(raised.value)


def test_an_option_two_entries_define_differently_is_refused(scratch_registry):
    with pytest.raises(
        MMPOInputError, match=r"option 'k' \(default 5, int\) differs from the one of estimator"
    ):

        @register_estimator("k_for_test")
        def with_k(groups, objective, k: int = 5):
            return groups.rewards

    @register_estimator("same_k_for_test")  # pass@k's option exactly: shared, not refused
    def same_k(groups, objective, k: int = 3):
        return groups.rewards


def test_a_class_needs_nemo_rls_protocol(scratch_registry):
    class NoProtocol:
        pass

    with pytest.raises(MMPOInputError, match="compute_advantage"):
        register_estimator("no_protocol_for_test", NoProtocol)

    class Protocol:
        def __init__(self, estimator_config, loss_config):
            pass

        def compute_advantage(self, prompt_ids, rewards, mask, **kwargs):
            return torch.zeros_like(mask, dtype=torch.float32)

    register_estimator("protocol_for_test", Protocol, options={"my_scale": 1.0})
    assert estimators.estimator_class("protocol_for_test") is Protocol
    assert estimators.estimator_options("protocol_for_test")["my_scale"].default == 1.0


def test_registering_after_install_is_refused(scratch_registry):
    registry.freeze("nemo_mmpo.nemo_rl.install()")
    with pytest.raises(MMPOInputError, match=r"after nemo_mmpo.nemo_rl.install\(\)") as raised:
        register_estimator("late_for_test", lambda groups, objective: groups.rewards)
    assert "nemo_mmpo.plugins" in str(raised.value)
    with pytest.raises(MMPOInputError, match="after"):
        register_loss("late_loss_for_test", "some.module:Loss")


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("clipped_pg", "NeMo-RL's own loss"),
        ("dmpoo", "too close to 'dmpo'"),
        ("mmpo", "already registered"),
    ],
)
def test_loss_names_are_refused_like_estimator_names(scratch_registry, name, fragment):
    with pytest.raises(MMPOInputError, match=fragment):
        register_loss(name, "some.module:Loss")


def test_a_loss_option_another_loss_reads_is_refused(scratch_registry):
    with pytest.raises(
        MMPOInputError, match=r"'dmpo_weight'.* read by loss 'dmpo' already \(nemo_mmpo.losses\)"
    ):
        register_loss("weighted_for_test", "some.module:Loss", options={"dmpo_weight": 1.0})
    register_loss("weighted_for_test", "some.module:Loss", options={"my_weight": 1.0})
    assert "weighted_for_test" in losses.all_loss_names()


@pytest.mark.parametrize(
    ("section", "fragment"),
    [
        ({"plugins": "my_objectives"}, "give a list of module names"),
        ({"plugins": ["my_objectives.py"]}, "write my_objectives"),
        ({"plugin": ["my_objectives"]}, "is not a setting"),
    ],
)
def test_a_bad_plugin_section_is_named(section, fragment):
    with pytest.raises(MMPOInputError, match=fragment):
        plugins.recipe_plugins({"nemo_mmpo": section})


PLUGIN = """
import torch
from nemo_mmpo import register_estimator

@register_estimator("doubled_from_a_file")
def doubled(groups, objective, factor: float = 2.0):
    from nemo_mmpo.estimators import get_estimator
    return factor * get_estimator("plugin")(groups, objective)
"""


def test_a_module_beside_the_recipe_is_imported_and_recorded_for_the_workers(tmp_path):
    """In a fresh process (the registry is the process's): the launcher's loading, then what a
    Ray worker does with the environment it inherits."""
    (tmp_path / "my_objectives.py").write_text(PLUGIN)
    script = textwrap.dedent(
        f"""
        import os, subprocess, sys
        from nemo_mmpo.plugins import load_plugins
        from nemo_mmpo.estimators import available_estimators
        print(load_plugins(["my_objectives"], {str(tmp_path)!r}))
        assert "doubled_from_a_file" in available_estimators()
        # a worker: a fresh interpreter with the environment, elsewhere
        worker = subprocess.run(
            [sys.executable, "-c", "from nemo_mmpo.estimators import get_estimator; "
             "print(get_estimator('doubled_from_a_file').__module__)"],
            env=os.environ, cwd="/", capture_output=True, text=True,
        )
        print(worker.stdout.strip() or worker.stderr[-500:])
        """
    )
    environment = {k: v for k, v in os.environ.items() if not k.startswith("NEMO_MMPO_PLUGIN")}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=environment, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == ["['my_objectives']", "my_objectives"]


def test_a_missing_plugin_module_is_named_with_the_fix(tmp_path):
    with pytest.raises(MMPOInputError, match=r"no module named 'not_there_for_test' beside"):
        plugins.load_plugins(["not_there_for_test"], tmp_path)


def test_an_annotated_option_is_checked_when_the_section_is_read(scratch_registry):
    """A constraint on an option (``Annotated[float, Field(gt=0)]``) holds in the recipe's
    section, so ``--dry-run`` refuses a bad value before any step."""
    from nemo_mmpo.nemo_rl.estimator_settings import read_estimator_settings

    @register_estimator("capped_for_test")
    def capped(groups, objective, cap_for_test: Annotated[float, Field(gt=0)] = 1.0):
        return groups.rewards.double().clamp(max=cap_for_test)

    assert read_estimator_settings({"name": "capped_for_test"}).options == {"cap_for_test": 1.0}
    with pytest.raises(MMPOInputError, match="cap_for_test"):
        read_estimator_settings({"name": "capped_for_test", "cap_for_test": -1.0})
