"""Where a CPU-rig run's policy starts: the newest checkpoint (a resume, as NeMo-RL's ``setup()``
finds it) or the warm start; for NeMo-RL's Megatron workers, the Hugging Face folder they import
(``policy.model_name``). Shared by the rig's drivers (:mod:`nemo_mmpo.cpu.rig.driver`,
:mod:`nemo_mmpo.cpu.rig.single_controller`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nemo_mmpo.char_tokenizer import PLAIN_CHAT_TEMPLATE
from nemo_mmpo.cpu.rig.rig_settings import TinySettings
from nemo_mmpo.cpu.rig.warm_start import load_or_make
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.sections import plain

#: The held-out problems, in the run's checkpoint directory (for ``nemo_mmpo.eval``).
HELD_OUT_FILE = "held_out.jsonl"


def noter(console: Any) -> Any:
    """``note(message)``: a ``[nemo-mmpo]`` line on ``console``, flushed."""

    def note(message: str) -> None:
        console.write(f"[nemo-mmpo] {message}\n")
        console.flush()

    return note


def task_start(settings: TinySettings, checkpoint_dir: Path) -> tuple[Any, list[Any], Path]:
    """``(tokenizer, training records, held-out file)`` of the run's task, the global RNGs
    seeded with ``cpu_backend.seed`` first; the held-out problems written (atomically) into
    ``checkpoint_dir`` for the evaluation."""
    import random

    import torch

    from nemo_mmpo.cpu.rig.model import char_tokenizer
    from nemo_mmpo.cpu.rig.task import datum, write_benchmark_file

    random.seed(settings.seed)
    torch.manual_seed(settings.seed)
    tokenizer = char_tokenizer()
    train, held_out = settings.task.split()
    records = [datum(tokenizer, problem, index) for index, problem in enumerate(train)]
    held_out_file = write_benchmark_file(checkpoint_dir / HELD_OUT_FILE, held_out)
    return tokenizer, records, held_out_file


#: the environment the rig grades with (NeMo-RL's Math-Verify ``MathEnvironment``)
RIG_ENVIRONMENT = "math"


#: ``format(sums) -> prompts``: the rig's sums as NeMo-RL formats the recipe's training data
SumFormat = Callable[[Sequence[Any]], list[str]]


def recipe_task_start(
    settings: TinySettings, data: dict[str, Any]
) -> tuple[Any, list[Any], SumFormat]:
    """``(tokenizer, training records, sum format)`` from the recipe's own ``data`` section
    (``cpu_backend.problems: recipe``): NeMo-RL's ``setup_response_data`` reads it as its
    ``run_grpo.py`` does (a user's JSONL and prompt file, relative to the working directory)
    with the rig's character tokenizer and a plain chat template; the global RNGs seeded with
    ``cpu_backend.seed`` first. Every dataset must be graded by NeMo-RL's math environment
    (``env_name: math``), the one the rig runs. The sum format (:func:`sum_format`) gives the
    warm start the rig's sums as this setup formats the recipe's problems."""
    import copy
    import random

    import torch
    from nemo_rl.data.utils import setup_response_data

    from nemo_mmpo.cpu.rig.model import char_tokenizer

    random.seed(settings.seed)
    torch.manual_seed(settings.seed)
    if data.get("use_multiple_dataloader"):
        raise MMPOInputError(
            "cpu_backend.problems=recipe reads one training dataloader: set "
            "data.use_multiple_dataloader=false"
        )
    default = data.get("default") or {}
    train = data["train"] if isinstance(data["train"], list) else [data["train"]]
    for dataset in train:
        env_name = {**default, **dataset}.get("env_name")
        if env_name != RIG_ENVIRONMENT:
            raise MMPOInputError(
                f"cpu_backend.problems=recipe grades with NeMo-RL's math environment and a "
                f"training dataset names env_name={env_name!r}: set env_name: math (or "
                "data.default.env_name: math)"
            )
    tokenizer = char_tokenizer()
    tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
    train_data, _ = setup_response_data(tokenizer, copy.deepcopy(data), None)
    records = [train_data[index] for index in range(len(train_data))]
    if not records:
        raise MMPOInputError("cpu_backend.problems=recipe: the recipe's data.train has no problems")
    return tokenizer, records, sum_format(train_data)


#: the message roles of a row NeMo-RL's math_hf_data_processor reads (ResponseDataset's rows)
ROW_ROLES = ["user", "assistant"]


def sum_format(train_data: Any) -> SumFormat:
    """``format(sums) -> prompts``: each sum's prompt as NeMo-RL formats the recipe's training
    problems, the text whose tokens the policy is given for it. Each sum becomes a row of the
    recipe's own dataset (its first row of a task, the problem and answer replaced by the sum's
    ``What is a + b?`` and total, as a user's JSONL of sums has them) and goes through the same
    task processors as the recipe's rows (NeMo-RL's ``AllTaskProcessedDataset`` with
    ``train_data``'s processors: the prompt file as it is, trailing newline and all, the system
    prompt, the chat template); with several training datasets, the sums take their tasks in
    turn. Refused in one line: rows of another shape than NeMo-RL's math processors read, a sum
    the processor cuts (``data.max_input_seq_length``), tokens that are not the text's."""

    def format_sums(sums: Sequence[Any]) -> list[str]:
        from nemo_rl.data.datasets import AllTaskProcessedDataset

        rows = _task_rows(train_data)
        tasks = list(rows)
        limit = train_data.max_seq_length
        formatted = AllTaskProcessedDataset(
            [_sum_row(rows[tasks[index % len(tasks)]], sum_) for index, sum_ in enumerate(sums)],
            train_data.tokenizer,
            None,
            train_data.task_data_processors,
            task_data_preprocessors=train_data.task_data_preprocessors,
            max_seq_length=limit,
        )
        prompts = []
        for index, problem in enumerate(sums):
            datum = formatted[index]
            text = "".join(message["content"] for message in datum["message_log"])
            tokens = [int(t) for m in datum["message_log"] for t in m["token_ids"]]
            if datum["loss_multiplier"] == 0:
                raise MMPOInputError(
                    f"cpu_backend.problems=recipe: NeMo-RL formats the sum {problem.prompt!r} as "
                    f"{text!r}, {datum['length']} tokens, not under data.max_input_seq_length="
                    f"{limit}, and cuts it: raise data.max_input_seq_length (and "
                    "policy.max_total_sequence_length: the prompt, then the response)"
                )
            if tokens != train_data.tokenizer.encode(text, add_special_tokens=False):
                raise MMPOInputError(
                    f"cpu_backend.problems=recipe: the recipe's data processor gives the sum "
                    f"{problem.prompt!r} tokens that are not those of its text {text!r}: the "
                    "warm start learns prompts as text; use NeMo-RL's math_hf_data_processor"
                )
            prompts.append(text)
        return prompts

    return format_sums


def _task_rows(train_data: Any) -> dict[str, dict[str, Any]]:
    """Each task's first row in the recipe's training data (task name -> row, in its order)."""
    rows: dict[str, dict[str, Any]] = {}
    for index, name in enumerate(train_data.dataset["task_name"]):
        if name not in rows:
            rows[name] = dict(train_data.dataset[index])
            roles = [message.get("role") for message in rows[name].get("messages") or []]
            if roles != ROW_ROLES and not {"problem", "expected_answer"} <= set(rows[name]):
                raise MMPOInputError(
                    f"cpu_backend.problems=recipe warm-starts on the rig's sums as rows of your "
                    f"data, and task {name}'s rows have neither messages {ROW_ROLES} (a problem, "
                    "then its answer: NeMo-RL's ResponseDataset) nor problem and expected_answer "
                    "(math_data_processor's): give the recipe such a dataset"
                )
        if len(rows) == len(train_data.task_data_processors):
            break
    return rows


def _sum_row(template: dict[str, Any], problem: Any) -> dict[str, Any]:
    """``template`` (a row of the recipe's data) with ``problem``'s prompt and answer."""
    if "messages" in template and [m.get("role") for m in template["messages"]] == ROW_ROLES:
        user, assistant = template["messages"]
        messages = [{**user, "content": problem.prompt}, {**assistant, "content": problem.answer}]
        return {**template, "messages": messages}
    return {**template, "problem": problem.prompt, "expected_answer": problem.answer}


def warm_start_prompts(settings: TinySettings, sums: SumFormat | None) -> tuple[str, ...] | None:
    """The warm start's training problems as the run formats them (``sums``), or None where the
    run gives the policy the sums as they are (the rig's own task, or a recipe whose prompt file
    is ``{}`` with neither system prompt nor newline): then the warm start is the rig's own,
    under its own cache key."""
    if sums is None:
        return None
    train, _ = settings.task.split()
    prompts = tuple(sums(train))
    return None if prompts == tuple(problem.prompt for problem in train) else prompts


def run_summary(checkpointer: Any, held_out_file: Path | None, log_dir: str, note: Any) -> dict:
    """Where a finished run wrote things (the newest checkpoint's weights, the held-out file,
    the log directory), noted as one JSON line."""
    import json

    latest = checkpointer.get_latest_checkpoint_path()
    summary = {
        "checkpoint": None if latest is None else str(Path(latest) / "policy" / "weights"),
        "held_out_file": None if held_out_file is None else str(held_out_file),
        "log_dir": log_dir,
    }
    note(json.dumps(summary))
    return summary


def policy_model(
    settings: TinySettings,
    tokenizer: Any,
    master: dict,
    checkpointer,
    note,
    sums: SumFormat | None = None,
):
    """``(model, optimizer path or None, loaded training info or None)``: the newest checkpoint
    when there is one (resume, as NeMo-RL's ``setup()``), else the warm-started model, trained
    on the sums as ``sums`` formats them (the recipe's data section: :func:`recipe_task_start`),
    or, with ``cpu_backend.warm_start.enabled: false``, the seeded random model."""
    from nemo_mmpo.cpu.rig.model import load_tiny_model, tiny_model

    last = checkpointer.get_latest_checkpoint_path()
    if last is not None:
        weights_path, optimizer_path = checkpointer.get_resume_paths(last)
        note(f"resuming from {last}")
        model = load_tiny_model(weights_path)
        return model, optimizer_path, checkpointer.load_training_info(last), last
    if not settings.warm_start.enabled:
        note(
            f"warm start: off (cpu_backend.warm_start.enabled=false): the seeded random "
            f"{settings.model.architecture} (seed {settings.seed})"
        )
        return tiny_model(tokenizer, settings.model, settings.seed), None, None, None
    prompts = warm_start_prompts(settings, sums)
    if prompts is not None:
        note(f"warm start: on the sums as NeMo-RL formats the recipe's problems: {prompts[0]!r}")
    spec = settings.warm_start_spec(master["policy"]["generation"], prompts)
    cache = None if settings.warm_start_cache is None else Path(settings.warm_start_cache)
    model, _, _ = load_or_make(spec, tokenizer, cache, log=note)
    return model, None, None, None


def megatron_start(
    settings: TinySettings,
    tokenizer: Any,
    master: dict,
    checkpointer,
    note,
    sums: SumFormat | None = None,
):
    """``(Hugging Face start folder, weights path, optimizer path, loaded training info, newest
    checkpoint)`` for NeMo-RL's Megatron policy: the newest checkpoint's Megatron weights and
    optimizer when there is one (resume, as NeMo-RL's ``setup()``), always with the warm start's
    folder as ``model_name`` (made once per run, before its first step)."""
    from nemo_mmpo.cpu.engines.megatron_policy import START_FOLDER, save_start_folder

    checkpoint_dir = Path(master["checkpointing"]["checkpoint_dir"])
    last = checkpointer.get_latest_checkpoint_path()
    if last is not None and (checkpoint_dir / START_FOLDER).is_dir():
        weights_path, optimizer_path = checkpointer.get_resume_paths(last)
        note(f"resuming from {last}")
        info = checkpointer.load_training_info(last)
        return checkpoint_dir / START_FOLDER, weights_path, optimizer_path, info, last
    if last is not None:
        raise MMPOInputError(
            f"{checkpoint_dir} has checkpoints but no {START_FOLDER}/ (the Megatron policy's "
            "model_name): it was written by another cpu_backend.policy; start a new "
            "checkpointing.checkpoint_dir"
        )
    model, _, _, _ = policy_model(settings, tokenizer, master, checkpointer, note, sums)
    return save_start_folder(model, tokenizer, checkpoint_dir), None, None, None, None


def named_model(raw_config: dict[str, Any], folder: Path) -> dict[str, Any]:
    """``raw_config`` with ``policy.model_name`` and ``policy.tokenizer.name`` set to the
    Hugging Face ``folder`` NeMo-RL's Megatron workers import."""
    folder = Path(folder).resolve()
    policy = dict(plain(raw_config["policy"]), model_name=str(folder))
    policy["tokenizer"] = dict(policy.get("tokenizer") or {}, name=str(folder))
    return dict(raw_config, policy=policy)
