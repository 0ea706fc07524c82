"""Every shipped recipe loads, validates and dry-runs without NeMo-RL or a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nemo_mmpo import MMPOInputError
from nemo_mmpo.nemo_rl.run_config import (
    apply_overrides,
    load_run_config,
    run_plan,
    validate_run_config,
)

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "examples" / "configs").glob("*.yaml"))
ENTRY_POINT = ROOT / "examples" / "run_mmpo_math.py"


def test_there_are_recipes_for_mmpo_and_every_baseline():
    names = {path.stem for path in RECIPES}
    assert {
        "mmpo_math_qwen3_1.7b",
        "mmpo_math_qwen3_4b",
        "grpo_math_qwen3_1.7b",
        "passk_math_qwen3_1.7b",
        "maxrl_math_qwen3_1.7b",
        "mmpo_math_qwen3_8b_2nodes",
        "mmpo_math_qwen3_32b_4nodes",
        "mmpo_math_qwen3_4b_async",
        "dmpo_math_qwen3_1.7b",
    } <= names


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda path: path.stem)
def test_recipe_loads_and_validates(recipe):
    loaded = load_run_config(recipe, use_nemo_rl=False)
    validate_run_config(loaded.config)
    plan = run_plan(loaded)
    if (loaded.config.get("cpu_backend") or {}).get("enabled"):
        assert "this machine's CPUs" in plan and "nemo-mmpo CPU policy" in plan
        assert "Megatron" not in plan and "vllm" not in plan
    elif config_is_async(loaded.config):
        assert "asynchronous GRPO" in plan and "on separate GPUs (8 for generation" in plan
    else:
        assert "Megatron" in plan and "INVALID" not in plan
        assert "colocated with training" in plan
    config = loaded.config
    assert config["loss_fn"]["name"] == ("dmpo" if recipe.stem.startswith("dmpo") else "mmpo")
    assert config["loss_fn"]["reference_policy_kl_penalty"] == 0.0
    assert config["loss_fn"]["ratio_clip_min"] == config["loss_fn"]["ratio_clip_max"] == 0.2
    assert config["grpo"]["reward_scaling"]["enabled"] is False
    assert config["policy"]["generation"]["temperature"] == 1.0
    if (config.get("cpu_backend") or {}).get("enabled"):
        return  # the tiny CPU task sets its own lengths
    total = config["policy"]["max_total_sequence_length"]
    assert (
        total
        == config["data"]["max_input_seq_length"] + config["policy"]["generation"]["max_new_tokens"]
    )


def config_is_async(config):
    return bool(config["grpo"].get("async_grpo", {}).get("enabled"))


def test_scale_recipes_state_their_parallel_layout():
    plan = run_plan(load_run_config(ROOT / "examples/configs/mmpo_math_qwen3_32b_4nodes.yaml"))
    assert "4 node(s) x 8 GPU(s) = 32 GPU(s)" in plan
    assert "tensor 4 x pipeline 2 x context 1 -> data parallel 4" in plan
    assert "tensor parallel 4, colocated with training" in plan
    plan = run_plan(load_run_config(ROOT / "examples/configs/mmpo_math_qwen3_4b_async.yaml"))
    assert "asynchronous GRPO" in plan and "-> data parallel 8" in plan
    assert "on separate GPUs (8 for generation, 8 for training)" in plan


def test_paper_recipe_values():
    config = load_run_config(ROOT / "examples/configs/mmpo_math_qwen3_1.7b.yaml").config
    assert config["grpo"]["num_prompts_per_step"] == 16
    assert config["grpo"]["num_generations_per_prompt"] == 8
    assert config["grpo"]["adv_estimator"]["truncation_order"] == 4
    assert config["grpo"]["adv_estimator"]["estimator"] == "plugin"
    assert config["grpo"]["val_period"] == 20
    assert config["policy"]["train_global_batch_size"] == 128
    assert config["policy"]["megatron_cfg"]["optimizer"]["lr"] == 1e-6
    assert config["policy"]["megatron_cfg"]["scheduler"]["lr_warmup_iters"] == 0
    assert config["policy"]["generation"]["max_new_tokens"] == 4096
    assert config["data"]["max_input_seq_length"] == 1024
    assert config["cluster"]["gpus_per_node"] * config["cluster"]["num_nodes"] == 2


def test_prompt_file_shows_the_model_a_single_backslash():
    config = load_run_config(ROOT / "examples/configs/mmpo_math_qwen3_1.7b.yaml").config
    template = (ROOT / config["data"]["default"]["prompt_file"]).read_text()
    prompt = template.format("What is 1+1?")
    assert prompt.startswith("What is 1+1?\n")
    assert "put your final answer within \\boxed{}." in prompt
    assert "\\\\boxed" not in prompt


def test_overrides_are_strict_like_nemo_rl():
    config = {"grpo": {"adv_estimator": {"truncation_order": 4}}}
    apply_overrides(config, ["grpo.adv_estimator.truncation_order=3"])
    assert config["grpo"]["adv_estimator"]["truncation_order"] == 3
    with pytest.raises(MMPOInputError, match=r"\+grpo.adv_estimator.order=3"):
        apply_overrides(config, ["grpo.adv_estimator.order=3"])
    apply_overrides(config, ["+grpo.adv_estimator.order=3", "~grpo.adv_estimator.truncation_order"])
    assert config["grpo"]["adv_estimator"] == {"order": 3}


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (
            ["grpo.adv_estimator.estimator=unbiased", "grpo.adv_estimator.truncation_order=9"],
            "T <= G",
        ),
        (["grpo.reward_scaling.enabled=true"], "grpo.adv_estimator.reward_threshold"),
        (["grpo.adv_estimator.name=passk_chen", "grpo.adv_estimator.k=12"], "k=12"),
        (["policy.train_global_batch_size=100"], "train_global_batch_size=100"),
        (["loss_fn.name=ppo"], "loss_fn.name='ppo'"),
        (["grpo.adv_estimator.moment_transform=beta"], "alpha=None"),
    ],
)
def test_bad_recipes_are_rejected_with_the_key(overrides, fragment):
    loaded = load_run_config(ROOT / "examples/configs/mmpo_math_qwen3_1.7b.yaml", overrides)
    with pytest.raises(MMPOInputError) as error:
        validate_run_config(loaded.config)
    assert fragment in str(error.value)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda path: path.stem)
def test_dry_run_command(recipe):
    result = subprocess.run(
        [
            sys.executable,
            str(ENTRY_POINT),
            "--config",
            str(recipe),
            "--dry-run",
            "grpo.adv_estimator.truncation_order=3",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "rollouts/step" in result.stdout
    if not recipe.name.startswith(("grpo_", "dmpo_")):  # NeMo-RL's GRPO estimator
        assert "a_k" in result.stdout
    if recipe.name.startswith("dmpo_math"):
        assert "DMPO penalty: weight 2, temperature 0.0666667, zero-signal groups" in result.stdout


def test_dry_run_reports_a_bad_override_and_fails():
    result = subprocess.run(
        [sys.executable, str(ENTRY_POINT), "--dry-run", "grpo.adv_estimator.estimator=exact"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "grpo.adv_estimator.estimator='exact'" in result.stderr


def test_base_configs_resolve_through_the_link_without_nemo_rl(tmp_path, monkeypatch):
    """A NeMo-RL-shaped checkout: the link is made and our loader merges the base like theirs."""
    import shutil

    from nemo_mmpo.nemo_rl.run_config import LINK_NAME as LINK
    from nemo_mmpo.nemo_rl.run_config import find_nemo_rl_root, link_nemo_rl_configs

    checkout = tmp_path / "RL"
    (checkout / "examples" / "configs").mkdir(parents=True)
    base = checkout / "examples" / "configs" / "grpo_math_1B_megatron.yaml"
    base.write_text(
        "defaults: grpo_math_1B.yaml\n"
        "policy:\n  megatron_cfg:\n    enabled: true\n    sequence_parallel: false\n"
        "  dynamic_batching:\n    train_mb_tokens: ${mul:${policy.max_total_sequence_length}, 2}\n"
        "logger:\n  _override_: true\n  log_dir: base_logs\n  only_in_base: 1\n"
    )
    (checkout / "examples" / "configs" / "grpo_math_1B.yaml").write_text(
        "grpo:\n  val_at_start: false\n  num_prompts_per_step: 32\n"
        "logger:\n  only_in_grandparent: 1\n"
    )
    monkeypatch.setenv("NEMO_RL_PATH", str(checkout))
    assert find_nemo_rl_root() == checkout.resolve()
    configs = tmp_path / "configs"
    # the checkout's own link (made by other tests or the entry point) is not copied
    shutil.copytree(ROOT / "examples" / "configs", configs, ignore=shutil.ignore_patterns(LINK))
    link = link_nemo_rl_configs(configs, checkout)
    assert link.is_symlink() and link_nemo_rl_configs(configs, checkout) == link
    loaded = load_run_config(configs / "mmpo_math_qwen3_1.7b.yaml", use_nemo_rl=False)
    assert loaded.unresolved_bases == []
    config = loaded.config
    assert config["grpo"]["num_prompts_per_step"] == 16  # ours wins over the base's 32
    assert config["grpo"]["val_at_start"] is True
    assert config["policy"]["megatron_cfg"]["sequence_parallel"] is False  # kept from the base
    assert config["policy"]["dynamic_batching"]["train_mb_tokens"] == 5120 * 2
    assert "only_in_grandparent" not in config["logger"]  # the base's _override_ dropped it
    assert config["logger"]["only_in_base"] == 1 and "_override_" not in config["logger"]
    assert config["logger"]["log_dir"] == "logs/mmpo_qwen3_1.7b"
    (configs / "nemo_rl").unlink()
    (configs / "nemo_rl").mkdir()
    with pytest.raises(MMPOInputError, match="is not a link"):
        link_nemo_rl_configs(configs, checkout)


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        (["grpo.adv_estimator.name=mmpoo"], ["grpo.adv_estimator.name='mmpoo'", "empirical_bayes"]),
        (["grpo.adv_estimator.name=MMPO"], ["name='MMPO'", "did you mean 'mmpo'"]),
        (["+grpo.adv_estimator.trunc_order=3"], ["grpo.adv_estimator.trunc_order=3", "known keys"]),
        (
            [
                "grpo.adv_estimator.estimator=unbiased",
                "grpo.num_generations_per_prompt=1",
                "grpo.adv_estimator.truncation_order=1",
                "policy.train_global_batch_size=16",
            ],
            ["estimator=unbiased", "num_generations_per_prompt=1", "2 <= G"],
        ),
        (
            ["grpo.async_grpo.enabled=true"],
            ["loss_fn.use_importance_sampling_correction=true"],
        ),
        (
            ["loss_fn.force_on_policy_ratio=true", "policy.train_global_batch_size=64"],
            ["loss_fn.force_on_policy_ratio=true", "policy.train_global_batch_size=128"],
        ),
    ],
    ids=["misspelt", "upper_case", "unknown_key", "unbiased_one_rollout", "async", "on_policy"],
)
def test_dry_run_refuses_invalid_input_naming_the_key(overrides, fragments):
    result = subprocess.run(
        [sys.executable, str(ENTRY_POINT), "--dry-run", *overrides],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    for fragment in fragments:
        assert fragment in result.stderr


def test_unbiased_with_order_equal_to_group_size_validates():
    loaded = load_run_config(
        ROOT / "examples/configs/mmpo_math_qwen3_1.7b.yaml",
        ["grpo.adv_estimator.estimator=unbiased", "grpo.adv_estimator.truncation_order=8"],
    )
    validate_run_config(loaded.config)


@pytest.mark.parametrize("as_model", [False, True])
def test_non_paper_loss_settings_are_warned_for_dict_and_model_configs(as_model):
    from pydantic import BaseModel, ConfigDict

    from nemo_mmpo.nemo_rl.paper_settings import paper_setting_deviations

    class LossConfig(BaseModel):  # the shape of NeMo-RL's ClippedPGLossConfig
        model_config = ConfigDict(extra="allow")
        reference_policy_kl_penalty: float = 0.01
        ratio_clip_max: float = 0.2

    values = {"name": "mmpo", "reference_policy_kl_penalty": 0.01, "ratio_clip_max": 0.2}
    config = LossConfig(**values) if as_model else values
    assert paper_setting_deviations(config) == [
        "loss_fn.reference_policy_kl_penalty=0.01 (paper: 0.0)"
    ]
    loaded = load_run_config(
        ROOT / "examples/configs/mmpo_math_qwen3_1.7b.yaml",
        ["loss_fn.reference_policy_kl_penalty=0.01"],
    )
    warnings = validate_run_config(loaded.config)
    assert any("reference_policy_kl_penalty=0.01 (paper: 0.0)" in item for item in warnings)


DMPO_RECIPE = ROOT / "examples" / "configs" / "dmpo_math_qwen3_1.7b.yaml"


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["loss_fn.force_on_policy_ratio=true"], "set loss_fn.force_on_policy_ratio=false"),
        (["+data_plane.enabled=true"], "set data_plane.enabled=false"),
        (["loss_fn.dmpo_temperature=0"], "loss_fn.dmpo_temperature=0 is not valid"),
        (["loss_fn.dmpo_weight=-2"], "loss_fn.dmpo_weight=-2 is not valid"),
    ],
)
def test_dmpo_configs_that_cannot_train_as_configured_are_refused(overrides, fragment):
    loaded = load_run_config(DMPO_RECIPE, overrides, use_nemo_rl=False)
    with pytest.raises(MMPOInputError) as error:
        validate_run_config(loaded.config)
    assert fragment in str(error.value)


def test_dmpo_recipe_is_the_papers_and_deviations_are_reported():
    assert validate_run_config(load_run_config(DMPO_RECIPE, use_nemo_rl=False).config) == []
    overrides = [
        "loss_fn.dmpo_weight=1.0",
        "policy.train_global_batch_size=64",
        "grpo.adv_estimator.name=mmpo",
    ]
    warnings = validate_run_config(
        load_run_config(DMPO_RECIPE, overrides, use_nemo_rl=False).config
    )
    assert any("loss_fn.dmpo_weight=1.0 (paper: 2.0)" in warning for warning in warnings)
    assert any("2 optimizer steps per batch" in warning for warning in warnings)
    assert any("the paper's DMPO uses GRPO's" in warning for warning in warnings)


ASYNC_RECIPE = ROOT / "examples" / "configs" / "mmpo_math_qwen3_4b_async.yaml"


def test_async_runs_longer_than_one_pass_of_the_training_set_are_refused(tmp_path):
    """NeMo-RL's async trainer reads the training dataloader once and needs a batch beyond the
    last step: MATH train (7,500 prompts when the file is not written yet) is 468 batches of
    16, so 467 steps."""
    assert validate_run_config(load_run_config(ASYNC_RECIPE, use_nemo_rl=False).config) == []
    loaded = load_run_config(ASYNC_RECIPE, ["grpo.max_num_steps=468"], use_nemo_rl=False)
    with pytest.raises(MMPOInputError) as error:
        validate_run_config(loaded.config)
    assert "holds 7500 prompts = 468 batches of 16, so at step 468" in str(error.value)
    assert "Set grpo.max_num_steps=467 or fewer" in str(error.value)
    # a written file is counted
    data = tmp_path / "train.jsonl"
    data.write_text("".join(f'{{"problem": "p{i}", "answer": "{i}"}}\n' for i in range(40)))
    overrides = [f"data.train.data_path={data}", "grpo.max_num_steps=2"]
    loaded = load_run_config(ASYNC_RECIPE, overrides, use_nemo_rl=False)
    with pytest.raises(MMPOInputError, match="holds 40 prompts = 2 batches of 16"):
        validate_run_config(loaded.config)
    one = load_run_config(ASYNC_RECIPE, [*overrides[:1], "grpo.max_num_steps=1"])
    assert validate_run_config(one.config) == []
    # the synchronous trainer loops over epochs itself
    loaded = load_run_config(ASYNC_RECIPE, [*overrides, "grpo.async_grpo.enabled=false"])
    validate_run_config(loaded.config)


def test_the_tiny_async_driver_shuffles_whole_epochs_into_one_pass():
    from nemo_mmpo.nemo_rl.tiny_cpu import epochs_in_one_pass

    tiny = load_run_config(ROOT / "examples/configs/mmpo_tiny_cpu_async.yaml", use_nemo_rl=False)
    assert validate_run_config(tiny.config) == []  # 300 steps: the driver repeats the epochs
    records = [{"idx": index} for index in range(80)]
    config = {"num_prompts_per_step": 8, "max_num_steps": 29, "max_num_epochs": 5}
    one_pass = epochs_in_one_pass(records, config, seed=0)
    assert len(one_pass) == 3 * 80  # 29 steps + 1 batch of 8: three epochs of 10 batches
    assert len(epochs_in_one_pass(records, {**config, "max_num_steps": 30}, seed=0)) == 4 * 80
    epochs = [one_pass[start : start + 80] for start in range(0, 240, 80)]
    assert all(sorted(record["idx"] for record in epoch) == list(range(80)) for epoch in epochs)
    assert epochs[0] != epochs[1]  # each epoch its own order
    assert one_pass == epochs_in_one_pass(records, config, seed=0)  # and reproducible
    with pytest.raises(MMPOInputError, match=r"set grpo\.max_num_epochs=3 or more"):
        epochs_in_one_pass(records, {**config, "max_num_epochs": 2}, seed=0)
