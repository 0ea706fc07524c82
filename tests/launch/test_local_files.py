"""The dry run refuses, from the folder the run starts in, what NeMo-RL would fail on only after
the cluster started: a data file, prompt or benchmark that is not there (NeMo-RL opens them
relative to that folder), and an evaluation of checkpoints that are never written. Read with
NeMo-RL's own loader and configs (the v0.7.0 snapshot), without importing ``nemo_rl``."""

from __future__ import annotations

import json

import pytest
from nemo_rl_support import nemo_rl_checkout

from nemo_mmpo.launch.rules import check
from nemo_mmpo.launch.rules.files import named_files
from nemo_mmpo.recipes import load

#: a user's recipe on NeMo-RL's GPU config, as the README's: their JSONL, prompt and held-out file
USERS_RECIPE = """\
defaults:
  - nemo_rl/grpo_math_1B_megatron.yaml
  - base/mmpo_common.yaml
policy:
  generation:
    max_new_tokens: 384     # an answer's room and a prompt's fit the model length, 512
data:
  max_input_seq_length: 128
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
    my_held_out: held_out/my_held_out.jsonl
"""
USERS_FILES = ("my_problems.jsonl", "my_prompt.txt", "held_out/my_held_out.jsonl")


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """The user's folder, the working directory, with the recipe and no data yet."""
    nemo_rl_checkout()
    (tmp_path / "my_recipe.yaml").write_text(USERS_RECIPE)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def errors(folder, *overrides: str) -> list[str]:
    return check(load(folder / "my_recipe.yaml", list(overrides)).config).errors


def test_each_missing_file_is_named_with_its_key_and_the_folder(folder):
    found = errors(folder)
    assert len(found) == 3, found
    for key, path in (
        ("data.train.data_path", "my_problems.jsonl"),
        ("data.default.prompt_file", "my_prompt.txt"),
        ("evaluation.benchmarks.my_held_out", "held_out/my_held_out.jsonl"),
    ):
        (line,) = [error for error in found if error.startswith(f"{key}={path!r}")]
        assert f"does not exist from {folder}" in line and f"set {key}=<your file>" in line
    for name in USERS_FILES:
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_text(json.dumps({"problem": "What is 2 + 3?", "answer": "5"}))
    assert errors(folder) == []
    assert errors(folder, f"data.train.data_path={folder / 'my_problems.jsonl'}") == []


def test_nemo_rls_own_prompt_names_its_checkout(folder):
    """NeMo-RL's config names ``examples/prompts/cot.txt`` relative to its checkout: from the
    user's folder that is the README recipe's first failure, told with the file's full path."""
    for name in USERS_FILES:
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_text("{}")
    (error,) = errors(folder, "data.default.prompt_file=examples/prompts/cot.txt")
    cot = nemo_rl_checkout() / "examples" / "prompts" / "cot.txt"
    assert cot.is_file()
    assert "a file of NeMo-RL's checkout" in error and f"prompt_file={cot}" in error
    assert errors(folder, f"data.default.prompt_file={cot}") == []


def test_what_is_not_a_local_file_or_not_read_is_not_checked(folder):
    """A Hugging Face dataset name (no file suffix, as NeMo-RL's ``load_dataset_from_path``
    tells them apart) and a disabled evaluation's benchmarks are not looked for; a dataset's
    own prompt hides the default's; each dataset of a list is named by its index."""
    config = load(
        folder / "my_recipe.yaml",
        [
            "data.train.data_path=openai/gsm8k",
            "+data.train.prompt_file=own.txt",
            "evaluation.enabled=false",
        ],
    ).config
    assert named_files(config) == [("data.train.prompt_file", "own.txt")]
    config["data"]["train"] = [
        {"data_path": "a.jsonl", "prompt_file": None},
        {"data_path": "b.parquet"},
    ]
    assert named_files(config) == [
        ("data.train[0].data_path", "a.jsonl"),
        ("data.train[1].data_path", "b.parquet"),
        ("data.default.prompt_file", "my_prompt.txt"),
    ]


def test_the_watcher_needs_checkpoints(folder):
    for name in USERS_FILES:
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_text("{}")
    (error,) = errors(folder, "checkpointing.enabled=false")
    assert error.startswith("evaluation.enabled=true (the watcher")
    assert "set checkpointing.enabled=true, or evaluation.enabled=false" in error
    assert errors(folder, "checkpointing.enabled=false", "evaluation.enabled=false") == []


def test_nemo_rls_validation_needs_a_validation_set(folder):
    """NeMo-RL's setup asserts a validation set when validation is on: no split of the
    training set and no ``data.validation`` is refused, with the two ways out."""
    for name in USERS_FILES:
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_text("{}")
    assert errors(folder) == []  # NeMo-RL's train section splits 5 % off for validation
    (error,) = errors(folder, "data.train.split_validation_size=0")
    assert error.startswith("grpo.val_period=10 and no validation set"), error
    assert errors(folder, "data.train.split_validation_size=0", "grpo.val_period=0") == []
    validation = f"+data.validation={{data_path: {folder / 'my_problems.jsonl'}}}"
    assert errors(folder, "data.train.split_validation_size=0", validation) == []
