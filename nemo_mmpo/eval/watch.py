"""Evaluate a run's checkpoints alongside training: ``nemo-mmpo eval watch --config RECIPE``.

NeMo-RL's colocated vLLM samples validation with the training sampler, so a GPU recipe
evaluates with the paper's protocol outside the loop: this watcher picks up each new
checkpoint of ``checkpointing.checkpoint_dir`` (every ``--every`` steps, default the recipe's
``grpo.val_period``), converts it to Hugging Face with NeMo-RL's own converter when it is a
Megatron checkpoint, samples it with vLLM (or ``--backend hf``), grades and measures it with
:func:`nemo_mmpo.eval.protocol.evaluate_step` into ``evaluation.output_dir``, logs the numbers
to TensorBoard at the checkpoint's training step (tags ``validation/paper/...``, as the in-loop
evaluation), and keeps a copy of the best checkpoint's weights (``best/``, by the paper's
average) before NeMo-RL's ``keep_top_k`` removes it.

Safe to start before, during or after training, and to kill at any moment: a lock lets one
watcher work on an output folder at a time (released when its process dies); a step is done
when its ``step_<N>.json`` exists; an interrupted step's rollouts are resumed sample by
sample, never repeated; every other file is written atomically.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.eval.protocol import (
    EvaluationSettings,
    evaluate_step,
    flat_metrics,
    load_problems,
    read_steps,
    step_paths,
)
from nemo_mmpo.io import write_text_atomic

LOCK_FILE = "watch.lock"
TENSORBOARD_TAG = "validation/"


@contextmanager
def exclusive(output_dir: Path) -> Iterator[None]:
    """Hold ``output_dir/watch.lock`` (an advisory lock the kernel drops with the process)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    with open(output_dir / LOCK_FILE, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise MMPOInputError(
                f"another watcher is working on {output_dir} (it holds {LOCK_FILE}); stop it, or "
                "give this one another evaluation.output_dir"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield


def finished_checkpoints(checkpoint_dir: Path) -> dict[int, Path]:
    """``{step: step_<N> folder}`` of the checkpoints NeMo-RL has finished (it writes
    ``tmp_step_<N>`` and renames it when the checkpoint is complete)."""
    found = {}
    for path in checkpoint_dir.glob("step_*"):
        suffix = path.name.removeprefix("step_")
        if suffix.isdigit() and (path / "training_info.json").is_file():
            found[int(suffix)] = path
    return dict(sorted(found.items()))


def hugging_face_weights(step_dir: Path, work_dir: Path, nemo_rl_root: Path | None) -> Path:
    """The checkpoint's weights as a Hugging Face folder: ``policy/weights`` itself when it is
    one (the CPU rig, DTensor with consolidated saves), else converted with NeMo-RL's
    ``convert_megatron_to_hf.py`` into ``work_dir`` (written to a temporary name, renamed)."""
    weights = step_dir / "policy" / "weights"
    if (weights / "config.json").is_file():
        return weights
    target = work_dir / f"hf_{step_dir.name}"
    if (target / "config.json").is_file():
        return target
    iterations = sorted(weights.glob("iter_*"))
    if not iterations:
        raise MMPOInputError(
            f"{weights} holds neither a Hugging Face model (config.json) nor a Megatron "
            "checkpoint (iter_*): convert it to Hugging Face and evaluate that folder"
        )
    if nemo_rl_root is None:
        raise MMPOInputError("converting a Megatron checkpoint needs NeMo-RL: set NEMO_RL_PATH")
    temporary = work_dir / f".hf_{step_dir.name}.partial"
    shutil.rmtree(temporary, ignore_errors=True)
    converter = nemo_rl_root / "examples" / "converters" / "convert_megatron_to_hf.py"
    command = [
        sys.executable,
        str(converter),
        "--config",
        str(step_dir / "config.yaml"),
        "--megatron-ckpt-path",
        str(iterations[-1]),
        "--hf-ckpt-path",
        str(temporary),
    ]
    subprocess.run(command, check=True)
    temporary.rename(target)
    return target


def log_to_tensorboard(log_dir: Path, step: int, numbers: dict[str, Any]) -> None:
    """The step's numbers as ``validation/paper/...`` scalars at the training step."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(log_dir))
    try:
        for name, value in flat_metrics(numbers).items():
            writer.add_scalar(f"{TENSORBOARD_TAG}{name}", value, step)
    finally:
        writer.close()


def log_unlogged(output_dir: Path, tensorboard_dir: Path) -> None:
    """Log every evaluated step not logged yet (one killed between the two), then mark it."""
    for step, numbers in read_steps(output_dir).items():
        if numbers.get("tensorboard"):
            continue
        log_to_tensorboard(tensorboard_dir, step, numbers)
        _, record = step_paths(output_dir, step)
        write_text_atomic(record, json.dumps({**numbers, "tensorboard": True}, indent=2) + "\n")


def best_step(output_dir: Path) -> int | None:
    """The paper's selection among the evaluated steps: the best average (earlier on a tie)."""
    steps = read_steps(output_dir)
    if not steps:
        return None
    return max(steps.values(), key=lambda entry: (entry["average"], -entry["step"]))["step"]


def keep_best(output_dir: Path, step: int, weights: Path) -> None:
    """Copy ``weights`` (step ``step``'s) to ``output_dir/best``, replacing the previous copy
    by a rename, so ``best/`` is always whole."""
    temporary = output_dir / ".best.partial"
    shutil.rmtree(temporary, ignore_errors=True)
    shutil.copytree(weights, temporary)
    numbers = read_steps(output_dir)[step]
    (temporary / "nemo_mmpo_best.json").write_text(
        json.dumps({"step": step, "average": numbers["average"]}) + "\n"
    )
    previous = output_dir / ".best.previous"
    shutil.rmtree(previous, ignore_errors=True)
    if (output_dir / "best").exists():
        (output_dir / "best").rename(previous)
    temporary.rename(output_dir / "best")
    shutil.rmtree(previous, ignore_errors=True)


def best_is_kept(output_dir: Path, step: int) -> bool:
    marker = output_dir / "best" / "nemo_mmpo_best.json"
    return marker.is_file() and json.loads(marker.read_text())["step"] == step


def make_sampler(backend: str, model: Path, settings: EvaluationSettings, step: int, batch: int):
    from nemo_mmpo.eval.generate import TransformersSampler, VLLMSampler

    seed = 1_000_003 * step + 17  # a seed of the step's own: a re-evaluation draws the same
    if backend == "hf":
        return TransformersSampler(
            str(model),
            settings.temperature,
            settings.top_p,
            settings.max_new_tokens,
            seed,
            batch_size=batch,
        )
    if backend == "vllm":
        return VLLMSampler(
            str(model), settings.temperature, settings.top_p, settings.max_new_tokens, seed=seed
        )
    raise MMPOInputError(f"--backend {backend!r}: choose hf or vllm")


def watch(
    settings: EvaluationSettings,
    checkpoint_dir: Path,
    tensorboard_dir: Path,
    every: int,
    backend: str = "vllm",
    follow: bool = False,
    last_step: int | None = None,
    poll_seconds: float = 30.0,
    idle_seconds: float | None = None,
    batch_size: int = 64,
    nemo_rl_root: Path | None = None,
    log: Any = print,
) -> dict[int, dict[str, Any]]:
    """Evaluate every finished checkpoint of ``checkpoint_dir`` whose step is a multiple of
    ``every`` and not evaluated yet; with ``follow``, keep watching until ``last_step`` is
    evaluated (or nothing new came for ``idle_seconds``). Returns every evaluated step."""
    from nemo_mmpo.eval.verify import VerifierPool

    output_dir = Path(settings.output_dir)
    if every < 1:
        raise MMPOInputError(f"--every {every}: give an integer >= 1")
    with exclusive(output_dir), VerifierPool() as pool:
        problems = None  # read when the first checkpoint comes (training may write them)
        # what a watcher killed after measuring a step had still to do
        log_unlogged(output_dir, tensorboard_dir)
        best = best_step(output_dir)
        checkpoints = finished_checkpoints(checkpoint_dir)
        if best is not None and not best_is_kept(output_dir, best) and best in checkpoints:
            weights = hugging_face_weights(checkpoints[best], output_dir, nemo_rl_root)
            keep_best(output_dir, best, weights)
            if weights.parent == output_dir:
                shutil.rmtree(weights, ignore_errors=True)
        idle_since = time.monotonic()
        while True:
            done = read_steps(output_dir)
            todo = [
                (step, path)
                for step, path in finished_checkpoints(checkpoint_dir).items()
                if step % every == 0 and step not in done
            ]
            for step, step_dir in todo:
                log(f"watch: evaluating step {step} ({step_dir})")
                problems = problems or load_problems(settings)
                weights = hugging_face_weights(step_dir, output_dir, nemo_rl_root)
                sampler = make_sampler(backend, weights, settings, step, batch_size)
                numbers = evaluate_step(sampler, pool.verify, problems, settings, step)
                if best_step(output_dir) == step:
                    keep_best(output_dir, step, weights)
                log_unlogged(output_dir, tensorboard_dir)
                if weights.parent == output_dir:  # a conversion of ours: no longer needed
                    shutil.rmtree(weights, ignore_errors=True)
                log(
                    f"watch: step {step}: average {numbers['average']:.4f}, never solved "
                    f"{numbers['never_solved']:.3f} ({numbers['seconds']:.0f} s)"
                )
                idle_since = time.monotonic()
            done = read_steps(output_dir)
            if not follow or (last_step is not None and last_step in done):
                return done
            if idle_seconds is not None and time.monotonic() - idle_since > idle_seconds:
                log(f"watch: nothing new for {idle_seconds:.0f} s; stopping")
                return done
            time.sleep(poll_seconds)
