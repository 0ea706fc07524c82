"""Rules on what a run reads and writes in the user's folder: the data files, prompts and
evaluation benchmarks the recipe names (NeMo-RL opens them relative to the directory the run
starts in, so a path that does not exist there fails only after the cluster has started), and
checkpoints where the evaluation or a resume needs them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nemo_mmpo.checkout import find_nemo_rl_root
from nemo_mmpo.cpu.rig.policy_start import HELD_OUT_FILE
from nemo_mmpo.data import math_task_files
from nemo_mmpo.launch.rules.registry import Findings, rule
from nemo_mmpo.sections import value

#: the file suffixes NeMo-RL's ``load_dataset_from_path`` reads as local files (any other
#: ``data_path`` is a Hugging Face dataset name, or a ``save_to_disk`` folder)
LOCAL_DATA_SUFFIXES = (".arrow", ".csv", ".json", ".jsonl", ".parquet", ".txt")
#: the per-dataset keys that name a file NeMo-RL opens
PROMPT_KEYS = ("prompt_file", "system_prompt_file")


def _datasets(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(key, dataset as NeMo-RL reads it)`` for every training and validation dataset: its
    own keys, the missing ones filled from ``data.default`` (NeMo-RL's
    ``update_single_dataset_config``)."""
    default = data.get("default") if isinstance(data.get("default"), dict) else {}
    found = []
    for section in ("train", "validation"):
        entries = data.get(section)
        listed = entries if isinstance(entries, list) else [entries]
        for index, dataset in enumerate(listed):
            if not isinstance(dataset, dict):
                continue
            key = f"data.{section}" + (f"[{index}]" if isinstance(entries, list) else "")
            found.append((key, {**default, **dataset}))
    return found


def named_files(config: dict[str, Any]) -> list[tuple[str, str]]:
    """``(key, path)`` of each local file the run opens: the datasets' ``data_path`` (local
    by its suffix, as NeMo-RL decides), their prompt files, and with ``evaluation.enabled`` the
    benchmark files. The MATH task's files are left out (``nemo-mmpo train`` writes them), and
    the CPU rig's held-out file in the checkpoint directory (its driver writes it)."""
    data = value(config, "data")
    files: list[tuple[str, str]] = []
    for key, dataset in _datasets(data) if isinstance(data, dict) else []:
        path = dataset.get("data_path")
        if isinstance(path, str) and Path(path).suffix in LOCAL_DATA_SUFFIXES:
            files.append((_set_at(data, key, "data_path"), path))
        for name in PROMPT_KEYS:
            if isinstance(dataset.get(name), str):
                files.append((_set_at(data, key, name), dataset[name]))
    evaluation = _section(config, "evaluation")  # a bad one: the evaluation rule says so
    benchmarks = evaluation.get("benchmarks")
    if evaluation.get("enabled") is True and isinstance(benchmarks, dict):
        rig_held_out = None
        if value(config, "cpu_backend") is not None:
            checkpoint_dir = Path(str(value(config, "checkpointing.checkpoint_dir")))
            rig_held_out = checkpoint_dir / HELD_OUT_FILE  # the rig's driver writes it
        for name, path in benchmarks.items():
            if isinstance(path, str) and Path(path) != rig_held_out:
                files.append((f"evaluation.benchmarks.{name}", path))
    prepared = set(math_task_files(config) or [])
    unique = dict.fromkeys((key, path) for key, path in files if Path(path) not in prepared)
    return list(unique)


def _section(config: dict[str, Any], key: str) -> dict[str, Any]:
    """``config[key]`` when it is a mapping, else empty (its own rule reports a bad one)."""
    section = value(config, key)
    return section if isinstance(section, dict) else {}


def _set_at(data: dict[str, Any], dataset_key: str, name: str) -> str:
    """Where a dataset's ``name`` was set: the dataset's own key, or ``data.default``'s."""
    section, _, index = dataset_key.removeprefix("data.").partition("[")
    entries = data.get(section)
    own = entries[int(index[:-1])] if index else entries
    return f"{dataset_key}.{name}" if name in own else f"data.default.{name}"


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):  # a name the file system cannot hold (a NUL, too long)
        return False


@rule
def local_files(config: dict[str, Any], findings: Findings) -> None:
    """Every local file the recipe names (:func:`named_files`) exists from the directory the
    run starts in, where NeMo-RL opens it."""
    here = Path.cwd()
    nemo_rl_root = find_nemo_rl_root()
    for key, path in named_files(config):
        if _exists(here / Path(path).expanduser()):
            continue
        if nemo_rl_root is not None and _exists(nemo_rl_root / path):
            fix = (
                f"it is a file of NeMo-RL's checkout, whose configs name it relative to that "
                f"checkout: copy it into your folder, or set {key}={nemo_rl_root / path}"
            )
        else:
            fix = f"create it, or set {key}=<your file> (relative to {here}, or absolute)"
        findings.errors.append(
            f"{key}={path!r} does not exist from {here}, where NeMo-RL opens it (the folder "
            f"the run starts in): {fix}"
        )


@rule
def checkpoints(config: dict[str, Any], findings: Findings) -> None:
    """Checkpoints on where something reads them: the checkpoint watcher (``evaluation.enabled``
    outside the loop) evaluates the run's checkpoints."""
    if value(config, "checkpointing.enabled", True):
        return
    evaluation = _section(config, "evaluation")
    if evaluation.get("enabled") is True and not evaluation.get("in_loop"):
        findings.errors.append(
            "evaluation.enabled=true (the watcher, `nemo-mmpo eval watch`, evaluates the run's "
            "checkpoints) with checkpointing.enabled=false (no checkpoint is written, and a "
            "rerun starts over): set checkpointing.enabled=true, or evaluation.enabled=false"
        )


@rule
def validation_data(config: dict[str, Any], findings: Findings) -> None:
    """NeMo-RL's validation (``grpo.val_period``, ``val_at_start``, ``val_at_end``) has a set
    to validate on: ``data.validation``, or a training dataset's ``split_validation_size``
    (NeMo-RL's ``setup()`` asserts one, and its ``validate()`` that ``val_period`` is 0
    without one). The CPU rig hands NeMo-RL no validation set: there only the paper's
    evaluation in the loop validates."""
    grpo = _section(config, "grpo")
    asked = [key for key in ("val_period", "val_at_start", "val_at_end") if grpo.get(key)]
    if not asked:
        return
    evaluation = _section(config, "evaluation")
    if evaluation.get("enabled") is True and evaluation.get("in_loop") is True:
        return  # our evaluation answers NeMo-RL's validation calls (the evaluation rule)
    settings = ", ".join(f"grpo.{key}={grpo[key]}" for key in asked)
    if _section(config, "cpu_backend").get("enabled"):
        findings.errors.append(
            f"{settings} with the CPU rig, which hands NeMo-RL no validation set: set "
            "grpo.val_period=0 grpo.val_at_start=false grpo.val_at_end=false, or evaluate in "
            "the loop (evaluation.enabled=true evaluation.in_loop=true)"
        )
        return
    data = value(config, "data")
    data = data if isinstance(data, dict) else {}
    split = any(
        isinstance(dataset.get("split_validation_size"), (int, float))
        and dataset["split_validation_size"] > 0
        for key, dataset in _datasets(data)
        if key.startswith("data.train")
    )
    if data.get("validation") is None and not split:
        findings.errors.append(
            f"{settings} and no validation set (data.validation is null and no training "
            "dataset has split_validation_size > 0): NeMo-RL's setup refuses it. Set "
            "grpo.val_period=0 (the watcher, nemo-mmpo eval watch, evaluates the checkpoints), "
            "or name a validation set in data.validation"
        )
