"""A user's own task, in the user's own folder: a recipe with NeMo-RL's GRPO config, nemo-mmpo's
keys (``base/mmpo_common.yaml``, no task of its own) and a JSONL of the user's problems with a
prompt beside it, both named relative to that folder. The dry run passes with the data section
as written (no MATH: :func:`nemo_mmpo.data.math_task_files` finds none, ``--prepare-data``
refuses in one line, nothing is written), and NeMo-RL's own data setup
(``setup_response_data``, as its ``run_grpo.py`` calls it) reads the user's problems from the
working directory. No training. Runs on each NeMo-RL snapshot (the 3.13 sessions)."""

from __future__ import annotations

import json

import pytest
from nemo_rl_support import import_nemo_rl, nemo_rl_checkout

from nemo_mmpo.cpu.rig.model import char_tokenizer
from nemo_mmpo.data import math_task_files
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.launch import train

pytestmark = pytest.mark.nemo_rl
data_utils = import_nemo_rl("nemo_rl.data.utils")

PROBLEMS = [
    {"question": "What is 2+3?", "answer": "5"},
    {"question": "What is 7*6?", "answer": "42"},
    {"question": "What is 10-4?", "answer": "6"},
]
ONE_DATASET = """\
  train:
    dataset_name: ResponseDataset
    data_path: my_problems.jsonl
    input_key: question
    output_key: answer
    split_validation_size: 0
"""
# NeMo-RL's own form for a list (its grpo_multiple_datasets.yaml): the section replaced
TWO_DATASETS = """\
  _override_: true
  max_input_seq_length: 64
  shuffle: true
  num_workers: 1
  train:
    - dataset_name: ResponseDataset
      data_path: my_problems.jsonl
      input_key: question
      output_key: answer
      split_validation_size: 0
    - dataset_name: ResponseDataset
      data_path: my_problems.jsonl
      input_key: question
      output_key: answer
      split_validation_size: 0
"""


def users_folder(tmp_path, train_section: str):
    (tmp_path / "my_problems.jsonl").write_text(
        "".join(json.dumps(problem) + "\n" for problem in PROBLEMS)
    )
    (tmp_path / "my_prompt.txt").write_text("Solve: {}")
    (tmp_path / "my_recipe.yaml").write_text(
        "defaults:\n"
        "  - nemo_rl/grpo_math_1B.yaml\n"
        "  - base/mmpo_common.yaml\n"
        "grpo:\n"
        "  val_period: 0\n"  # no validation set: NeMo-RL's setup refuses its validation
        "data:\n"
        f"{train_section}"
        "  validation: null\n"
        "  default:\n"
        "    prompt_file: my_prompt.txt\n"
    )
    return sorted(path.name for path in tmp_path.iterdir())


@pytest.mark.parametrize("train_section", [ONE_DATASET, TWO_DATASETS], ids=["one", "list"])
def test_a_users_jsonl_passes_untouched_to_nemo_rls_data_setup(
    tmp_path, monkeypatch, capsys, train_section
):
    nemo_rl_checkout()
    written = users_folder(tmp_path, train_section)
    monkeypatch.chdir(tmp_path)
    loaded = train.check_and_plan(tmp_path / "my_recipe.yaml", [], print_config=False)
    assert "advantage: nemo-mmpo mmpo" in capsys.readouterr().out
    data = loaded.config["data"]
    assert data["validation"] is None
    datasets = data["train"] if isinstance(data["train"], list) else [data["train"]]
    assert [dataset["data_path"] for dataset in datasets] == ["my_problems.jsonl"] * len(datasets)
    assert math_task_files(loaded.config) is None  # not the MATH task: nothing to prepare
    with pytest.raises(MMPOInputError, match="nothing to prepare"):
        train.main(["--config", "my_recipe.yaml", "--prepare-data"])
    assert sorted(path.name for path in tmp_path.iterdir()) == written  # nothing written

    tokenizer = char_tokenizer()
    tokenizer.chat_template = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
    train_data, validation_data = data_utils.setup_response_data(tokenizer, data, None)
    assert validation_data is None
    assert len(train_data) == len(PROBLEMS) * len(datasets)
    prompts = {
        tokenizer.decode(train_data[index]["message_log"][0]["token_ids"])
        for index in range(len(train_data))
    }
    assert prompts == {f"Solve: {problem['question']}" for problem in PROBLEMS}
