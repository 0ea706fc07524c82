"""``nemo-mmpo eval watch`` takes the run the way ``nemo-mmpo train`` started it: the recipe
with the same Hydra overrides, or the run's own record or a checkpoint's saved ``config.yaml``
(refused in one line when the run left no record). The watcher itself is replaced by a stand-in
that records what it was given."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml
from nemo_rl_support import CONFIGS_DIR, nemo_rl_checkout

from nemo_mmpo.errors import MMPOInputError, handle
from nemo_mmpo.eval.__main__ import main
from nemo_mmpo.eval.convert import CPU_RIG_CONVERTER_SETUP
from nemo_mmpo.eval.worker_environments import MOVED_FLAG
from nemo_mmpo.recipes import load, write_run_record


@pytest.fixture
def watched(monkeypatch, tmp_path):
    """What the watcher is called with (``[(checkpoint_dir, keyword arguments)]``)."""
    nemo_rl_checkout()
    calls = []

    def stand_in(settings, checkpoint_dir, tensorboard_dir, every, **options):
        calls.append((checkpoint_dir, {"every": every, "settings": settings, **options}))
        return {}

    monkeypatch.setattr("nemo_mmpo.eval.watch.watch", stand_in)
    monkeypatch.setenv(MOVED_FLAG, "1")  # never moved into NeMo-RL's uv project here
    monkeypatch.chdir(tmp_path)  # the recipe's relative paths start in the working directory
    return calls


def overrides(tmp_path: Path) -> list[str]:
    return [
        "grpo.max_num_steps=4",
        "checkpointing.save_period=2",
        f"checkpointing.checkpoint_dir={tmp_path / 'run'}",
        "++logger.log_dir='logs/with space'",
        "~grpo.adv_estimator.k",
        f"evaluation.output_dir={tmp_path / 'evaluation'}",
    ]


def test_watch_takes_the_overrides_train_takes(watched, tmp_path):
    recipe = CONFIGS_DIR / "mmpo_tiny_cpu.yaml"
    main(["watch", "--config", str(recipe), "--backend", "hf", *overrides(tmp_path)])
    ((checkpoint_dir, options),) = watched
    config = load(recipe, overrides(tmp_path)).config  # what `nemo-mmpo train` reads
    assert checkpoint_dir == Path(config["checkpointing"]["checkpoint_dir"])
    assert options["last_step"] == config["grpo"]["max_num_steps"] == 4
    assert str(options["settings"].output_dir) == str(tmp_path / "evaluation")
    assert options["converter_setup"] == CPU_RIG_CONVERTER_SETUP  # a CPU-rig recipe


def test_an_unknown_option_is_refused_as_train_refuses_it(watched):
    recipe = CONFIGS_DIR / "mmpo_tiny_cpu.yaml"
    with pytest.raises(MMPOInputError, match="unknown option --folow"):
        main(["watch", "--config", str(recipe), "--folow"])
    assert watched == []


def saved_checkpoint(loaded, step: int) -> Path:
    """``step_<N>`` as NeMo-RL saves it for a CPU-rig run: its ``config.yaml`` lacks the
    ``cpu_backend`` section (the rig keeps it from NeMo-RL's ``MasterConfig``)."""
    folder = Path(loaded.config["checkpointing"]["checkpoint_dir"]) / f"step_{step}"
    folder.mkdir(parents=True)
    saved = {key: value for key, value in loaded.config.items() if key != "cpu_backend"}
    (folder / "config.yaml").write_text(yaml.safe_dump(saved))
    (folder / "training_info.json").write_text(json.dumps({"step": step}))
    return folder / "config.yaml"


def test_a_cpu_rig_runs_saved_config_watches_with_the_rigs_answers(watched, tmp_path):
    """The issue's case: given a CPU-rig run's ``step_N/config.yaml``, the watcher converted
    without the rig's answers (``No module named 'transformer_engine'``); read through the
    run's record, it is the run as started, ``cpu_backend`` included."""
    loaded = load(CONFIGS_DIR / "mmpo_tiny_cpu.yaml", overrides(tmp_path))
    write_run_record(loaded, tmp_path / "run")  # as `nemo-mmpo train` does
    saved = saved_checkpoint(loaded, 2)
    main(["watch", "--config", str(saved), "--backend", "hf", "grpo.max_num_steps=2"])
    main(["watch", "--config", str(tmp_path / "run" / "nemo_mmpo_recipe.yaml"), "--backend", "hf"])
    (_, from_saved), (_, from_record) = watched
    assert from_saved["converter_setup"] == from_record["converter_setup"]
    assert from_saved["converter_setup"] == CPU_RIG_CONVERTER_SETUP
    assert from_saved["last_step"] == 2 and from_record["last_step"] == 4


def test_a_saved_config_without_its_runs_record_is_refused_saying_what_to_pass(watched, tmp_path):
    saved = saved_checkpoint(load(CONFIGS_DIR / "mmpo_tiny_cpu.yaml", overrides(tmp_path)), 2)
    with pytest.raises(MMPOInputError) as error:
        main(["watch", "--config", str(saved)])
    assert "\n" not in str(error.value) and "--config RECIPE key=value" in str(error.value)
    assert watched == []


@pytest.mark.parametrize(
    ("recipe", "flags", "backend"),
    [
        ("mmpo_tiny_cpu.yaml", [], "hf"),  # a CPU-rig recipe: transformers, no flag needed
        ("mmpo_tiny_cpu_megatron.yaml", [], "hf"),
        ("mmpo_tiny_cpu.yaml", ["--backend", "vllm"], "vllm"),
        ("mmpo_math_qwen3_1.7b.yaml", [], "vllm"),  # a GPU recipe
        ("mmpo_math_qwen3_1.7b.yaml", ["--backend", "hf"], "hf"),
    ],
)
def test_the_backend_is_the_recipes_unless_named(watched, tmp_path, capsys, recipe, flags, backend):
    main(["watch", "--config", str(CONFIGS_DIR / recipe), "--check", *flags, *overrides(tmp_path)])
    assert f"to step 4 ({backend}); evaluation:" in capsys.readouterr().out
    main(["watch", "--config", str(CONFIGS_DIR / recipe), *flags, *overrides(tmp_path)])
    assert watched[-1][1]["backend"] == backend


def test_vllm_without_nemo_rl_says_where_the_watcher_runs(tmp_path, capsys, monkeypatch):
    """Where NeMo-RL is neither importable nor reachable by uv (a login node's Python), the
    watcher cannot find NeMo-RL's vLLM worker environment: one line saying what to run."""
    pytest.importorskip("math_verify")
    if importlib.util.find_spec("nemo_rl") is not None:
        pytest.skip("nemo_rl imports here: the watcher finds its environments")
    nemo_rl_checkout()
    monkeypatch.setenv(MOVED_FLAG, "1")  # no move into NeMo-RL's uv project
    monkeypatch.chdir(tmp_path)
    recipe = str(CONFIGS_DIR / "mmpo_tiny_cpu.yaml")
    code = handle(
        main, ["watch", "--config", recipe, "--backend", "vllm", *overrides(tmp_path)], "p"
    )
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(error) == 1, error
    assert "NEMO_RL_PATH=<your NeMo-RL checkout> nemo-mmpo eval watch" in error[0]
    assert "uv run --project /opt/nemo-rl nemo-mmpo eval watch" in error[0]


def test_the_watcher_formats_problems_as_the_recipe_trains_them(watched, tmp_path):
    """A GPU recipe's prompt: its training dataset's prompt file and NeMo-RL's tokenizer
    settings (``policy.tokenizer``); ``evaluation.template`` in their place when set."""
    recipe = str(CONFIGS_DIR / "mmpo_math_qwen3_1.7b.yaml")
    paper_template = "{}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
    main(["watch", "--config", recipe, *overrides(tmp_path)])
    main(["watch", "--config", recipe, *overrides(tmp_path), "evaluation.template=null"])
    (_, paper), (_, training) = watched
    assert paper["prompts"].template == paper_template  # the paper's, as base/paper_math.yaml
    assert training["prompts"].template is None
    assert training["prompts"].dataset["prompt_file"] == "data/math_boxed.txt"
    assert training["prompts"].tokenizer["name"] == "Qwen/Qwen3-1.7B-Base"


def test_a_training_prompt_the_watcher_cannot_build_is_refused_before_watching(watched, tmp_path):
    recipe = str(CONFIGS_DIR / "mmpo_math_qwen3_1.7b.yaml")
    refused = [
        *overrides(tmp_path),
        "evaluation.template=null",
        "data.default.processor=sft_processor",
    ]
    with pytest.raises(MMPOInputError, match=r"processor 'sft_processor'.*evaluation\.template"):
        main(["watch", "--config", recipe, "--check", *refused])
    assert watched == []


def test_answers_the_model_length_would_cut_are_refused_before_watching(watched, tmp_path):
    recipe = str(CONFIGS_DIR / "mmpo_math_qwen3_1.7b.yaml")
    too_long = [*overrides(tmp_path), "evaluation.max_new_tokens=8192"]
    with pytest.raises(MMPOInputError, match=r"to 4096 or less"):
        main(["watch", "--config", recipe, *too_long])
    assert watched == []
