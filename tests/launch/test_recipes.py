"""Every shipped recipe loads (as NeMo-RL's run_grpo.py loads it), passes every rule and
dry-runs without a GPU; bad recipes are refused naming the key.

These tests read NeMo-RL's base configs from a checkout (``NEMO_RL_PATH``; the test scripts
unpack a snapshot), without importing ``nemo_rl`` on the 3.11 suite: the login-node case.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from nemo_rl_support import nemo_rl_checkout

from nemo_mmpo import MMPOInputError
from nemo_mmpo.launch.plan import describe
from nemo_mmpo.launch.rules import RULES, check
from nemo_mmpo.recipes import load

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "examples" / "configs").glob("*.yaml"))
ENTRY_POINT = ROOT / "examples" / "run_mmpo_math.py"


@pytest.fixture(autouse=True)
def checkout():
    return nemo_rl_checkout()


def load_run_config(path, overrides=()):
    return load(path, overrides)


def validate_run_config(config):
    """The old single-call form: raise the first error, return the warnings."""
    findings = check(config)
    if findings.errors:
        raise MMPOInputError("; ".join(findings.errors))
    return findings.warnings


def run_plan(loaded):
    return describe(loaded)


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
    loaded = load_run_config(recipe)
    assert check(loaded.config).errors == []
    plan = run_plan(loaded)
    cpu = loaded.config.get("cpu_backend") or {}
    if cpu.get("enabled"):
        policy = (
            "NeMo-RL's MegatronPolicyWorker on 2 CPU workers (gloo; tensor 2 x pipeline 1 x "
            "context 1 x data 1)"
            if cpu.get("policy") == "megatron"
            else "nemo-mmpo CPU policy"
        )
        assert "this machine's CPUs" in plan and policy in plan
        assert ("Megatron" in plan) == (cpu.get("policy") == "megatron")  # no GPU layout line
        if cpu.get("engine") == "vllm":  # NeMo-RL's own vLLM generation, on vLLM's CPU build
            assert "NeMo-RL's VllmGeneration on vLLM's CPU build" in plan
        else:
            assert "vllm" not in plan
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
        (["grpo.adv_estimator.truncation_order=0"], "truncation_order=0: give a value >= 1"),
        (["grpo.adv_estimator.k=2.5"], "grpo.adv_estimator.k=2.5: give an integer"),
        (["grpo.adv_estimator.name=plugin"], "is a formula of MMPO: name=mmpo, estimator=plugin"),
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
    assert "Traceback" not in result.stderr


def test_base_configs_resolve_through_the_link_without_nemo_rl_code(tmp_path, monkeypatch):
    """A checkout without NeMo-RL's config loader (only its configs): the link is made and the
    OmegaConf fallback merges bases as NeMo-RL does (``_override_``, interpolations)."""
    import shutil

    from nemo_mmpo import checkout as checkout_module
    from nemo_mmpo.checkout import LINK_NAME, find_nemo_rl_root, link_nemo_rl_configs

    checkout = tmp_path / "RL"
    (checkout / "examples" / "configs").mkdir(parents=True)
    (checkout / "nemo_rl").mkdir()
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
    shutil.copytree(
        ROOT / "examples" / "configs", configs, ignore=shutil.ignore_patterns(LINK_NAME)
    )
    monkeypatch.setattr(checkout_module, "CONFIGS_DIR", configs)
    link = link_nemo_rl_configs(checkout, configs)
    assert link.is_symlink() and link_nemo_rl_configs(checkout, configs) == link
    loaded = load(configs / "mmpo_math_qwen3_1.7b.yaml")
    assert "no NeMo-RL checkout" not in loaded.loader or "OmegaConf" in loaded.loader
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
        link_nemo_rl_configs(checkout, configs)


def test_the_link_is_re_pointed_in_one_step_while_others_read_and_re_point_it(tmp_path):
    """Two processes (here threads) re-pointing ``nemo_rl`` at two checkouts at once both
    succeed, and a reader never finds the link missing: it is replaced by a rename, not removed
    and made again (which raised ``FileExistsError`` in the slower writer and showed readers
    no link in between)."""
    import os
    import threading

    from nemo_mmpo.checkout import LINK_NAME, link_nemo_rl_configs

    checkouts = []
    for name in ("a", "b"):
        (tmp_path / name / "examples" / "configs").mkdir(parents=True)
        checkouts.append(tmp_path / name)
    configs = tmp_path / "configs"
    configs.mkdir()
    targets = {str((checkout / "examples" / "configs").resolve()) for checkout in checkouts}
    link = configs / LINK_NAME
    link_nemo_rl_configs(checkouts[0], configs)
    problems: list[str] = []
    done = threading.Event()

    def re_point(checkout):
        try:
            for _ in range(300):
                link_nemo_rl_configs(checkout, configs)
        except Exception as error:  # recorded: the test fails on it
            problems.append(f"writer: {error!r}")

    def read():
        while not done.is_set():
            try:
                if os.readlink(link) not in targets:
                    problems.append(f"reader: {os.readlink(link)}")
            except OSError as error:
                problems.append(f"reader: {error!r}")
                return

    reader = threading.Thread(target=read)
    writers = [threading.Thread(target=re_point, args=(checkout,)) for checkout in checkouts * 2]
    reader.start()
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    done.set()
    reader.join()
    assert problems == []
    assert os.readlink(link) in targets
    assert sorted(path.name for path in configs.iterdir()) == [LINK_NAME]  # no staged link left


def test_a_recipe_whose_base_is_missing_is_refused_not_half_validated(tmp_path, monkeypatch):
    """Without a NeMo-RL checkout the recipes' bases cannot resolve: refused, naming the fix
    (the plan used to validate this project's keys alone, then NeMo-RL refused on the cluster)."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("defaults: nemo_rl/grpo_math_1B.yaml\ngrpo:\n  num_prompts_per_step: 4\n")
    monkeypatch.delenv("NEMO_RL_PATH", raising=False)
    monkeypatch.setattr("nemo_mmpo.recipes.find_nemo_rl_root", lambda: None)
    with pytest.raises(MMPOInputError, match="set NEMO_RL_PATH to a NeMo-RL checkout"):
        load(recipe)


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        (["grpo.adv_estimator.name=mmpoo"], ["grpo.adv_estimator.name='mmpoo'", "empirical_bayes"]),
        (["grpo.adv_estimator.name=MMPO"], ["name='MMPO'", "did you mean 'mmpo'"]),
        (
            ["+grpo.adv_estimator.trunc_order=3"],
            ["grpo.adv_estimator.trunc_order=3 is not a setting", "known: "],
        ),
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
    assert "Traceback" not in result.stderr


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
        (["++data_plane.enabled=true"], "set data_plane.enabled=false"),
        (["loss_fn.dmpo_temperature=0"], "loss_fn.dmpo_temperature=0: give a value > 0"),
        (["loss_fn.dmpo_weight=-2"], "loss_fn.dmpo_weight=-2: give a value >= 0"),
        (["loss_fn.dmpo_filter_zero_signal=1"], "dmpo_filter_zero_signal=1: give true or false"),
    ],
)
def test_dmpo_configs_that_cannot_train_as_configured_are_refused(overrides, fragment):
    loaded = load_run_config(DMPO_RECIPE, overrides)
    with pytest.raises(MMPOInputError) as error:
        validate_run_config(loaded.config)
    assert fragment in str(error.value)


def test_dmpo_recipe_is_the_papers_and_deviations_are_reported():
    assert validate_run_config(load_run_config(DMPO_RECIPE).config) == []
    overrides = [
        "loss_fn.dmpo_weight=1.0",
        "policy.train_global_batch_size=64",
        "grpo.adv_estimator.name=mmpo",
    ]
    warnings = validate_run_config(load_run_config(DMPO_RECIPE, overrides).config)
    assert any("loss_fn.dmpo_weight=1.0 (paper: 2.0)" in warning for warning in warnings)
    assert any("2 optimizer steps per batch" in warning for warning in warnings)
    assert any("the paper's DMPO uses GRPO's" in warning for warning in warnings)


ASYNC_RECIPE = ROOT / "examples" / "configs" / "mmpo_math_qwen3_4b_async.yaml"


def validate_async(config) -> list[str]:
    """The warnings but the one about v0.7.0's async resume (its own test below)."""
    return [w for w in validate_run_config(config) if "resumed from a checkpoint" not in w]


def test_async_runs_longer_than_one_pass_of_the_training_set_are_refused(tmp_path):
    """NeMo-RL's async trainer reads the training dataloader once and needs a batch beyond the
    last step: MATH train (7,500 prompts when the file is not written yet) is 468 batches of
    16, so 467 steps."""
    assert validate_async(load_run_config(ASYNC_RECIPE).config) == []
    loaded = load_run_config(ASYNC_RECIPE, ["grpo.max_num_steps=468"])
    with pytest.raises(MMPOInputError) as error:
        validate_run_config(loaded.config)
    assert "holds 7500 prompts = 468 batches of 16, so at step 468" in str(error.value)
    assert "Set grpo.max_num_steps=467 or fewer" in str(error.value)
    # a written file is counted
    data = tmp_path / "train.jsonl"
    data.write_text("".join(f'{{"problem": "p{i}", "answer": "{i}"}}\n' for i in range(40)))
    overrides = [f"data.train.data_path={data}", "grpo.max_num_steps=2"]
    loaded = load_run_config(ASYNC_RECIPE, overrides)
    with pytest.raises(MMPOInputError, match="holds 40 prompts = 2 batches of 16"):
        validate_run_config(loaded.config)
    one = load_run_config(ASYNC_RECIPE, [*overrides[:1], "grpo.max_num_steps=1"])
    assert validate_async(one.config) == []
    # the synchronous trainer loops over epochs itself
    loaded = load_run_config(ASYNC_RECIPE, [*overrides, "grpo.async_grpo.enabled=false"])
    validate_run_config(loaded.config)


def test_the_tiny_async_driver_shuffles_whole_epochs_into_one_pass():
    from nemo_mmpo.cpu.rig.driver import epochs_in_one_pass

    tiny = load_run_config(ROOT / "examples/configs/mmpo_tiny_cpu_async.yaml")
    assert validate_async(tiny.config) == []  # 300 steps: the driver repeats the epochs
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


FUSE_LOSS = "++policy.sequence_packing.fuse_loss=true"
PADDED_ROWS = {
    "pipeline": (
        ["policy.megatron_cfg.pipeline_model_parallel_size=2"],
        "policy.megatron_cfg.pipeline_model_parallel_size=2",
    ),
    "fp8": (
        ["policy.megatron_cfg.fp8_cfg.enabled=true"],
        "policy.megatron_cfg.fp8_cfg.enabled=true",
    ),
    "hybridep": (
        [
            "policy.megatron_cfg.moe_token_dispatcher_type=flex",
            "++policy.megatron_cfg.moe_flex_dispatcher_backend=hybridep",
        ],
        "moe_flex_dispatcher_backend=hybridep",
    ),
}


def fused_packing_errors(overrides):
    loaded = load_run_config(ROOT / "examples/configs/mmpo_math_qwen3_1.7b.yaml", overrides)
    return [error for error in check(loaded.config).errors if "fuse_loss" in error]


@pytest.mark.parametrize("padding", list(PADDED_ROWS))
def test_fused_packing_with_padded_rows_is_refused_on_nemo_rl_v0_7_0(padding, checkout):
    """The checkout's fused packed loss is v0.7.0's (``fused_packing_overruns_rows``; the
    NeMo-RL suite's ``test_megatron_layouts.py`` shows it crashes exactly when this holds), so
    fuse_loss with a padded packed row is refused, naming the keys and the fix."""
    from nemo_mmpo.nemo_rl.versions import fused_packing_overruns_rows

    overrides, key = PADDED_ROWS[padding]
    errors = fused_packing_errors([FUSE_LOSS, *overrides])
    if not fused_packing_overruns_rows(checkout):
        assert errors == []
        pytest.skip(f"{checkout}'s fused packed loss clamps the copy (not v0.7.0's)")
    assert len(errors) == 1 and key in errors[0]
    assert errors[0].startswith("policy.sequence_packing.fuse_loss=true with ")
    assert (
        "_pack_input_ids" in errors[0]
        and "Set policy.sequence_packing.fuse_loss=false" in (errors[0])
    )


@pytest.mark.parametrize(
    "overrides",
    [
        [FUSE_LOSS],  # no padded rows: v0.7.0's fused loss is fine
        ["policy.megatron_cfg.pipeline_model_parallel_size=2"],  # the per-sequence loss
        [FUSE_LOSS, "policy.sequence_packing.enabled=false", *PADDED_ROWS["fp8"][0]],
        [FUSE_LOSS, "policy.megatron_cfg.enabled=false", *PADDED_ROWS["pipeline"][0]],
    ],
    ids=["fused_alone", "pipeline_unfused", "fused_unpacked", "dtensor"],
)
def test_fused_packing_without_padded_rows_passes(overrides):
    assert fused_packing_errors(overrides) == []


def test_fused_packing_passes_on_a_nemo_rl_that_clamps_the_copy(monkeypatch):
    """Main's ``_pack_input_ids`` clamps the copy: the same settings pass there."""
    monkeypatch.setattr(
        "nemo_mmpo.nemo_rl.versions.fused_packing_overruns_rows", lambda nemo_rl_root: False
    )
    assert fused_packing_errors([FUSE_LOSS, *PADDED_ROWS["pipeline"][0]]) == []


def test_the_v0_7_0_checkout_is_recognised_by_its_code(checkout):
    """The marker reads ``_pack_input_ids`` itself: the version string is no guide (main's
    ``package_info.py`` says 0.6.0)."""
    import re

    from nemo_mmpo.nemo_rl.versions import fused_packing_overruns_rows

    info = (checkout / "nemo_rl" / "package_info.py").read_text(encoding="utf-8")
    version = ".".join(
        re.search(rf"^{part} = (\d+)", info, re.M)[1] for part in ("MAJOR", "MINOR", "PATCH")
    )
    if version != "0.7.0":
        pytest.skip(f"{checkout} is NeMo-RL {version}, not v0.7.0")
    assert fused_packing_overruns_rows(checkout)


def pipeline_temperature_warnings(recipe: str, overrides: list[str]) -> list[str]:
    loaded = load_run_config(ROOT / "examples" / "configs" / recipe, overrides)
    return [w for w in check(loaded.config).warnings if "divides every pipeline stage" in w]


PP2 = "policy.megatron_cfg.pipeline_model_parallel_size=2"


def test_pipeline_parallel_below_temperature_one_is_warned_about(checkout):
    """NeMo-RL's Megatron forward step divides each stage's output by the temperature
    (``pipeline_stages_divided_by_temperature``; ``test_megatron_layouts.py`` shows
    the log-probs it then computes), so PP > 1 with T != 1 is named, with the fix; at the
    paper's T = 1, with PP = 1, or with the CPU rig's own policy there is nothing to say."""
    from nemo_mmpo.nemo_rl.versions import pipeline_stages_divided_by_temperature

    gpu, cpu = "mmpo_math_qwen3_1.7b.yaml", "mmpo_tiny_cpu_megatron.yaml"
    warnings = pipeline_temperature_warnings(gpu, [PP2, "policy.generation.temperature=0.7"])
    if not pipeline_stages_divided_by_temperature(checkout):
        assert warnings == []
        pytest.skip(f"{checkout}'s Megatron forward step scales the last stage only")
    assert len(warnings) == 1
    assert warnings[0].startswith(
        "policy.megatron_cfg.pipeline_model_parallel_size=2 with policy.generation.temperature=0.7"
    )
    assert "Use policy.generation.temperature=1.0" in warnings[0]
    megatron_rig = [PP2, "policy.megatron_cfg.tensor_model_parallel_size=1"]
    assert (
        len(
            pipeline_temperature_warnings(cpu, [*megatron_rig, "policy.generation.temperature=0.7"])
        )
        == 1
    )
    for recipe, overrides in (
        (gpu, [PP2]),  # the paper's temperature 1.0
        (gpu, ["policy.generation.temperature=0.7"]),  # one stage
        (
            cpu,
            [*megatron_rig, "cpu_backend.policy=transformers", "policy.generation.temperature=0.7"],
        ),
    ):
        assert pipeline_temperature_warnings(recipe, overrides) == []


def test_a_megatron_split_that_does_not_divide_the_cpu_ranks_is_refused():
    recipe = ROOT / "examples/configs/mmpo_tiny_cpu_megatron.yaml"
    assert not check(load_run_config(recipe).config).errors
    errors = check(load_run_config(recipe, ["cpu_backend.megatron_ranks=3"]).config).errors
    assert any("cpu_backend.megatron_ranks=3 is not a multiple" in e for e in errors), errors


def async_resume_warnings(recipe: str) -> list[str]:
    loaded = load_run_config(ROOT / "examples" / "configs" / recipe)
    return [warning for warning in check(loaded.config).warnings if "resumed" in warning]


def test_async_resume_stall_is_read_from_the_code_of_each_snapshot(tmp_path):
    """v0.7.0's ``async_grpo_train`` trains on a restored step without waiting for the next
    one to be claimed (NVIDIA-NeMo/RL#3066); main waits. Read from each shipped snapshot."""
    import tarfile

    from nemo_mmpo.nemo_rl.versions import async_resume_can_stall

    snapshots = sorted((ROOT.parent / "shared" / "nemo-rl").glob("nemo-rl-*.tar.gz"))
    if not snapshots:
        pytest.skip("no NeMo-RL snapshots in ../shared/nemo-rl")
    seen = {}
    for archive in snapshots:
        with tarfile.open(archive) as tar:
            (member,) = [
                m for m in tar.getmembers() if m.name.endswith("nemo_rl/algorithms/grpo.py")
            ]
            target = tmp_path / archive.name / "nemo_rl" / "algorithms" / "grpo.py"
            target.parent.mkdir(parents=True)
            target.write_bytes(tar.extractfile(member).read())
        seen[archive.name] = async_resume_can_stall(tmp_path / archive.name)
    assert seen.pop("nemo-rl-v0.7.0.tar.gz") is True
    assert seen and not any(seen.values())  # main, the other snapshot


def test_async_recipes_warn_about_resume_on_a_nemo_rl_that_can_stall(checkout):
    from nemo_mmpo.nemo_rl.versions import async_resume_can_stall

    for recipe in ("mmpo_math_qwen3_4b_async.yaml", "mmpo_tiny_cpu_async.yaml"):
        warnings = async_resume_warnings(recipe)
        if async_resume_can_stall(checkout):
            assert len(warnings) == 1 and "NVIDIA-NeMo/RL#3066" in warnings[0]
            assert warnings[0].startswith("grpo.async_grpo.enabled=true with the NeMo-RL at ")
        else:
            assert warnings == []
    assert async_resume_warnings("mmpo_tiny_cpu.yaml") == []  # a synchronous recipe


def validation_at_start_warnings(recipe: str, *overrides: str) -> list[str]:
    loaded = load_run_config(ROOT / "examples" / "configs" / recipe, overrides)
    return [w for w in check(loaded.config).warnings if "grpo.val_at_start=true with" in w]


def test_async_validation_at_start_is_warned_about_where_it_can_stall(checkout):
    """NeMo-RL's step-0 validation pauses the collector while step 0 finishes; on a NeMo-RL
    without the wait for step 1 (v0.7.0) the first step can then wait forever. The GPU async
    recipe does not validate at start; the CPU rig validates before NeMo-RL's loop."""
    from nemo_mmpo.nemo_rl.versions import async_resume_can_stall

    gpu = "mmpo_math_qwen3_4b_async.yaml"
    assert validation_at_start_warnings(gpu) == []  # val_at_start: false
    warnings = validation_at_start_warnings(gpu, "grpo.val_at_start=true")
    if async_resume_can_stall(checkout):
        assert len(warnings) == 1 and "Set grpo.val_at_start=false" in warnings[0]
    else:
        assert warnings == []
    assert validation_at_start_warnings("mmpo_tiny_cpu_async.yaml") == []


def test_the_docs_table_names_every_rule_in_the_order_they_run():
    """docs/recipes.md's table of rules is the list --dry-run runs, in its order."""
    table = (
        (ROOT / "docs" / "recipes.md")
        .read_text(encoding="utf-8")
        .split("## What `--dry-run` checks")[1]
    )
    documented = [line.split("`")[1] for line in table.splitlines() if line.startswith("| `")]
    assert documented == [run.__name__ for run in RULES]


@pytest.mark.parametrize(
    "recipe, override",
    [
        ("mmpo_tiny_cpu_vllm.yaml", "grpo.async_grpo.enabled=true"),
        ("mmpo_tiny_cpu_vllm.yaml", "policy.generation.colocated.enabled=false"),
        ("mmpo_tiny_cpu_vllm.yaml", "policy.generation.vllm_cfg.async_engine=true"),
        ("mmpo_tiny_cpu_async_vllm.yaml", "policy.generation.colocated.enabled=true"),
        ("mmpo_tiny_cpu_async_vllm.yaml", "policy.generation.vllm_cfg.async_engine=false"),
    ],
)
def test_the_vllm_cpu_recipes_outside_their_layouts_are_refused_by_dry_run(recipe, override):
    """The driver's refusal (``vllm_engine_problem``) is --dry-run's too, before a run starts:
    vLLM colocated with ``grpo_train``, or ``AsyncLLM`` as ``async_grpo_train``'s separate
    engine, nothing between."""
    recipe = ROOT / "examples/configs" / recipe
    assert not check(load_run_config(recipe).config).errors
    errors = check(load_run_config(recipe, [override]).config).errors
    key = override.split("=")[0]
    assert any("cpu_backend.engine=vllm with" in e and key in e for e in errors), errors
