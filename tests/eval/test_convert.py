"""Converting a checkpoint for evaluation: the inputs that cannot be converted end in one line
naming the folder and the fix (the conversion itself, by NeMo-RL's converter on the Megatron
workers' checkpoint, runs in ``tests/cpu/test_tiny_run_megatron.py``)."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from nemo_mmpo.cli import handle
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.eval.__main__ import main
from nemo_mmpo.eval.convert import (
    CONVERTER,
    CPU_RIG_CONVERTER_SETUP,
    CPU_RIG_ENGINE_SETUP,
    hugging_face_weights,
    megatron_to_hugging_face,
)
from nemo_mmpo.eval.worker_environments import MOVED_FLAG

PACKAGE = Path(__file__).resolve().parents[2] / "nemo_mmpo"


def step_folder(root, step=5, megatron=True):
    """A finished NeMo-RL checkpoint folder: a Megatron one (``iter_*``), or junk weights."""
    step_dir = root / f"step_{step}"
    weights = step_dir / "policy" / "weights"
    (weights / "iter_0000000" if megatron else weights).mkdir(parents=True)
    (step_dir / "config.yaml").write_text("policy: {model_name: m, tokenizer: {name: m}}\n")
    (step_dir / "training_info.json").write_text(json.dumps({"step": step}) + "\n")
    return step_dir


def test_a_folder_that_is_neither_hugging_face_nor_megatron_is_named(tmp_path):
    step_dir = step_folder(tmp_path, megatron=False)
    with pytest.raises(MMPOInputError, match=r"neither a Hugging Face model .* nor a Megatron"):
        hugging_face_weights(step_dir, tmp_path / "work", tmp_path)


def test_without_nemo_rl_or_its_converter_the_fix_is_named(tmp_path):
    step_dir = step_folder(tmp_path)
    with pytest.raises(MMPOInputError, match="set NEMO_RL_PATH"):
        megatron_to_hugging_face(step_dir, tmp_path / "hf", None)
    with pytest.raises(MMPOInputError, match=r"convert_megatron_to_hf\.py does not exist"):
        megatron_to_hugging_face(step_dir, tmp_path / "hf", tmp_path / "not-nemo-rl")


def test_a_failing_converter_is_one_line_with_its_last_words_and_leaves_nothing(tmp_path):
    nemo_rl = tmp_path / "nemo-rl"
    (nemo_rl / CONVERTER).parent.mkdir(parents=True)
    (nemo_rl / CONVERTER).write_text("import sys\nsys.exit('cannot read ' + sys.argv[-1])\n")
    step_dir = step_folder(tmp_path)
    with pytest.raises(MMPOInputError) as caught:
        megatron_to_hugging_face(step_dir, tmp_path / "hf", nemo_rl, python=sys.executable)
    message = str(caught.value)
    assert "\n" not in message and "NeMo-RL's converter failed on" in message
    assert "(exit 1): cannot read" in message
    assert not (tmp_path / "hf").exists() and not (tmp_path / ".hf.partial").exists()


def test_the_watcher_on_a_folder_that_is_not_megatron_exits_2_with_one_line(
    tmp_path, capsys, monkeypatch
):
    pytest.importorskip("math_verify")  # the watcher starts its graders first
    monkeypatch.setenv(MOVED_FLAG, "1")  # as if in NeMo-RL's project already: no move there
    step_folder(tmp_path / "checkpoints", megatron=False)
    code = handle(
        main,
        [
            "watch",
            "--config",
            "examples/configs/mmpo_tiny_cpu_megatron.yaml",
            "--every",
            "5",
            f"checkpointing.checkpoint_dir={tmp_path / 'checkpoints'}",
            f"evaluation.output_dir={tmp_path / 'evaluation'}",
            f"logger.log_dir={tmp_path / 'logs'}",
        ],
        "nemo-mmpo eval",
    )
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(error) == 1 and "neither a Hugging Face model" in error[0]


@pytest.mark.parametrize("name", [*CPU_RIG_CONVERTER_SETUP, *CPU_RIG_ENGINE_SETUP])
def test_the_cpu_rig_answers_are_named_where_they_are(name):
    """Named, not imported (the rig sits above ``eval``): each name is a function of the
    package, read from its source (no import: the 3.11 suite has no NeMo-RL)."""
    module, _, function = name.rpartition(".")
    path = PACKAGE.parent.joinpath(*module.split(".")).with_suffix(".py")
    assert path.is_file(), name
    tree = ast.parse(path.read_text(encoding="utf-8"))
    assert function in {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
