"""Where a CPU-rig run's policy starts: the newest checkpoint (a resume, as NeMo-RL's ``setup()``
finds it) or the warm start; for NeMo-RL's Megatron workers, the Hugging Face folder they import
(``policy.model_name``). Shared by the rig's drivers (:mod:`nemo_mmpo.cpu.rig.driver`,
:mod:`nemo_mmpo.cpu.rig.single_controller`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nemo_mmpo.cpu.rig.rig_settings import TinySettings
from nemo_mmpo.cpu.rig.warm_start import load_or_make
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.nemo_rl.sections import plain

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


#: the chat template the rig's character tokenizer gets for a recipe's own problems: the
#: messages' text as it is (NeMo-RL's data processors apply a chat template to every prompt;
#: the prompt file, applied before it, is the user's)
PLAIN_CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
#: the environment the rig grades with (NeMo-RL's Math-Verify ``MathEnvironment``)
RIG_ENVIRONMENT = "math"


def recipe_task_start(settings: TinySettings, data: dict[str, Any]) -> tuple[Any, list[Any]]:
    """``(tokenizer, training records)`` from the recipe's own ``data`` section
    (``cpu_backend.problems: recipe``): NeMo-RL's ``setup_response_data`` reads it as its
    ``run_grpo.py`` does (a user's JSONL and prompt file, relative to the working directory)
    with the rig's character tokenizer and a plain chat template; the global RNGs seeded with
    ``cpu_backend.seed`` first. Every dataset must be graded by NeMo-RL's math environment
    (``env_name: math``), the one the rig runs."""
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
    return tokenizer, records


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


def policy_model(settings: TinySettings, tokenizer: Any, master: dict, checkpointer, note):
    """``(model, optimizer path or None, loaded training info or None)``: the newest checkpoint
    when there is one (resume, as NeMo-RL's ``setup()``), else the warm-started model."""
    last = checkpointer.get_latest_checkpoint_path()
    if last is not None:
        from transformers import LlamaForCausalLM

        weights_path, optimizer_path = checkpointer.get_resume_paths(last)
        note(f"resuming from {last}")
        model = LlamaForCausalLM.from_pretrained(weights_path).float().eval()
        return model, optimizer_path, checkpointer.load_training_info(last), last
    spec = settings.warm_start_spec(master["policy"]["generation"])
    cache = None if settings.warm_start_cache is None else Path(settings.warm_start_cache)
    model, _, _ = load_or_make(spec, tokenizer, cache, log=note)
    return model, None, None, None


def megatron_start(settings: TinySettings, tokenizer: Any, master: dict, checkpointer, note):
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
    model, _, _, _ = policy_model(settings, tokenizer, master, checkpointer, note)
    return save_start_folder(model, tokenizer, checkpoint_dir), None, None, None, None


def named_model(raw_config: dict[str, Any], folder: Path) -> dict[str, Any]:
    """``raw_config`` with ``policy.model_name`` and ``policy.tokenizer.name`` set to the
    Hugging Face ``folder`` NeMo-RL's Megatron workers import."""
    folder = Path(folder).resolve()
    policy = dict(plain(raw_config["policy"]), model_name=str(folder))
    policy["tokenizer"] = dict(policy.get("tokenizer") or {}, name=str(folder))
    return dict(raw_config, policy=policy)
