"""Every shipped recipe loads (as NeMo-RL's run_grpo.py loads it), passes every rule and
dry-runs without a GPU; bad recipes are refused naming the key.

These tests read NeMo-RL's base configs from a checkout (``NEMO_RL_PATH``; the test scripts
unpack a snapshot), without importing ``nemo_rl`` on the 3.11 suite: the login-node case.
"""

from __future__ import annotations

import sys
from pathlib import Path

import patience
import pytest
from nemo_rl_support import nemo_rl_checkout

from nemo_mmpo import MMPOInputError
from nemo_mmpo.data import math_task_files, prepare_math_task
from nemo_mmpo.launch import trainers
from nemo_mmpo.launch.plan import describe
from nemo_mmpo.launch.rules import RULES, check
from nemo_mmpo.recipes import load

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "examples" / "configs").glob("*.yaml"))
ENTRY_POINT = ROOT / "examples" / "run_mmpo_math.py"


@pytest.fixture(autouse=True)
def checkout():
    return nemo_rl_checkout()


def refused_without_single_controller(recipe: Path, checkout: Path) -> bool:
    """A single-controller recipe (``async_rl``) against a NeMo-RL without one (v0.7.0): the
    dry run refuses it in one line (tests/launch/test_single_controller.py checks it on
    main)."""
    config = load(recipe).config
    has_one = (checkout / trainers.SINGLE_CONTROLLER_SCRIPT).is_file()
    return trainers.is_single_controller(config) and not has_one


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
def test_recipe_loads_and_validates(recipe, checkout):
    loaded = load_run_config(recipe)
    errors = check(loaded.config).errors
    if refused_without_single_controller(recipe, checkout):
        assert errors == [trainers.missing_single_controller(checkout)]
        return
    assert errors == []
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


def test_prompt_file_shows_the_model_a_single_backslash(tmp_path):
    """The paper's prompt, which the MATH task's preparation writes where the recipe names it
    (beside its data, relative to the working directory, as NeMo-RL reads it)."""
    config = load_run_config(ROOT / "examples/configs/mmpo_math_qwen3_1.7b.yaml").config
    prompt = Path(config["data"]["default"]["prompt_file"])
    assert prompt in math_task_files(config)
    assert prepare_math_task([tmp_path / prompt]) == [tmp_path / prompt]  # no hub: the prompt only
    template = (tmp_path / prompt).read_text()
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
        (["grpo.adv_estimator.name=plugin"], "is a formula of mmpo: name=mmpo, estimator=plugin"),
    ],
)
def test_bad_recipes_are_rejected_with_the_key(overrides, fragment):
    loaded = load_run_config(ROOT / "examples/configs/mmpo_math_qwen3_1.7b.yaml", overrides)
    with pytest.raises(MMPOInputError) as error:
        validate_run_config(loaded.config)
    assert fragment in str(error.value)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda path: path.stem)
def test_dry_run_command(recipe, checkout):
    result = patience.run(
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
        timeout=patience.COMMAND_S,
    )
    if refused_without_single_controller(recipe, checkout):
        assert result.returncode == 2 and "run_grpo_single_controller.py" in result.stderr
        return
    assert result.returncode == 0, result.stderr
    assert "rollouts/step" in result.stdout
    if not recipe.name.startswith(("grpo_", "dmpo_")):  # NeMo-RL's GRPO estimator
        assert "a_k" in result.stdout
    if recipe.name.startswith("dmpo_math"):
        assert "DMPO penalty: weight 2, temperature 0.0666667, zero-signal groups" in result.stdout


def test_dry_run_reports_a_bad_override_and_fails():
    result = patience.run(
        [sys.executable, str(ENTRY_POINT), "--dry-run", "grpo.adv_estimator.estimator=exact"],
        capture_output=True,
        text=True,
        timeout=patience.COMMAND_S,
    )
    assert result.returncode == 2
    assert "grpo.adv_estimator.estimator='exact'" in result.stderr
    assert "Traceback" not in result.stderr


def fake_checkout(folder: Path, prompts: int) -> Path:
    """A NeMo-RL checkout of configs only (no config loader), its GRPO base with ``prompts``."""
    checkout = folder / "RL"
    (checkout / "examples" / "configs").mkdir(parents=True)
    (checkout / "nemo_rl").mkdir()
    (checkout / "examples" / "configs" / "grpo_math_1B_megatron.yaml").write_text(
        "defaults: grpo_math_1B.yaml\n"
        "policy:\n  megatron_cfg:\n    enabled: true\n    sequence_parallel: false\n"
        "  dynamic_batching:\n    train_mb_tokens: ${mul:${policy.max_total_sequence_length}, 2}\n"
        "logger:\n  _override_: true\n  log_dir: base_logs\n  only_in_base: 1\n"
    )
    (checkout / "examples" / "configs" / "grpo_math_1B.yaml").write_text(
        f"grpo:\n  val_at_start: false\n  num_prompts_per_step: {prompts}\n"
        f"  checkout_marker: {prompts}\nlogger:\n  only_in_grandparent: 1\n"
        "policy:\n  max_total_sequence_length: 64\n"
    )
    return checkout


def test_base_configs_resolve_without_nemo_rl_code(tmp_path, monkeypatch):
    """A checkout without NeMo-RL's config loader (only its configs): the OmegaConf fallback
    merges bases as NeMo-RL does (``_override_``, interpolations)."""
    from nemo_mmpo.checkout import find_nemo_rl_root

    checkout = fake_checkout(tmp_path, 32)
    monkeypatch.setenv("NEMO_RL_PATH", str(checkout))
    assert find_nemo_rl_root() == checkout.resolve()
    loaded = load(ROOT / "examples" / "configs" / "mmpo_math_qwen3_1.7b.yaml")
    assert "OmegaConf" in loaded.loader and loaded.nemo_rl_root == checkout.resolve()
    config = loaded.config
    assert config["grpo"]["num_prompts_per_step"] == 16  # ours wins over the base's 32
    assert config["grpo"]["val_at_start"] is True
    assert config["policy"]["megatron_cfg"]["sequence_parallel"] is False  # kept from the base
    assert config["policy"]["dynamic_batching"]["train_mb_tokens"] == 5120 * 2
    assert "only_in_grandparent" not in config["logger"]  # the base's _override_ dropped it
    assert config["logger"]["only_in_base"] == 1 and "_override_" not in config["logger"]
    assert config["logger"]["log_dir"] == "logs/mmpo_qwen3_1.7b"


MY_RECIPE = """\
# a researcher's recipe, in a folder of their own
defaults:
  - nemo_rl/grpo_math_1B_megatron.yaml
  - base/mmpo_common.yaml
  - my_settings.yaml
grpo:
  num_prompts_per_step: 16
  num_generations_per_prompt: 8
  adv_estimator:
    truncation_order: 3
policy:
  train_global_batch_size: 128
"""


def my_recipe(folder: Path) -> Path:
    """``folder/my_task.yaml``: NeMo-RL's base, our keys' defaults, and a file beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "my_settings.yaml").write_text("grpo:\n  max_num_steps: 7\n")
    (folder / "my_task.yaml").write_text(MY_RECIPE)
    return folder / "my_task.yaml"


def test_two_loads_against_two_checkouts_at_once_each_read_their_own_bases(tmp_path):
    """Nothing is linked into this clone: a recipe's ``nemo_rl/`` bases are the named
    checkout's, so loads against two checkouts at once (threads here) never mix them."""
    import threading

    recipe = tmp_path / "exp" / "my_task.yaml"
    recipe.parent.mkdir()
    recipe.write_text("defaults: nemo_rl/grpo_math_1B_megatron.yaml\ngrpo:\n  max_num_steps: 1\n")
    checkouts = {prompts: fake_checkout(tmp_path / str(prompts), prompts) for prompts in (4, 8)}
    seen: list[tuple[int, int]] = []

    def read(prompts):
        for _ in range(20):
            config = load(recipe, ["grpo.max_num_steps=2"], checkouts[prompts]).config
            seen.append((prompts, config["grpo"]["checkout_marker"]))

    threads = [threading.Thread(target=read, args=(prompts,)) for prompts in (4, 8, 4, 8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen) == 80 and all(wanted == found for wanted, found in seen)


@pytest.mark.parametrize("ref", ["v0.7.0", "main"])
def test_a_recipe_in_any_folder_dry_runs_against_each_snapshot_from_any_directory(ref, tmp_path):
    """The issue's check: a recipe in a temporary folder inheriting NeMo-RL's
    ``grpo_math_1B_megatron.yaml`` and our keys' defaults passes ``--dry-run`` against each
    snapshot, with ``--config`` relative to a third directory; its bases are that snapshot's."""
    import os

    from snapshots import snapshot_archives, unpack

    archives = [path for path in snapshot_archives() if path.name.startswith(f"nemo-rl-{ref}")]
    if not archives:
        pytest.skip("no NeMo-RL snapshots (NEMO_RL_SNAPSHOTS, default ../shared/nemo-rl)")
    checkout = unpack(archives[0], tmp_path / "snapshot")
    recipe = my_recipe(tmp_path / "exp")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = patience.run(
        [
            sys.executable,
            str(ENTRY_POINT),
            "--config",
            os.path.relpath(recipe, elsewhere),
            "--print-config",
            "grpo.adv_estimator.truncation_order=2",
            # NeMo-RL's config names its prompt relative to its checkout; a run from another
            # folder names the file (tests/launch/test_local_files.py)
            f"data.default.prompt_file={checkout.root / 'examples' / 'prompts' / 'cot.txt'}",
        ],
        capture_output=True,
        text=True,
        timeout=patience.COMMAND_S,
        cwd=elsewhere,
        env={**os.environ, "NEMO_RL_PATH": str(checkout.root)},
    )
    assert result.returncode == 0, result.stderr
    assert f"config: {recipe} grpo.adv_estimator.truncation_order=2 " in result.stdout
    assert str(checkout.root) in result.stdout  # NeMo-RL's loader, read from that snapshot
    import yaml

    printed = yaml.safe_load(result.stdout.split("trains with) ---\n")[1])
    assert printed["grpo"]["max_num_steps"] == 7  # the file beside the recipe
    assert printed["grpo"]["adv_estimator"]["truncation_order"] == 2
    assert printed["grpo"]["adv_estimator"]["name"] == "mmpo"  # base/mmpo_common.yaml
    base = yaml.safe_load(
        (checkout.root / "examples" / "configs" / "grpo_math_1B_megatron.yaml").read_text()
    )
    assert printed["policy"]["megatron_cfg"]["enabled"] == base["policy"]["megatron_cfg"]["enabled"]
    assert not list(tmp_path.glob("exp/nemo_rl*")) and not list(elsewhere.iterdir())


def test_a_tiny_recipe_in_any_folder_inherits_ours_by_name(tmp_path):
    """``nemo_mmpo/<file>`` names one of our recipes from anywhere: the tiny CPU task."""
    recipe = tmp_path / "my_tiny.yaml"
    recipe.write_text("defaults: nemo_mmpo/mmpo_tiny_cpu.yaml\ngrpo:\n  max_num_steps: 2\n")
    loaded = load(recipe)
    assert loaded.config["cpu_backend"]["enabled"] is True
    assert loaded.config["grpo"]["max_num_steps"] == 2
    assert check(loaded.config).errors == []
    assert "this machine's CPUs" in run_plan(loaded)


def test_an_unknown_base_names_where_it_was_looked_for(tmp_path, checkout):
    recipe = tmp_path / "r.yaml"
    for entry, fragment in [
        ("nemo_rl/no_such.yaml", f"NeMo-RL's checkout at {checkout} has no such config"),
        ("base/no_such.yaml", "nemo-mmpo's configs"),
        ("no_such.yaml", "relative to the file that names it"),
    ]:
        recipe.write_text(f"defaults: {entry}\n")
        with pytest.raises(MMPOInputError, match="which does not exist") as error:
            load(recipe)
        assert fragment in str(error.value) and "\n" not in str(error.value)
    recipe.write_text("defaults: r.yaml\n")
    with pytest.raises(MMPOInputError, match="inherits itself"):
        load(recipe)


def saved_checkpoint(run: Path, step: int, loaded) -> Path:
    """A ``step_<N>`` as NeMo-RL saves it: ``config.yaml`` (the resolved config; a CPU-rig
    run's lacks ``cpu_backend``, which the rig keeps from NeMo-RL) and ``training_info.json``."""
    import yaml

    folder = run / f"step_{step}"
    folder.mkdir(parents=True)
    saved = {key: value for key, value in loaded.config.items() if key != "cpu_backend"}
    (folder / "config.yaml").write_text(yaml.safe_dump(saved))
    (folder / "training_info.json").write_text("{}")
    return folder / "config.yaml"


def test_a_runs_record_and_its_saved_configs_read_the_run_as_it_started(tmp_path):
    """The record the entry point writes into the run's folder (what NeMo-RL's run_grpo.py
    reads) and a checkpoint's saved ``config.yaml`` beside it, as ``--config``: the recipe
    with the overrides the run started with, then new ones."""
    from nemo_mmpo.recipes import RECORD_NAME, write_run_record

    recipe = tmp_path / "my_tiny.yaml"
    recipe.write_text("defaults: nemo_mmpo/mmpo_tiny_cpu.yaml\n")
    started = ["grpo.max_num_steps=3", f"checkpointing.checkpoint_dir={tmp_path / 'run'}"]
    loaded = load(recipe, started)
    record = write_run_record(loaded, tmp_path / "run")
    assert record == tmp_path / "run" / RECORD_NAME
    saved = saved_checkpoint(tmp_path / "run", 3, loaded)
    recipe.write_text("defaults: nemo_mmpo/grpo_tiny_cpu.yaml\n")  # edited since: not read
    for given in (record, saved):
        again = load(given, ["grpo.val_period=1"])
        assert again.config == load(record.parent / RECORD_NAME, ["grpo.val_period=1"]).config
        assert again.config["cpu_backend"]["enabled"] is True  # the run's, not the saved copy's
        assert again.config["grpo"]["max_num_steps"] == 3
        assert again.config["grpo"]["val_period"] == 1
        assert again.config["grpo"]["adv_estimator"]["name"] == "mmpo"
        assert again.overrides == (*started, "grpo.val_period=1")
        assert again.recipe == recipe and f"started from {recipe}" in again.loader
    rewritten = write_run_record(load(saved), tmp_path / "again")  # a resumed run's record
    assert rewritten.read_text() == record.read_text()


def test_a_saved_config_whose_run_left_no_record_is_refused_in_one_line(tmp_path):
    loaded = load(ROOT / "examples" / "configs" / "mmpo_tiny_cpu.yaml")
    saved = saved_checkpoint(tmp_path / "run", 5, loaded)
    with pytest.raises(MMPOInputError) as error:
        load(saved)
    message = str(error.value)
    assert "\n" not in message and "--config RECIPE key=value" in message
    assert "step_5" in message and "nemo_mmpo_recipe.yaml is missing" in message


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
        (
            ["++loss_fn.dmpo_wieght=0.5"],
            ["loss_fn.dmpo_wieght=0.5 is not a setting of DMPO", "loss_fn.dmpo_weight?"],
        ),
    ],
    ids=[
        "misspelt",
        "upper_case",
        "unknown_key",
        "unbiased_one_rollout",
        "async",
        "on_policy",
        "misspelt_dmpo_key",
    ],
)
def test_dry_run_refuses_invalid_input_naming_the_key(overrides, fragments):
    result = patience.run(
        [sys.executable, str(ENTRY_POINT), "--dry-run", *overrides],
        capture_output=True,
        text=True,
        timeout=patience.COMMAND_S,
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
        (["++loss_fn.dmpo_wieght=0.5"], "did you mean loss_fn.dmpo_weight? DMPO's keys are"),
        (["++loss_fn.DMPO_temperature=0.5"], "loss_fn.DMPO_temperature=0.5 is not a setting"),
        (["loss_fn.name=DMPO"], "loss_fn.name='DMPO': did you mean 'dmpo'? (names are matched"),
        (["loss_fn.name='dmpo '"], "loss_fn.name='dmpo ': did you mean 'dmpo'?"),
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


def test_advantage_clipping_after_our_estimators_is_warned_naming_both_bounds():
    """NeMo-RL's ``_clip_grpo_advantages`` clamps whatever our estimator returns: the dry run
    names the bounds set, the estimator and the objective (MMPO's weight at f = 1 too)."""
    recipe = ROOT / "examples" / "configs" / "mmpo_math_qwen3_1.7b.yaml"
    clipped = ["++grpo.advantage_clip_low=-1.0", "++grpo.advantage_clip_high=1.0"]
    warnings = validate_run_config(load_run_config(recipe, clipped).config)
    (warning,) = [item for item in warnings if "NeMo-RL clamps the advantages" in item]
    assert "grpo.advantage_clip_low=-1.0, grpo.advantage_clip_high=1.0" in warning
    assert "estimator=plugin" in warning and "MMPO's weight reaches" in warning
    low_only = ["++grpo.advantage_clip_low=-1.0", "grpo.adv_estimator.name=maxrl"]
    warnings = validate_run_config(load_run_config(recipe, low_only).config)
    assert any("grpo.advantage_clip_low=-1.0: NeMo-RL clamps" in item for item in warnings)
    assert not any("clamps" in item for item in validate_run_config(load_run_config(recipe).config))


ASYNC_RECIPE = ROOT / "examples" / "configs" / "mmpo_math_qwen3_4b_async.yaml"


def validate_async(config) -> list[str]:
    """The warnings but the one about v0.7.0's async resume (its own test below)."""
    return [w for w in validate_run_config(config) if "resumed from a checkpoint" not in w]


def test_async_runs_longer_than_one_pass_of_the_training_set_are_refused(tmp_path, monkeypatch):
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
    (tmp_path / "prompt.txt").write_text("{}")
    # the user's own data: the MATH task's prompt, validation set and benchmarks are not
    # written for it (the dry run refuses them missing: tests/launch/test_local_files.py)
    overrides = [
        f"data.train.data_path={data}",
        "grpo.max_num_steps=2",
        f"data.default.prompt_file={tmp_path / 'prompt.txt'}",
        "data.validation=null",
        "grpo.val_period=0",  # no validation set: the watcher evaluates (rule validation_data)
        "grpo.val_at_end=false",
    ]
    monkeypatch.chdir(tmp_path)  # where the run starts: the recipe's benchmarks are there
    for name in ("math500", "olymmath", "amc23", "aime24", "aime25"):
        (tmp_path / "data" / "validation").mkdir(parents=True, exist_ok=True)
        (tmp_path / "data" / "validation" / f"{name}.jsonl").write_text("")
    loaded = load_run_config(ASYNC_RECIPE, overrides)
    with pytest.raises(MMPOInputError, match="holds 40 prompts = 2 batches of 16"):
        validate_run_config(loaded.config)
    one = load_run_config(ASYNC_RECIPE, [*overrides[:1], "grpo.max_num_steps=1", *overrides[2:]])
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
