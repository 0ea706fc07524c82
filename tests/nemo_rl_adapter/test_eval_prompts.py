"""The watcher's prompt for a held-out problem is NeMo-RL's training prompt for it: the recipe's
data section set up by NeMo-RL's own ``setup_response_data`` (a user's JSONL through
``ResponseDataset``, a prompt file ending in a newline, a system prompt file) with the
tokenizer NeMo-RL's ``get_tokenizer`` loads from ``policy.tokenizer`` (a local one with a chat
template: the hub is unreachable), against what the watcher hands its sampler, caught at the
sampler. ``evaluation.template`` opts out: that prompt, no system prompt, the same chat
template."""

from __future__ import annotations

import copy
import json

import pytest
from nemo_rl_support import import_nemo_rl

from nemo_mmpo.cpu.rig.model import char_tokenizer
from nemo_mmpo.eval import watch as watch_module
from nemo_mmpo.eval.prompts import prompt_format
from nemo_mmpo.eval.protocol import EvaluationSettings

pytestmark = pytest.mark.nemo_rl
data_utils = import_nemo_rl("nemo_rl.data.utils")
algorithm_utils = import_nemo_rl("nemo_rl.algorithms.utils")

#: a chat template of Qwen's shape that reads a chat_template_kwargs key, as Qwen3's does
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
    "{% endif %}"
)
PROBLEM = {"problem": "What is {x} if x = 2 + 3?", "answer": "5"}


@pytest.fixture
def recipe(tmp_path, monkeypatch):
    """A user's recipe (the parts the prompt reads), its files in the working directory."""
    tokenizer = char_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    (tmp_path / "my_problems.jsonl").write_text(json.dumps(PROBLEM) + "\n")
    (tmp_path / "my_prompt.txt").write_text("Solve {} and box it in \\boxed{{}}.\n")
    (tmp_path / "my_system.txt").write_text("You are careful.\n")
    monkeypatch.chdir(tmp_path)
    return {
        "policy": {
            "tokenizer": {
                "name": str(tmp_path / "tokenizer"),
                "chat_template_kwargs": {"enable_thinking": False},
            }
        },
        "data": {
            "max_input_seq_length": 512,
            "train": {
                "dataset_name": "ResponseDataset",
                "data_path": "my_problems.jsonl",
                "input_key": "problem",
                "output_key": "answer",
                "split_validation_size": 0,
            },
            "default": {
                "prompt_file": "my_prompt.txt",
                "system_prompt_file": "my_system.txt",
                "processor": "math_hf_data_processor",
                "env_name": "math",
            },
        },
    }


def training_prompt(recipe: dict) -> str:
    """NeMo-RL's prompt for the training problem, as its ``run_grpo.py`` sets the data up."""
    tokenizer = algorithm_utils.get_tokenizer(recipe["policy"]["tokenizer"])
    dataset, _ = data_utils.setup_response_data(tokenizer, copy.deepcopy(recipe["data"]), None)
    (message,) = dataset[0]["message_log"]
    return message["content"]


def watched_prompt(recipe: dict, template: str | None, tmp_path, monkeypatch) -> str:
    """What the watcher hands its sampler for the problem held out (one checkpoint, one sample)."""
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text(json.dumps(PROBLEM) + "\n")
    settings = EvaluationSettings(
        enabled=True,
        benchmarks={"mine": str(held_out)},
        samples=1,
        template=template,
        output_dir=str(tmp_path / "evaluation"),
    )
    sampled: list[str] = []

    class Sampler:
        def generate(self, prompts, n):
            sampled.extend(prompts)
            return [["\\boxed{5}"] * n for _ in prompts]

        def close(self):
            pass

    monkeypatch.setattr(watch_module, "make_sampler", lambda *args: Sampler())
    weights = tmp_path / "checkpoints" / "step_2" / "policy" / "weights"
    weights.mkdir(parents=True)
    (weights / "config.json").write_text("{}")
    (weights.parent.parent / "training_info.json").write_text("{}")
    watch_module.watch(
        settings,
        tmp_path / "checkpoints",
        tmp_path / "tensorboard",
        every=2,
        backend="hf",
        log=lambda _: None,
        prompts=prompt_format(recipe, template),
    )
    (prompt,) = sampled
    return prompt


def test_the_watchers_prompt_is_nemo_rls_training_prompt(recipe, tmp_path, monkeypatch):
    expected = training_prompt(recipe)
    assert expected.startswith("<|im_start|>system\nYou are careful.\n<|im_end|>")
    assert "Solve What is {x} if x = 2 + 3? and box it in \\boxed{}.\n<|im_end|>" in expected
    assert expected.endswith("<|im_start|>assistant\n<think></think>")  # the kwargs applied
    assert watched_prompt(recipe, None, tmp_path, monkeypatch) == expected


def test_the_recipes_own_chat_template_is_followed(recipe, tmp_path, monkeypatch):
    recipe["policy"]["tokenizer"]["chat_template"] = (
        "{% for message in messages %}[{{ message['role'] }}] {{ message['content'] }}{% endfor %}"
    )
    expected = training_prompt(recipe)
    assert expected.startswith("[system] You are careful.\n[user] Solve")
    assert watched_prompt(recipe, None, tmp_path, monkeypatch) == expected


def test_a_template_replaces_the_prompt_files_in_the_same_chat_template(
    recipe, tmp_path, monkeypatch
):
    prompt = watched_prompt(recipe, "{}\nAnswer in \\boxed{{}}.", tmp_path, monkeypatch)
    assert prompt == (
        "<|im_start|>user\nWhat is {x} if x = 2 + 3?\nAnswer in \\boxed{}.<|im_end|>\n"
        "<|im_start|>assistant\n<think></think>"
    )


def test_a_cpu_rig_recipes_prompt_is_the_one_the_rig_trains_with(recipe):
    """The CPU rehearsal (``base/tiny_cpu.yaml``: the rig on the recipe's own problems) trains
    with its character tokenizer and a plain chat template: the watcher formats with them."""
    from nemo_mmpo.cpu.rig.policy_start import recipe_task_start
    from nemo_mmpo.cpu.rig.rig_settings import TinySettings

    recipe["cpu_backend"] = {"enabled": True, "problems": "recipe"}
    records = recipe_task_start(TinySettings.from_config(recipe["cpu_backend"]), recipe["data"])[1]
    (message,) = records[0]["message_log"]
    assert (
        message["content"]
        == "You are careful.\nSolve What is {x} if x = 2 + 3? and box it in \\boxed{}.\n"
    )
    assert prompt_format(recipe, None).texts([PROBLEM]) == [message["content"]]


def test_the_in_loop_evaluation_samples_the_training_prompt(recipe, tmp_path):
    """NeMo-RL's ``validate``, hooked, hands its tokenizer: the in-loop evaluation's engine is
    asked for the training prompt too."""
    from nemo_mmpo.eval.in_loop import validate_in_loop

    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text(json.dumps(PROBLEM) + "\n")
    settings = EvaluationSettings(
        enabled=True,
        in_loop=True,
        benchmarks={"mine": str(held_out)},
        samples=1,
        output_dir=str(tmp_path / "evaluation"),
    )
    asked: list[str] = []

    class Engine:
        def sample_texts(self, prompts, samples, seed, **sampler):
            asked.extend(prompts)
            return [["\\boxed{5}"] * samples for _ in prompts]

    tokenizer = algorithm_utils.get_tokenizer(recipe["policy"]["tokenizer"])
    metrics, _ = validate_in_loop(Engine(), 1, settings, recipe, tokenizer)
    assert asked == [training_prompt(recipe)]
    assert metrics["accuracy"] == 1.0
