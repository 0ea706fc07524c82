"""Ready for NeMo-RL's next estimator API: pull requests #3773, #4158, #3837 and #4160,
simulated on main.

All came after our main snapshot (2026-08-22). Their public descriptions and files say:

- #3773 (``feat(sc): support PPO in single controller``) types the estimator config and narrows
  its ``name`` to a ``Literal`` of NeMo-RL's own names, so ``MasterConfig(**config)`` in
  ``run_grpo.py`` would refuse ``name: mmpo`` before our factory hook runs;
- #4158 (``fix(LOO-Norm-Advantage)``) makes ``calculate_baseline_and_std_per_prompt`` return
  three values (baseline, std and a per-sample flag: the rewards feeding that sample's std are
  all one value) and gives ``compute_advantage`` a ``valid_mask`` argument, which the trainers
  pass (the step's ``sample_mask``);
- #3837 (merged) passes ``valid_mask=sample_mask`` from the single controller, and NeMo-RL's
  GRPO estimator honours it (``advantage_estimator.py`` as merged, read with the search tools:
  ``calculate_baseline_and_std_per_prompt(prompt_ids, rewards, torch.ones_like(rewards) if
  valid_mask is None else valid_mask.float(), ...)``); #4160 (open) passes the legacy loops'
  ``train_data["sample_mask"]`` the same way ("masked members do not vote").

Here copies of main's ``advantage_estimator.py`` and ``grpo.py`` are changed that way (the
``name`` field a ``Literal`` of :data:`~nemo_mmpo.nemo_rl.names.NEMO_RL_ESTIMATORS`; every caller
of ``calculate_baseline_and_std_per_prompt`` unpacks three values from a three-valued version;
every ``compute_advantage`` call in the trainers passes ``valid_mask=sample_mask``), and the
changed ``grpo_train`` trains two steps with ``name: mmpo`` after ``install()``, with two
rollouts of a step masked by the trainer's own sample filter (``_apply_mask_sample_filter``, as
an environment flags them, #3766): NeMo-RL's GRPO estimator changed as #3837 merged it and ours
both leave the masked rollouts out of their groups' statistics. What #4158's flag changes inside
NeMo-RL's own estimators is not simulated (our estimator does not read it).
The #3512 copy is ``test_advantage_result.py``; the unchanged trainer ``test_trainer_loop.py``.
"""

from __future__ import annotations

import re
import sys
from typing import Literal

import pytest
import torch
from nemo_rl_copies import (  # pydantic resolves annotations in sys.modules
    forget_new_modules,  # noqa: F401 (fixture)
    load_changed,
)
from nemo_rl_support import import_nemo_rl, master_config_from_recipe, nemo_rl_checkout
from single_controller_recipe import SINGLE_CONTROLLER_RECIPE

pytestmark = pytest.mark.nemo_rl
grpo = import_nemo_rl("nemo_rl.algorithms.grpo")
advantage_module = import_nemo_rl("nemo_rl.algorithms.advantage_estimator")
utils_module = import_nemo_rl("nemo_rl.algorithms.utils")
from pydantic import ValidationError
from test_trainer_loop import PROMPTS, TINY_RUN, run_trainer

from nemo_mmpo import compute_advantages, group_ids_from_prompt_rows
from nemo_mmpo.nemo_rl import MMPOAdvantageEstimator, install
from nemo_mmpo.nemo_rl.names import NEMO_RL_ESTIMATORS

if not hasattr(advantage_module, "AdvEstimatorConfig"):
    pytest.skip("v0.7.0: the estimator config is a TypedDict in grpo.py", allow_module_level=True)

CALL = "adv_estimator.compute_advantage("
BASELINE_CALL = re.compile(r"^(\s*)(\w+), (\w+) = calculate_baseline_and_std_per_prompt\(", re.M)


def literal_name(source: str) -> str:
    """#3773: ``name: str = "grpo"`` becomes a ``Literal`` of NeMo-RL's names."""
    changed, count = re.subn(
        r'^(\s+)name: str = "grpo".*$',
        lambda match: f'{match[1]}name: Literal{list(NEMO_RL_ESTIMATORS)!r} = "grpo"',
        source,
        flags=re.MULTILINE,
    )
    assert count == 1
    return "from typing import Literal\n" + changed


def three_values(source: str) -> str:
    """#4158: every ``a, b = calculate_baseline_and_std_per_prompt(`` unpacks three values."""
    changed, count = BASELINE_CALL.subn(
        r"\1\2, \3, _single_value = calculate_baseline_and_std_per_prompt(", source
    )
    assert count >= 1
    return changed


def valid_mask_passed(source: str) -> str:
    """#4158: each trainer's ``compute_advantage(...)`` also passes ``valid_mask=sample_mask``."""
    changed, count = re.subn(
        re.escape(CALL) + r"(\s*)",
        lambda match: f"{match[0]}valid_mask=sample_mask,{match[1]}",
        source,
    )
    assert count >= 2  # grpo_train and async_grpo_train
    return changed


def grpo_honours_valid_mask(source: str) -> str:
    """#3837 as merged: ``GRPOAdvantageEstimator.compute_advantage`` takes ``valid_mask`` and
    passes it to the baseline instead of all-ones (its other estimators are left alone)."""
    grpo_part, rest = source.split("class GDPOAdvantageEstimator", 1)
    signature = "def compute_advantage(self, prompt_ids, rewards, mask, **kwargs):"
    all_valid = "            torch.ones_like(rewards),\n"
    assert grpo_part.count(signature) == 1 and grpo_part.count(all_valid) == 1
    grpo_part = grpo_part.replace(
        signature,
        "def compute_advantage(self, prompt_ids, rewards, mask, valid_mask=None, **kwargs):",
    ).replace(
        all_valid,
        "            torch.ones_like(rewards) if valid_mask is None else valid_mask.float(),\n",
    )
    return grpo_part + "class GDPOAdvantageEstimator" + rest


def calculate_with_flag(original):
    """``calculate_baseline_and_std_per_prompt`` returning #4158's third value."""

    def calculate(prompts, rewards, valid_mask, leave_one_out_baseline=True, std_rewards=None):
        baseline, std = original(
            prompts, rewards, valid_mask, leave_one_out_baseline, std_rewards=std_rewards
        )
        values = rewards if std_rewards is None else std_rewards
        group = torch.unique(prompts, dim=0, return_inverse=True)[1]
        single = torch.ones_like(rewards, dtype=torch.bool)
        for row in range(len(rewards)):
            peers = (group == group[row]) & valid_mask.bool()
            if leave_one_out_baseline:
                peers[row] = False
            single[row] = torch.unique(values[peers]).numel() <= 1
        return baseline, std, single

    return calculate


@pytest.fixture
def next_api(monkeypatch, forget_new_modules):  # noqa: F811 (the imported fixture)
    """The changed ``advantage_estimator`` and ``grpo`` modules, installed for the test; NeMo-RL
    modules first imported during the test are forgotten afterwards (as in
    ``test_advantage_result.py``)."""
    monkeypatch.setattr(
        utils_module,
        "calculate_baseline_and_std_per_prompt",
        calculate_with_flag(utils_module.calculate_baseline_and_std_per_prompt),
    )
    load_changed(
        advantage_module,
        lambda s: grpo_honours_valid_mask(three_values(literal_name(s))),
        monkeypatch,
    )
    return load_changed(grpo, lambda s: valid_mask_passed(three_values(s)), monkeypatch)


def test_the_simulated_literal_refuses_mmpo_until_install(next_api):
    with pytest.raises(ValidationError, match=r"grpo\.adv_estimator\.name"):
        master_config_from_recipe("mmpo_math_qwen3_1.7b.yaml")
    install()
    config = master_config_from_recipe("mmpo_math_qwen3_1.7b.yaml")
    assert config.grpo.adv_estimator.name == "mmpo"
    for name in NEMO_RL_ESTIMATORS:  # NeMo-RL's own names stay valid, others stay refused
        assert master_config_from_recipe(
            "grpo_math_qwen3_1.7b.yaml", [f"grpo.adv_estimator.name={name}"]
        )
    with pytest.raises(ValidationError, match="'mmpo'"):
        master_config_from_recipe("mmpo_math_qwen3_1.7b.yaml", ["grpo.adv_estimator.name=mmpoo"])


#: rows the environment flags in each step (prompt-major: one of group 0's, one of group 1's)
FLAGGED = [1, 6]


def test_the_changed_trainer_trains_mmpo_with_valid_mask(
    next_api, ray_cluster, tmp_path, monkeypatch
):
    calls = []
    original = MMPOAdvantageEstimator.compute_advantage

    def recording(self, prompt_ids, rewards, mask, *args, **kwargs):
        result = original(self, prompt_ids, rewards, mask, *args, **kwargs)
        calls.append((self, prompt_ids.clone(), rewards.clone(), kwargs.get("valid_mask"), result))
        return result

    monkeypatch.setattr(MMPOAdvantageEstimator, "compute_advantage", recording)
    sample_filter = next_api._apply_mask_sample_filter

    def environment_flags(repeated_batch):  # as an environment's mask_sample flags (#3766)
        flags = torch.zeros(len(repeated_batch["loss_multiplier"]), dtype=torch.bool)
        flags[FLAGGED] = True
        repeated_batch["mask_sample"] = flags
        return sample_filter(repeated_batch)

    monkeypatch.setattr(next_api, "_apply_mask_sample_filter", environment_flags)
    install()  # hooks the changed modules, as it would the real ones
    config = master_config_from_recipe("mmpo_math_qwen3_1.7b.yaml", TINY_RUN)
    policy, logger, _ = run_trainer(next_api.grpo_train, config, tmp_path)

    estimators = sys.modules["nemo_rl.algorithms.advantage_estimator"]  # the changed module
    theirs = estimators.GRPOAdvantageEstimator(
        estimators.AdvEstimatorConfig(
            name="grpo", normalize_rewards=False, use_leave_one_out_baseline=False
        ),
        None,
    )
    order_one = MMPOAdvantageEstimator({"name": "mmpo", "truncation_order": 1})
    trainer_calls = list(calls)  # the calls below are recorded too
    assert len(trainer_calls) == len(policy.train_calls) == 2
    for (estimator, prompt_ids, rewards, valid_mask, advantages), step in zip(
        trainer_calls, policy.train_calls, strict=True
    ):
        assert prompt_ids.shape[0] == PROMPTS * 4
        assert valid_mask is not None  # the trainer passed its sample mask, by name
        assert torch.equal(valid_mask, step["data"]["sample_mask"])
        keep = valid_mask.bool()
        assert keep.tolist() == [row not in FLAGGED for row in range(len(keep))]
        expected = compute_advantages(
            rewards,
            group_ids_from_prompt_rows(prompt_ids),
            estimator.objective,
            "plugin",
            valid_mask=keep,
        ).to(advantages.dtype)
        assert torch.equal(step["data"]["advantages"][:, 0], expected)
        # the masked rollouts take no part in their groups, in ours and in NeMo-RL's GRPO
        mask = torch.ones(len(rewards), 3)
        alone = estimator.compute_advantage(prompt_ids[keep], rewards[keep], mask[keep])
        assert torch.equal(advantages[keep, 0], alone[:, 0])
        grpo_masked = theirs.compute_advantage(prompt_ids, rewards, mask, valid_mask=valid_mask)
        grpo_alone = theirs.compute_advantage(prompt_ids[keep], rewards[keep], mask[keep])
        assert torch.allclose(grpo_masked[keep, 0], grpo_alone[:, 0])
        ours_first = order_one.compute_advantage(prompt_ids, rewards, mask, valid_mask=valid_mask)
        assert torch.allclose(ours_first[keep, 0], grpo_masked[keep, 0], atol=1e-6)
    assert [step for step, _ in logger.metrics["train/mmpo/success_rate"]] == [1, 2]


def test_the_estimator_honours_valid_mask_as_the_trainer_passes_it():
    """A float 0/1 ``sample_mask`` by keyword, as #4158's trainers pass it: the masked rows take
    no part in their group's statistics (the same advantages as without those rows)."""
    estimator = MMPOAdvantageEstimator({"name": "mmpo"})
    prompt_ids = torch.arange(3).repeat_interleave(4)[:, None]
    rewards = torch.tensor([1, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1], dtype=torch.float32)
    sample_mask = torch.ones(12)
    sample_mask[[1, 6]] = 0.0
    masked = estimator.compute_advantage(
        prompt_ids=prompt_ids, rewards=rewards, mask=torch.ones(12, 3), valid_mask=sample_mask
    )[:, 0]
    keep = sample_mask.bool()
    alone = estimator.compute_advantage(prompt_ids[keep], rewards[keep], torch.ones(10, 3))[:, 0]
    assert torch.equal(masked[keep], alone)


# --- #3773 as merged: the single controller's MasterConfig holds grpo beside ppo -------------


def grpo_beside_ppo(source: str) -> str:
    """#3773 as merged (single_controller_utils/config.py): ``grpo`` optional beside a new
    ``ppo`` block (``PPOConfig``, whose estimator config has a ``Literal`` of its own)."""
    changed, count = re.subn(
        r"^    grpo: GRPOConfig$",
        "    grpo: Optional[GRPOConfig] = None\n    ppo: Optional[PPOConfig] = None",
        source,
        flags=re.MULTILINE,
    )
    assert count == 1
    anchor = "from nemo_rl.algorithms.loss import ClippedPGLossConfig\n"
    assert anchor in changed  # after its `from __future__` line
    return changed.replace(anchor, anchor + "from nemo_rl.algorithms.ppo import PPOConfig\n")


def single_controller_sections(tmp_path, overrides=()) -> dict:
    """A single-controller recipe (the paper's, with ``async_rl``), as its entry point loads it
    (``nemo_mmpo.recipes.load``: its ``nemo_rl/`` bases read from this session's checkout)."""
    from nemo_mmpo.checkout import CONFIGS_DIR
    from nemo_mmpo.recipes import load

    recipe = tmp_path / "single_controller.yaml"
    paper = CONFIGS_DIR / "mmpo_math_qwen3_1.7b.yaml"
    recipe.write_text(SINGLE_CONTROLLER_RECIPE.format(base=paper))
    sections = load(recipe, list(overrides), nemo_rl_root=nemo_rl_checkout()).config  # resolved
    return {key: item for key, item in sections.items() if key not in ("cpu_backend", "evaluation")}


def test_the_single_controllers_master_config_keeps_our_names_too(next_api, tmp_path, monkeypatch):
    """Two ``MasterConfig`` s hold the one ``GRPOConfig`` (``grpo``'s and the single
    controller's, ``grpo`` optional there): after ``install()`` both accept ``name: mmpo``,
    whichever was rebuilt first; NeMo-RL's names stay valid, others refused."""
    sc_config = import_nemo_rl("nemo_rl.algorithms.single_controller_utils.config")
    changed = load_changed(sc_config, grpo_beside_ppo, monkeypatch)
    assert changed.MasterConfig.model_fields["ppo"].annotation is not None
    with pytest.raises(ValidationError, match=r"grpo\.adv_estimator\.name"):
        changed.MasterConfig(**single_controller_sections(tmp_path))
    install()
    read = changed.MasterConfig(**single_controller_sections(tmp_path))
    assert read.grpo.adv_estimator.name == "mmpo" and read.ppo is None
    assert master_config_from_recipe("mmpo_math_qwen3_1.7b.yaml").grpo.adv_estimator.name == "mmpo"
    for name in NEMO_RL_ESTIMATORS:
        sections = single_controller_sections(tmp_path, [f"grpo.adv_estimator.name={name}"])
        assert changed.MasterConfig(**sections).grpo.adv_estimator.name == name
    with pytest.raises(ValidationError, match="'mmpo'"):
        changed.MasterConfig(
            **single_controller_sections(tmp_path, ["grpo.adv_estimator.name=mmpoo"])
        )


def test_a_literal_install_cannot_reach_is_refused_in_one_line(next_api, monkeypatch):
    """Were the estimator config a union of several models, our names could not be added where
    ``MasterConfig`` checks them: ``install()`` says so, in one line, before hooking."""
    from pydantic import BaseModel

    class GAEConfig(BaseModel, extra="allow"):  # #3773's value-model estimator config
        name: Literal["gae", "raw_reward"] = "gae"

    grpo_module = sys.modules["nemo_rl.algorithms.grpo"]
    estimator = sys.modules["nemo_rl.algorithms.advantage_estimator"]
    field = grpo_module.GRPOConfig.model_fields["adv_estimator"]
    monkeypatch.setattr(field, "annotation", estimator.AdvEstimatorConfig | GAEConfig)
    grpo_module.GRPOConfig.model_rebuild(force=True)
    with pytest.raises(RuntimeError) as error:
        install()
    message = str(error.value)
    assert "\n" not in message and "grpo.adv_estimator.name is a Literal" in message
    assert "cannot reach" in message
