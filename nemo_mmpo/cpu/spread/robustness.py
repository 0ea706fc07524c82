"""Does the tiny run learn on any machine? Seeds x perturbed numerics, each a real run.

    python -m nemo_mmpo.cpu spread --out results/spread --seeds 0 1 2 3 4

Each *variant* perturbs the floating-point arithmetic the way another machine would:

- ``default``: 2 threads, float32, this interpreter's torch build;
- ``threads1``: ``OMP_NUM_THREADS=1`` (other reduction orders where a kernel splits work
  across threads; on the tiny model's shapes this may change nothing, and the summary shows it);
- ``avx2``: torch's AVX2 kernels instead of the machine's best (``ATEN_CPU_CAPABILITY=avx2``,
  ``MKL_ENABLE_INSTRUCTIONS=AVX2``): what another CPU model computes, on a CPU with AVX-512;
- ``float64``: the warm start computed in float64 (the RL run in float32 as always);
- ``python311``: the warm start computed by another interpreter and torch build (``--other-python``,
  e.g. the 3.11 test environment's torch 2.13), then the RL run here.

Every run is the recipe's full command (``examples/run_mmpo_math.py``), in its own directory
with its own warm-start cache, keeping every checkpoint. Finished runs are skipped, so the
command resumes. The summary (``spread.json``, ``spread.md``, ``spread.png``) gives, per run,
where the warm start stopped, the training reward in 50-step means and its gain from the first
block to the last, and the *expected success* (:func:`~nemo_mmpo.cpu.rig.measure.
expected_success`: exact, no sampling) of the warm start and of every checkpoint on the first
512 training problems and on the held-out problems.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from nemo_mmpo.checkout import REPO_ROOT, find_nemo_rl_root
from nemo_mmpo.cpu.spread.curves import plot_reward_bands, reward_curve, window_means
from nemo_mmpo.cpu.spread.runs import TINY_RECIPE, finished, run_config, run_recipe
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.eval.convert import CPU_RIG_CONVERTER_SETUP, hugging_face_weights
from nemo_mmpo.io import markdown_table, write_text_atomic


@dataclass(frozen=True)
class Variant:
    """One way of perturbing the numerics."""

    name: str
    environment: dict[str, str] = field(default_factory=dict)
    overrides: tuple[str, ...] = ()
    warm_start_python: bool = False  # warm start by --other-python first


VARIANTS = {
    variant.name: variant
    for variant in (
        Variant("default", {"OMP_NUM_THREADS": "2"}),
        Variant("threads1", {"OMP_NUM_THREADS": "1"}),
        Variant("float64", {"OMP_NUM_THREADS": "2"}, ("cpu_backend.warm_start.dtype=float64",)),
        Variant("python311", {"OMP_NUM_THREADS": "2"}, (), warm_start_python=True),
        Variant(
            "avx2",
            {
                "OMP_NUM_THREADS": "2",
                "ATEN_CPU_CAPABILITY": "avx2",
                "MKL_ENABLE_INSTRUCTIONS": "AVX2",
            },
        ),
    )
}


#: where a run's Megatron checkpoints are converted for measuring (removed after each)
CONVERTED = "converted"


def _run_overrides(run_dir: Path, seed: int, variant: Variant, extra: list[str]) -> list[str]:
    return [
        f"cpu_backend.seed={seed}",
        f"cpu_backend.warm_start_cache={run_dir / 'warm_starts'}",
        f"checkpointing.checkpoint_dir={run_dir / 'checkpoints'}",
        "checkpointing.keep_top_k=1000",  # every checkpoint (NeMo-RL wants an integer)
        "checkpointing.metric_name=null",
        # the in-loop evaluation samples from its own random state and changes nothing the
        # run learns; left out here to save time (the checkpoints are measured afterwards)
        "evaluation.enabled=false",
        "grpo.val_period=0",
        "grpo.val_at_start=false",
        f"logger.log_dir={run_dir / 'logs'}",
        *variant.overrides,
        *extra,
    ]


def run_one(
    run_dir: Path,
    seed: int,
    variant: Variant,
    recipe: Path,
    extra: list[str],
    other_python: str | None,
) -> dict:
    """One run (skipped when finished) and its measures (computed once, kept in
    ``measures.json``); returns its record."""
    overrides = _run_overrides(run_dir, seed, variant, extra)
    environment = {**os.environ, **variant.environment}
    if variant.warm_start_python and finished(run_dir) is None:
        if not other_python:
            raise MMPOInputError(f"variant {variant.name} needs --other-python PATH")
        command = [other_python, "-m", "nemo_mmpo.cpu", "warm-start", "--config", str(recipe)]
        subprocess.run([*command, *overrides], check=True, env=environment, cwd=REPO_ROOT)
    record = run_recipe(
        run_dir,
        recipe,
        overrides,
        variant.environment,
        {"seed": seed, "variant": variant.name, "log_dir": str(run_dir / "logs")},
    )
    measures_file = run_dir / "measures.json"
    if not measures_file.is_file():
        measures = {
            "warm_start": _warm_start_info(run_dir),
            "expected_success": _expected_success_curve(run_dir),
        }
        write_text_atomic(measures_file, json.dumps(measures, indent=2) + "\n")
    return {**record, **json.loads(measures_file.read_text())}


def _warm_start_info(run_dir: Path) -> dict:
    infos = list((run_dir / "warm_starts").glob("*/warm_start.json"))
    if len(infos) != 1:
        raise MMPOInputError(f"{run_dir}: expected one warm start, found {len(infos)}")
    info = json.loads(infos[0].read_text())["result"]
    return {"steps": info["steps"], "success": info["success"], "made_by": info["made_by"]}


def _expected_success_curve(run_dir: Path, train_problems: int = 512) -> dict[str, dict]:
    """Expected success of the warm start (step 0) and of every checkpoint, on the first
    ``train_problems`` training problems and on the held-out problems."""
    from nemo_mmpo.cpu.rig.measure import expected_success
    from nemo_mmpo.cpu.rig.model import char_tokenizer, load_tiny_model
    from nemo_mmpo.cpu.rig.rig_settings import TinySettings

    config = run_config(run_dir)
    settings = TinySettings.from_config(config["cpu_backend"])
    temperature = float(config["policy"]["generation"]["temperature"])
    train, held_out = settings.task.split()
    tokenizer = char_tokenizer()
    (warm_start,) = (run_dir / "warm_starts").glob("*/warm_start.json")
    points = {0: warm_start.parent}
    for step_dir in (run_dir / "checkpoints").glob("step_*"):
        points[int(step_dir.name.removeprefix("step_"))] = step_dir
    curve = {}
    for step, path in sorted(points.items()):
        with _hugging_face_folder(path, run_dir / CONVERTED) as folder:
            model = load_tiny_model(folder)
        curve[str(step)] = {
            "train": expected_success(model, tokenizer, train[:train_problems], temperature),
            "held_out": expected_success(model, tokenizer, held_out, temperature),
        }
    return curve


@contextmanager
def _hugging_face_folder(path: Path, work_dir: Path) -> Iterator[Path]:
    """The warm start's folder, or a checkpoint's weights as a Hugging Face folder: the
    ``transformers`` policy's as saved, the Megatron workers' converted by NeMo-RL's converter
    as the watcher converts them (:func:`nemo_mmpo.eval.convert.hugging_face_weights`), the
    conversion removed afterwards."""
    if not path.name.startswith("step_"):
        yield path
        return
    folder = hugging_face_weights(path, work_dir, find_nemo_rl_root(), CPU_RIG_CONVERTER_SETUP)
    try:
        yield folder
    finally:
        if folder.parent == work_dir:
            shutil.rmtree(folder, ignore_errors=True)


def _spread_row(row: dict, best_kernels: str) -> list[str]:
    """One run's cells in the spread's table."""
    made = row["warm_start"]["made_by"]
    curve = row["expected_success"]
    last = max(curve, key=int)
    return [
        row["variant"],
        row["seed"],
        f"{row['warm_start']['steps']}, {row['warm_start']['success']:.3f}",
        f"Python {made['python']}, torch {made['torch']}, {made['threads']} thread(s), "
        f"{made.get('kernels', best_kernels)} kernels",
        " → ".join(f"{m:.2f}" for m in row["window_means"]),
        "n/a" if row["gain"] is None else f"{row['gain']:+.3f}",
        f"{curve['0']['train']:.3f} → {curve[last]['train']:.3f} / "
        f"{curve['0']['held_out']:.3f} → {curve[last]['held_out']:.3f}",
        f"{row['seconds']:.0f}",
    ]


def summarise(records: list[dict], out: Path, window: int = 50) -> dict:
    """``spread.json``/``spread.md``/``spread.png`` from finished runs' records."""
    rows = []
    for record in records:
        rewards = [value for _, value in reward_curve(record["log_dir"])]
        means = window_means(rewards, window)
        curve = record["expected_success"]
        last = max(curve, key=int)
        rows.append(
            {
                **record,
                "window_means": means,
                # a run shorter than two windows has no reward gain (its expected success has)
                "gain": means[-1] - means[0] if len(means) > 1 else None,
                "expected_gain": {
                    part: curve[last][part] - curve["0"][part] for part in ("train", "held_out")
                },
            }
        )

    def spread(values: list[float]) -> dict[str, float]:
        return {"min": min(values), "mean": float(np.mean(values)), "max": max(values)}

    gains = [row["gain"] for row in rows if row["gain"] is not None]
    starts = [row["warm_start"]["success"] for row in rows]
    expected = {
        part: spread([row["expected_gain"][part] for row in rows]) for part in ("train", "held_out")
    }
    summary = {
        "runs": rows,
        "window": window,
        "gain": spread(gains) if gains else None,
        "expected_gain": expected,
        "warm_start_success": {"min": min(starts), "max": max(starts)},
        # the reward where a run has two windows, and the noise-free expected success always
        "every_run_gained": all(gain > 0 for gain in gains)
        and all(row["expected_gain"]["train"] > 0 for row in rows),
    }
    import torch

    best_kernels = torch.backends.cpu.get_cpu_capability()  # runs made before it was recorded
    header = [
        "variant",
        "seed",
        "warm start (steps, sampled success)",
        "made by",
        f"reward, {window}-step means",
        "gain",
        "expected success, train / held-out",
        "seconds",
    ]
    lines = markdown_table(header, [_spread_row(row, best_kernels) for row in rows])
    lines.append("")
    reward = (
        f"Training reward gain (last {window}-step mean minus first): min {min(gains):+.3f}, "
        f"mean {np.mean(gains):+.3f}, max {max(gains):+.3f} over {len(gains)} runs."
        if gains
        else f"Training reward gain: none (the runs are shorter than two {window}-step windows)."
    )
    lines.append(
        f"{reward} Expected "
        f"success gain, training problems: min {expected['train']['min']:+.3f}, mean "
        f"{expected['train']['mean']:+.3f}; held-out: min {expected['held_out']['min']:+.3f}, mean "
        f"{expected['held_out']['mean']:+.3f}. Warm-start sampled success {min(starts):.3f} to "
        f"{max(starts):.3f}."
    )
    write_text_atomic(out / "spread.md", "\n".join(lines) + "\n")
    write_text_atomic(out / "spread.json", json.dumps(summary, indent=2) + "\n")
    by_variant: dict[str, list[str]] = {}
    for row in rows:
        by_variant.setdefault(row["variant"], []).append(row["log_dir"])
    plot_reward_bands(by_variant, out / "spread.png", window=20)
    return summary


def run_spread(
    out: Path,
    seeds: list[int],
    variants: list[str],
    recipe: Path = TINY_RECIPE,
    extra: list[str] | None = None,
    other_python: str | None = None,
    log=print,
    perturbed_seeds: list[int] | None = None,
) -> dict:
    """Every (variant, seed) run that is not finished, then the summary. ``default`` runs
    ``seeds``; the perturbed variants run ``perturbed_seeds`` (default: ``seeds``)."""
    unknown = [name for name in variants if name not in VARIANTS]
    if unknown:
        raise MMPOInputError(f"variant {unknown[0]!r}: choose from {', '.join(VARIANTS)}")
    records = []
    for name in variants:
        for seed in seeds if name == "default" or perturbed_seeds is None else perturbed_seeds:
            run_dir = out / f"{name}-seed{seed}"
            done = finished(run_dir) is not None
            record = run_one(run_dir, seed, VARIANTS[name], recipe, extra or [], other_python)
            log(
                f"{name} seed {seed}: {'already finished' if done else 'finished'} "
                f"({record['seconds']:.0f} s)"
            )
            records.append(record)
    return summarise(records, out)
