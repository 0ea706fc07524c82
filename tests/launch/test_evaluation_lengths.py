"""The dry run refuses an evaluation whose answers the watcher's vLLM would cut short: a prompt's
room (``data.max_input_seq_length``) and ``evaluation.max_new_tokens`` must fit the model length
the watcher samples with; and a training prompt the watcher cannot build (another data processor
than NeMo-RL's ``math_hf_data_processor``) unless ``evaluation.template`` says what to use.
Read with NeMo-RL's own loader and configs (the v0.7.0 snapshot), without importing
``nemo_rl``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from nemo_rl_support import nemo_rl_checkout

from nemo_mmpo.launch.rules import check
from nemo_mmpo.recipes import load

README = Path(__file__).resolve().parents[2] / "README.md"

#: the README's recipe on NeMo-RL's grpo_math_1B_megatron.yaml (model length 512), its files here
RECIPE = """\
defaults:
  - nemo_rl/grpo_math_1B_megatron.yaml
  - base/mmpo_common.yaml
data:
  train:
    dataset_name: ResponseDataset
    data_path: my_problems.jsonl
    input_key: problem
    output_key: answer
  default:
    prompt_file: my_prompt.txt
checkpointing:
  enabled: true
evaluation:
  enabled: true
  benchmarks:
    my_held_out: my_held_out.jsonl
"""
#: a prompt's room and an answer's that fit the 512 tokens
FITTING = ("data.max_input_seq_length=128", "policy.generation.max_new_tokens=384")


@pytest.fixture
def folder(tmp_path, monkeypatch):
    nemo_rl_checkout()
    (tmp_path / "my_recipe.yaml").write_text(RECIPE)
    for name in ("my_problems.jsonl", "my_held_out.jsonl"):
        (tmp_path / name).write_text('{"problem": "What is 2 + 3?", "answer": "5"}\n')
    (tmp_path / "my_prompt.txt").write_text("{}\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def errors(folder, *overrides: str) -> list[str]:
    return check(load(folder / "my_recipe.yaml", list(overrides)).config).errors


def test_the_readmes_recipe_fits(folder):
    """README.md's recipe as printed (its YAML block), the same files beside it."""
    blocks = re.findall(r"^```yaml\n(.*?)^```", README.read_text(), flags=re.DOTALL | re.M)
    (recipe,) = [block for block in blocks if "~/exp/my_recipe.yaml" in block.splitlines()[0]]
    (folder / "my_recipe.yaml").write_text(recipe)
    assert errors(folder) == []


def test_answers_that_do_not_fit_the_model_length_are_refused_naming_the_keys(folder):
    (error,) = errors(folder)
    assert "\n" not in error
    for key in (
        "evaluation.max_new_tokens=512",
        "data.max_input_seq_length=512",
        "policy.generation.vllm_cfg.max_model_len=512",
        "data.max_input_seq_length=128",  # the fix: a prompt's room, the rest to answers
        "policy.generation.max_new_tokens=384",
    ):
        assert key in error, error


def test_a_prompt_room_and_answers_that_fit_pass(folder):
    assert errors(folder, *FITTING) == []


def test_an_explicit_answer_length_is_checked_against_the_room_left(folder):
    (error,) = errors(folder, *FITTING, "evaluation.max_new_tokens=4096")
    assert "evaluation.max_new_tokens=4096" in error
    assert "lower evaluation.max_new_tokens to 384 or less" in error


def test_the_engines_own_model_length_is_the_one_checked(folder):
    (error,) = errors(folder, *FITTING, "policy.generation.vllm_cfg.max_model_len=256")
    assert "policy.generation.vllm_cfg.max_model_len=256" in error
    assert errors(folder, *FITTING, "policy.generation.vllm_cfg.max_model_len=1024") == []


def test_an_in_loop_evaluation_is_not_the_watchers(folder):
    found = errors(folder, "evaluation.in_loop=true")
    assert not [error for error in found if "max_new_tokens" in error], found


def test_a_processor_the_watcher_cannot_follow_needs_a_template(folder):
    (error,) = errors(folder, *FITTING, "data.default.processor=math_data_processor")
    assert "'math_data_processor'" in error and "evaluation.template" in error
    assert "\n" not in error
    template = "evaluation.template='Solve: {}'"
    assert errors(folder, *FITTING, "data.default.processor=math_data_processor", template) == []


def test_the_answer_length_training_gives_is_not_a_setting_nothing_reads(folder):
    """evaluation.max_new_tokens follows policy.generation.max_new_tokens by default
    (base/mmpo_common.yaml): with the evaluation off, only a value of the user's is warned."""
    off = ("evaluation.enabled=false",)
    warnings = check(load(folder / "my_recipe.yaml", [*FITTING, *off]).config).warnings
    assert not [warning for warning in warnings if "max_new_tokens" in warning], warnings
    own = [*FITTING, *off, "evaluation.max_new_tokens=100"]
    warnings = check(load(folder / "my_recipe.yaml", own).config).warnings
    assert [warning for warning in warnings if "evaluation.max_new_tokens=100" in warning]
