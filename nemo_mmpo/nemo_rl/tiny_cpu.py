"""MMPO (or GRPO) in NeMo-RL's own GRPO loop on a laptop: a tiny model learning arithmetic.

``examples/run_mmpo_math.py --config examples/configs/mmpo_tiny_cpu.yaml`` lands here when the
recipe has ``cpu_backend.enabled: true``. What is ours and what is NeMo-RL's:

- ours: the two CPU backends (:mod:`nemo_mmpo.nemo_rl.cpu_backends`), the task (one-digit
  additions with a ``\\boxed{}`` answer, built as NeMo-RL ``DatumSpec`` records with a
  character tokenizer), the tiny Llama built from a config, the supervised warm start (so
  rewards start mixed), and this driver, which stands where NeMo-RL's ``setup()`` would build
  GPU workers;
- NeMo-RL's: ``grpo_train`` itself (``async_grpo_train`` with its trajectory collector and
  replay buffer for ``mmpo_tiny_cpu_async.yaml``), its batch collation, its Math-Verify
  ``MathEnvironment`` (a Ray actor), its ``Logger`` (TensorBoard), its ``CheckpointManager``
  (and the resume state), and through ``install()`` our estimator and loss as on a GPU
  cluster.

A second run resumes from the newest checkpoint in ``checkpointing.checkpoint_dir``.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nemo_mmpo.errors import MMPOInputError

PAD, EOS, UNK = 0, 1, 2
TEMPLATE = "Q{index}: What is {a} + {b}? Put the answer in \\boxed{{}}."
ANSWER = " The answer is \\boxed{{{total}}}."


@dataclass(frozen=True)
class TinySettings:
    """The recipe's ``cpu_backend`` section."""

    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    learning_rate: float = 5e-4
    warm_start_steps: int = 300
    warm_start_learning_rate: float = 1e-2
    validation_fraction: float = 0.2
    seed: int = 0

    @classmethod
    def from_config(cls, section: dict[str, Any]) -> TinySettings:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(section) - known - {"enabled"})
        if unknown:
            raise MMPOInputError(
                f"cpu_backend.{unknown[0]} is not a setting; known: {', '.join(sorted(known))}"
            )
        return cls(**{key: value for key, value in section.items() if key in known})


def char_tokenizer() -> Any:
    """A ``transformers`` fast tokenizer with one token per printable ASCII character."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": PAD, "<eos>": EOS, "<unk>": UNK}
    vocab.update({chr(code): code - 32 + 3 for code in range(32, 127)})
    model = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    model.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    model.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=model, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def arithmetic_problems(seed: int, validation_fraction: float) -> tuple[list, list]:
    """All one-digit sums ``a + b``, shuffled and split into (train, validation)."""
    problems = [
        (index, a, b) for index, (a, b) in enumerate((a, b) for a in range(10) for b in range(10))
    ]
    random.Random(seed).shuffle(problems)
    cut = round(len(problems) * (1 - validation_fraction))
    return problems[:cut], problems[cut:]


def datum(tokenizer: Any, index: int, a: int, b: int) -> dict[str, Any]:
    """One NeMo-RL ``DatumSpec`` (what its math data processor produces) for ``a + b``."""
    text = TEMPLATE.format(index=index, a=a, b=b)
    token_ids = torch.tensor(tokenizer.encode(text, add_special_tokens=False))
    return {
        "message_log": [{"role": "user", "content": text, "token_ids": token_ids}],
        "length": len(token_ids),
        "extra_env_info": {"ground_truth": str(a + b)},
        "loss_multiplier": 1.0,
        "idx": index,
        "task_name": "math",
    }


def tiny_llama(tokenizer: Any, settings: TinySettings) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(settings.seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=settings.hidden_size,
        intermediate_size=2 * settings.hidden_size,
        num_hidden_layers=settings.num_layers,
        num_attention_heads=settings.num_heads,
        num_key_value_heads=settings.num_heads,
        max_position_embeddings=256,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=EOS,
    )
    return LlamaForCausalLM(config).eval()


def warm_start(model: Any, tokenizer: Any, records: list[dict], steps: int, lr: float) -> float:
    """Supervised steps on ``prompt + answer + <eos>``; returns the last loss."""
    rows, prompt_lengths = [], []
    for record in records:
        answer = ANSWER.format(total=record["extra_env_info"]["ground_truth"])
        ids = [*record["message_log"][0]["token_ids"].tolist()]
        prompt_lengths.append(len(ids))
        rows.append([*ids, *tokenizer.encode(answer, add_special_tokens=False), EOS])
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), PAD)
    labels = torch.full((len(rows), width), -100)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for index, (row, prompt_length) in enumerate(zip(rows, prompt_lengths, strict=True)):
        input_ids[index, : len(row)] = torch.tensor(row)
        labels[index, prompt_length : len(row)] = torch.tensor(row[prompt_length:])
        attention[index, : len(row)] = 1
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    loss = torch.zeros(())
    for _ in range(steps):
        optimizer.zero_grad()
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        loss.backward()
        optimizer.step()
    model.eval()
    return float(loss.detach())


def write_validation_file(path: Path, validation: list) -> Path:
    """The held-out sums as a local benchmark file for ``python -m nemo_mmpo.eval``."""
    from nemo_mmpo.io import write_jsonl_atomic

    rows = [
        {"id": f"sum-{index}", "problem": TEMPLATE.format(index=index, a=a, b=b), "answer": a + b}
        for index, a, b in validation
    ]
    write_jsonl_atomic(rows, path)
    return path


def _save_state(grpo: Any, loaded: dict[str, Any] | None) -> Any:
    """The trainer's resume state, as NeMo-RL's ``setup()`` builds it (v0.7.0: the loaded
    dict or the default; main: ``_get_grpo_save_state``, a model with defaults filled in)."""
    if hasattr(grpo, "_get_grpo_save_state"):  # main
        return grpo._get_grpo_save_state(loaded)
    return loaded if loaded is not None else grpo._default_grpo_save_state()


def _plain(value: Any) -> Any:
    """A config section as plain dicts (NeMo-RL main's are pydantic models, v0.7.0's dicts)."""
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


@contextmanager
def collector_on_this_interpreter(executable: str) -> Iterator[None]:
    """Run NeMo-RL's async trajectory collector and replay buffer on the driver's interpreter
    while the block runs.

    NeMo-RL's registry starts them in its uv-built vLLM environment, which a CPU machine does
    not have (``NEMO_RL_PY_EXECUTABLES_SYSTEM=1`` does the same for every actor).
    """
    from nemo_rl.distributed.ray_actor_environment_registry import ACTOR_ENVIRONMENT_REGISTRY

    names = [
        f"nemo_rl.algorithms.async_utils.{actor}"
        for actor in ("AsyncTrajectoryCollector", "ReplayBuffer")
    ]
    previous = {name: ACTOR_ENVIRONMENT_REGISTRY.get(name) for name in names}
    ACTOR_ENVIRONMENT_REGISTRY.update(dict.fromkeys(names, executable))
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                ACTOR_ENVIRONMENT_REGISTRY.pop(name, None)
            else:
                ACTOR_ENVIRONMENT_REGISTRY[name] = value


def epochs_in_one_pass(records: list, grpo_config: dict[str, Any], seed: int) -> list:
    """The training records for NeMo-RL's async trainer, whose collector iterates the
    dataloader once and needs one batch beyond the last step (at the dataloader's end it stops
    and drops the generation in flight): as many epochs as ``grpo.max_num_steps + 1`` batches
    need (at most ``grpo.max_num_epochs``), each a seeded permutation, so that no batch
    straddles two epochs (a prompt twice in one batch would make one group of two groups'
    rollouts)."""
    prompts = grpo_config["num_prompts_per_step"]
    steps_per_epoch = len(records) // prompts
    if steps_per_epoch == 0:
        raise MMPOInputError(
            f"{len(records)} training problems make no batch of grpo.num_prompts_per_step="
            f"{prompts}: lower it or the validation_fraction"
        )
    from nemo_mmpo.nemo_rl.run_config import async_batches_needed

    needed = -(-async_batches_needed(grpo_config["max_num_steps"]) // steps_per_epoch)
    if needed > grpo_config["max_num_epochs"]:
        raise MMPOInputError(
            f"grpo.max_num_steps={grpo_config['max_num_steps']} needs {needed} epochs of "
            f"{steps_per_epoch} batches (one batch more than the steps for NeMo-RL's async "
            f"collector); set grpo.max_num_epochs={needed} or more"
        )
    passes = []
    for epoch in range(needed):
        order = list(range(len(records)))
        random.Random(seed * 100_003 + epoch).shuffle(order)
        passes.extend(records[index] for index in order[: steps_per_epoch * prompts])
    return passes


def _check_async_run_finished(checkpointer: Any, max_num_steps: int) -> None:
    """NeMo-RL's ``async_grpo_train`` prints an exception in its loop and returns; it always
    saves its last step, so a run that stopped early has no checkpoint of ``max_num_steps``."""
    latest = checkpointer.get_latest_checkpoint_path()
    info = checkpointer.load_training_info(latest) if latest is not None else None
    step = int((info or {}).get("current_step", 0))
    if step < max_num_steps:
        raise RuntimeError(
            f"NeMo-RL's async_grpo_train stopped at step {step} of grpo.max_num_steps="
            f"{max_num_steps} (its error and traceback are printed above); the same command "
            "resumes from the newest checkpoint once the cause is fixed"
        )


def run(raw_config: dict[str, Any]) -> dict[str, Any]:
    """Train with NeMo-RL's ``grpo_train`` (``async_grpo_train`` when ``grpo.async_grpo.enabled``)
    on CPU; returns where things were written."""
    import ray
    from torchdata.stateful_dataloader import StatefulDataLoader

    from nemo_mmpo.nemo_rl import install
    from nemo_mmpo.nemo_rl.cpu_backends import CPUGeneration, CPUPolicy, SeparateCPUGeneration

    install()  # before Ray starts: the estimator and loss hooks, the workers' path
    from nemo_rl.algorithms import grpo
    from nemo_rl.data.collate_fn import rl_collate_fn
    from nemo_rl.distributed.virtual_cluster import PY_EXECUTABLES
    from nemo_rl.environments.math_environment import MathEnvironment
    from nemo_rl.utils.checkpoint import CheckpointManager
    from nemo_rl.utils.logger import Logger

    raw_config = dict(raw_config)
    settings = TinySettings.from_config(raw_config.pop("cpu_backend"))
    master_config = grpo.MasterConfig(**raw_config)  # NeMo-RL validates it (v0.7.0 and main)

    def section(name: str) -> Any:
        return _plain(getattr(master_config, name))

    random.seed(settings.seed)
    torch.manual_seed(settings.seed)
    tokenizer = char_tokenizer()
    train, validation = arithmetic_problems(settings.seed, settings.validation_fraction)
    records = [datum(tokenizer, *problem) for problem in train]
    checkpointer = CheckpointManager(master_config.checkpointing)
    checkpoint_dir = Path(section("checkpointing")["checkpoint_dir"])
    validation_file = write_validation_file(checkpoint_dir / "validation.jsonl", validation)
    policy_config = section("policy")
    policy_config["optimizer"] = {"kwargs": {"lr": settings.learning_rate}}
    last = checkpointer.get_latest_checkpoint_path()
    grpo_config = section("grpo")
    asynchronous = bool((grpo_config.get("async_grpo") or {}).get("enabled"))
    if asynchronous:  # NeMo-RL's async collector iterates the dataloader once
        dataset = epochs_in_one_pass(records, grpo_config, settings.seed)
    else:
        dataset = records
    dataloader = StatefulDataLoader(
        dataset,
        batch_size=grpo_config["num_prompts_per_step"],
        # sync: shuffled from the seeded global RNG, as NeMo-RL's setup() (an explicit
        # generator is not restored by StatefulDataLoader at an epoch's end); async: the
        # epochs are already shuffled into the one pass
        shuffle=not asynchronous,
        collate_fn=rl_collate_fn,
        drop_last=True,
    )
    if last is not None:  # resume as NeMo-RL's setup() does, with its own helpers
        from nemo_rl.data.utils import load_dataloader_state
        from transformers import LlamaForCausalLM

        weights_path, optimizer_path = checkpointer.get_resume_paths(last)
        model = LlamaForCausalLM.from_pretrained(weights_path).eval()
        policy = CPUPolicy(model, tokenizer, policy_config)
        if optimizer_path is not None:
            policy.load_optimizer(optimizer_path)
        save_state = _save_state(grpo, checkpointer.load_training_info(last))
        load_dataloader_state(dataloader, last, section("data"))
        print(f"[nemo-mmpo] resuming from {last}")
    else:
        model = tiny_llama(tokenizer, settings)
        loss = warm_start(
            model, tokenizer, records, settings.warm_start_steps, settings.warm_start_learning_rate
        )
        print(f"[nemo-mmpo] warm start: {settings.warm_start_steps} steps, loss {loss:.3f}")
        policy = CPUPolicy(model, tokenizer, policy_config)
        save_state = _save_state(grpo, None)
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False, log_to_driver=False)
    if asynchronous:  # NeMo-RL's async layout: generation in its own process, refit each step
        generation = SeparateCPUGeneration(policy, policy_config["generation"], settings.seed)
    else:
        generation = CPUGeneration(policy, policy_config["generation"])
    environment = MathEnvironment.options(
        runtime_env={"py_executable": PY_EXECUTABLES.SYSTEM}
    ).remote(section("env")["math"])
    logger = Logger(master_config.logger)
    arguments = (
        policy,
        generation,
        dataloader,
        None,
        tokenizer,
        grpo.ClippedPGLossFn(master_config.loss_fn),
        {"math": environment},
        None,
        logger,
        checkpointer,
        save_state,
        master_config,
    )
    try:
        if asynchronous:
            age = grpo_config["async_grpo"]["max_trajectory_age_steps"]
            with collector_on_this_interpreter(PY_EXECUTABLES.SYSTEM):
                grpo.async_grpo_train(*arguments, max_trajectory_age_steps=age)
            if section("checkpointing").get("enabled", True):
                _check_async_run_finished(checkpointer, grpo_config["max_num_steps"])
        else:
            grpo.grpo_train(*arguments)
    finally:
        generation.shutdown()
        ray.kill(environment)
        if started_ray:
            ray.shutdown()
    latest = checkpointer.get_latest_checkpoint_path()
    summary = {
        "checkpoint": None if latest is None else str(Path(latest) / "policy" / "weights"),
        "validation_file": str(validation_file),
        "log_dir": section("logger")["log_dir"],
    }
    print(f"[nemo-mmpo] {json.dumps(summary)}")
    return summary


def reward_curve(log_dir: str | Path, tag: str = "train/reward") -> list[tuple[int, float]]:
    """``(step, value)`` of ``tag`` from the TensorBoard events NeMo-RL's logger wrote."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    directory = Path(log_dir) / "tensorboard"
    if not directory.is_dir():
        raise MMPOInputError(f"{directory} does not exist: was the run logged with TensorBoard?")
    points: dict[int, float] = {}
    for events in sorted(directory.rglob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        if tag in accumulator.Tags().get("scalars", []):
            points.update({event.step: event.value for event in accumulator.Scalars(tag)})
    if not points:
        raise MMPOInputError(f"no {tag!r} scalars under {directory}")
    return sorted(points.items())


def plot_reward_curves(runs: dict[str, str | Path], path: str | Path, window: int = 20) -> Path:
    """Training reward of each run (raw, faint; and a ``window``-step moving average)."""
    import numpy as np

    from nemo_mmpo.io import pyplot, save_figure_atomic

    figure, axis = pyplot().subplots(figsize=(6, 3.8))
    for name, log_dir in runs.items():
        steps, values = map(np.array, zip(*reward_curve(log_dir), strict=True))
        line = axis.plot(steps, values, alpha=0.25, linewidth=0.8)[0]
        if len(values) >= window:
            smooth = np.convolve(values, np.ones(window) / window, mode="valid")
            axis.plot(steps[window - 1 :], smooth, color=line.get_color(), label=name)
        else:
            line.set_label(name)
    axis.set_xlabel("GRPO step")
    axis.set_ylabel("mean training reward")
    axis.set_title(f"Tiny CPU run: reward ({window}-step moving average)")
    axis.grid(alpha=0.3)
    axis.legend()
    save_figure_atomic(figure, Path(path))
    pyplot().close(figure)
    return Path(path)


def main(argv: list[str] | None = None) -> int:
    """``python -m nemo_mmpo.nemo_rl.tiny_cpu plot NAME=LOG_DIR ... --out FIGURE.png``."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m nemo_mmpo.nemo_rl.tiny_cpu")
    commands = parser.add_subparsers(dest="command", required=True)
    plot = commands.add_parser("plot", help="reward curves of tiny CPU runs from TensorBoard")
    plot.add_argument("runs", nargs="+", help="NAME=log_dir (the recipe's logger.log_dir)")
    plot.add_argument("--out", required=True, help="PNG path")
    args = parser.parse_args(argv)
    try:
        runs = {}
        for spec in args.runs:
            name, separator, log_dir = spec.partition("=")
            if not separator:
                raise MMPOInputError(f"{spec!r}: give NAME=log_dir")
            runs[name] = log_dir
        print(f"wrote {plot_reward_curves(runs, args.out)}")
    except MMPOInputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
