"""Evaluate a run's checkpoints alongside training: ``nemo-mmpo eval watch --config RECIPE``.

NeMo-RL's colocated vLLM samples validation with the training sampler, so a GPU recipe
evaluates with the paper's protocol outside the loop: this watcher picks up each new
checkpoint of ``checkpointing.checkpoint_dir`` (every ``--every`` steps, default the recipe's
``grpo.val_period``), converts it to Hugging Face with NeMo-RL's own converter when it is a
Megatron checkpoint (in NeMo-RL's Megatron worker environment), samples it with vLLM (in
NeMo-RL's vLLM worker environment: :mod:`nemo_mmpo.eval.sampler_process`) or ``--backend hf``
(transformers, in this process; the default for a CPU-rig recipe), grades and measures it with
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
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.eval.convert import hugging_face_weights
from nemo_mmpo.eval.prompts import PromptFormat
from nemo_mmpo.eval.protocol import (
    EvaluationSettings,
    evaluate_step,
    evaluation_seed,
    flat_metrics,
    load_problems,
    read_steps,
    step_paths,
)
from nemo_mmpo.eval.sampler_process import SamplerProcess
from nemo_mmpo.eval.worker_environments import VLLM_WORKER, worker_environment, worker_python
from nemo_mmpo.io import write_text_atomic

LOCK_FILE = "watch.lock"
#: the sampler the vLLM worker's environment runs for the watcher
VLLM_SAMPLER = "nemo_mmpo.eval.generate.VLLMSampler"
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


def vllm_engine(policy: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``(vllm.LLM arguments, environment)`` of the recipe's generation engine (its
    ``policy`` section), as NeMo-RL's vLLM worker builds it: the recipe's precision, context
    length (``vllm_cfg.max_model_len``, else ``max_total_sequence_length``), eager mode and
    prefix caching, its ``vllm_cfg.env_vars``, and the engine in this process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as NeMo-RL's worker sets it)."""
    vllm_cfg = (policy.get("generation") or {}).get("vllm_cfg") or {}
    options: dict[str, Any] = {
        "dtype": vllm_cfg.get("precision") or "auto",
        "enforce_eager": bool(vllm_cfg.get("enforce_eager", False)),
        "distributed_executor_backend": "uni",
    }
    max_model_len = vllm_cfg.get("max_model_len") or policy.get("max_total_sequence_length")
    if max_model_len:
        options["max_model_len"] = int(max_model_len)
    if vllm_cfg.get("enable_prefix_caching") is not None:
        options["enable_prefix_caching"] = bool(vllm_cfg["enable_prefix_caching"])
    environment = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    environment.update({key: str(value) for key, value in (vllm_cfg.get("env_vars") or {}).items()})
    return options, environment


def make_sampler(
    backend: str,
    model: Path,
    settings: EvaluationSettings,
    step: int,
    batch: int,
    engine_options: dict[str, Any] | None = None,
    engine_setup: tuple[str, ...] = (),
    engine_python: str | None = None,
):
    """The step's sampler at the protocol's settings, seeded as the in-loop evaluation of
    ``step`` (:func:`~nemo_mmpo.eval.protocol.evaluation_seed`): ``hf`` in this process;
    ``vllm`` in a process of ``engine_python`` (default: NeMo-RL's vLLM worker's,
    :func:`~nemo_mmpo.eval.worker_environments.worker_python`; ``engine_setup`` called there
    first), with a seed per row, as NeMo-RL's vLLM engine samples that evaluation, and
    ``engine_options`` for ``vllm.LLM``."""
    from nemo_mmpo.eval.generate import TransformersSampler

    seed = evaluation_seed(step)
    if backend == "hf":
        return TransformersSampler(
            str(model),
            settings.temperature,
            settings.top_p,
            settings.max_new_tokens,
            seed,
            batch_size=batch,
            chat_template=False,  # the prompt is whole: nemo_mmpo.eval.prompts
        )
    if backend == "vllm":
        python = engine_python or worker_python(VLLM_WORKER)
        options = {
            "model": str(model),
            "temperature": settings.temperature,
            "top_p": settings.top_p,
            "max_tokens": settings.max_new_tokens,
            "seed": seed,
            "seed_per_row": True,
            "chat_template": False,  # the prompt is whole: nemo_mmpo.eval.prompts
            "engine_options": dict(engine_options or {}),
        }
        return SamplerProcess(
            python, VLLM_SAMPLER, options, engine_setup, worker_environment(python)
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
    engine_options: dict[str, Any] | None = None,
    converter_setup: tuple[str, ...] = (),
    engine_setup: tuple[str, ...] = (),
    converter_python: str | None = None,
    prompts: PromptFormat | None = None,
) -> dict[int, dict[str, Any]]:
    """Evaluate every finished checkpoint of ``checkpoint_dir`` whose step is a multiple of
    ``every`` and not evaluated yet; with ``follow``, keep watching until ``last_step`` is
    evaluated (or nothing new came for ``idle_seconds``). Returns every evaluated step.
    ``converter_setup`` and ``converter_python`` (default: NeMo-RL's Megatron worker's): for
    NeMo-RL's converter's process (:func:`~nemo_mmpo.eval.convert.hugging_face_weights`);
    ``engine_setup``: called in vLLM's process before its engine is built (the CPU rig's
    answers for vLLM's CPU build). vLLM samples in NeMo-RL's vLLM worker environment, found
    before anything is watched. ``prompts``: how a held-out problem becomes the text sampled
    (the training prompt, :mod:`nemo_mmpo.eval.prompts`); None: ``evaluation.template``."""
    from nemo_mmpo.eval.verify import VerifierPool

    output_dir = Path(settings.output_dir)
    if every < 1:
        raise MMPOInputError(f"--every {every}: give an integer >= 1")
    engine_python = worker_python(VLLM_WORKER) if backend == "vllm" else None
    if engine_python:
        log(f"watch: vLLM samples in {engine_python} (NeMo-RL's {VLLM_WORKER.rpartition('.')[2]})")
    with exclusive(output_dir), VerifierPool() as pool:
        problems = texts = None  # read when the first checkpoint comes (training may write them)
        # what a watcher killed after measuring a step had still to do
        log_unlogged(output_dir, tensorboard_dir)
        best = best_step(output_dir)
        checkpoints = finished_checkpoints(checkpoint_dir)
        if best is not None and not best_is_kept(output_dir, best) and best in checkpoints:
            weights = hugging_face_weights(
                checkpoints[best], output_dir, nemo_rl_root, converter_setup, converter_python
            )
            keep_best(output_dir, best, weights)
            if weights.parent == output_dir:
                shutil.rmtree(weights, ignore_errors=True)
        idle_since = time.monotonic()
        evaluated = 0
        while True:
            done = read_steps(output_dir)
            todo = [
                (step, path)
                for step, path in finished_checkpoints(checkpoint_dir).items()
                if step % every == 0 and step not in done
            ]
            for step, step_dir in todo:
                log(f"watch: evaluating step {step} ({step_dir})")
                weights = hugging_face_weights(
                    step_dir, output_dir, nemo_rl_root, converter_setup, converter_python
                )
                problems = problems or load_problems(settings)
                texts = texts or (prompts.texts(problems) if prompts else None)
                sampler = make_sampler(
                    backend,
                    weights,
                    settings,
                    step,
                    batch_size,
                    engine_options,
                    engine_setup,
                    engine_python,
                )
                try:
                    numbers = evaluate_step(
                        sampler, pool.verify, problems, settings, step, prompts=texts
                    )
                finally:  # one engine at a time: the next checkpoint's needs the memory
                    sampler.close()
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
                evaluated += 1
            done = read_steps(output_dir)
            if not follow and not evaluated:
                found = sorted(finished_checkpoints(checkpoint_dir))
                log(
                    f"watch: nothing to evaluate: checkpoints {found or 'none'} in "
                    f"{checkpoint_dir}, steps evaluated {sorted(done) or 'none'}; it evaluates "
                    f"the steps that are multiples of --every {every} (default: the recipe's "
                    "grpo.val_period)"
                )
            if not follow or (last_step is not None and last_step in done):
                return done
            if idle_seconds is not None and time.monotonic() - idle_since > idle_seconds:
                log(f"watch: nothing new for {idle_seconds:.0f} s; stopping")
                return done
            time.sleep(poll_seconds)
