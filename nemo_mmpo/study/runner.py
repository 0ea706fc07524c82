"""``nemo-mmpo study run``: methods x seeds through NeMo-RL's ``grpo_train`` on the CPU rig.

Each run is the tiny recipe (``examples/configs/mmpo_tiny_cpu.yaml``) with the method's
overrides (:mod:`nemo_mmpo.study.methods`), its seed, and the paper's evaluation inside the loop
every ``eval_every`` steps on the 240 held-out problems (16 samples at temperature 0.6, top-p
0.95). Runs are paired: every method of a seed starts from the same warm start (one cache for
the study) and sees the same problems in the same order. Seed by seed, so a study cut short
still holds complete pairs. A finished run is skipped; an interrupted one resumes from its
newest checkpoint (:func:`nemo_mmpo.cpu.spread.runs.run_recipe`). A run recorded in the study
folder's ``records/`` with no run folder (a study continued from committed records, such as
``docs/results/``) is skipped too, and ``study report`` reads its record; a seed is either
recorded whole or run whole here, so that its methods share one warm start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_mmpo.cpu.spread.runs import TINY_RECIPE, finished, run_recipe
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.study.comparison import record_path
from nemo_mmpo.study.methods import ALL_METHODS, METHODS


@dataclass(frozen=True)
class StudyPlan:
    """What a study runs. ``quick`` is the same pipeline at a size for a few minutes."""

    methods: tuple[str, ...] = tuple(METHODS)
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    steps: int = 300
    eval_every: int = 100
    samples: int = 16
    extra: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        unknown = [name for name in self.methods if name not in ALL_METHODS]
        if unknown:
            raise MMPOInputError(f"method {unknown[0]!r}: choose from {', '.join(ALL_METHODS)}")
        if self.steps < 1 or self.eval_every < 1 or self.samples < 1:
            raise MMPOInputError(
                f"steps={self.steps}, eval_every={self.eval_every}, samples={self.samples}: "
                "give integers >= 1"
            )
        if self.steps % self.eval_every:
            raise MMPOInputError(
                f"steps={self.steps} is not a multiple of eval_every={self.eval_every}: the "
                "final step must be evaluated"
            )


QUICK = StudyPlan(methods=("grpo", "mmpo"), seeds=(0, 1), steps=60, eval_every=30, samples=8)


def run_dir(out: Path, method: str, seed: int) -> Path:
    return out / "runs" / f"{method}-seed{seed}"


def overrides(out: Path, method: str, seed: int, plan: StudyPlan) -> list[str]:
    folder = run_dir(out, method, seed)
    return [
        *ALL_METHODS[method].overrides,
        f"cpu_backend.seed={seed}",
        f"cpu_backend.warm_start_cache={out / 'warm_starts'}",
        f"grpo.max_num_steps={plan.steps}",
        f"grpo.val_period={plan.eval_every}",
        "grpo.val_at_start=true",
        f"evaluation.samples={plan.samples}",
        f"checkpointing.save_period={plan.eval_every}",
        f"checkpointing.checkpoint_dir={folder / 'checkpoints'}",
        f"logger.log_dir={folder / 'logs'}",
        *plan.extra,
    ]


def run_study(out: Path, plan: StudyPlan, log: Any = print) -> list[dict[str, Any]]:
    """Every (seed, method) run not finished yet; returns every run's record."""
    records = []
    for seed in plan.seeds:
        recorded = _recorded_elsewhere(out, seed, plan)
        for method in plan.methods:
            if recorded:
                log(f"study: {method} seed {seed}: recorded in {record_path(out, method, seed)}")
                continue
            folder = run_dir(out, method, seed)
            done = finished(folder) is not None
            record = run_recipe(
                folder,
                TINY_RECIPE,
                overrides(out, method, seed, plan),
                record={"method": method, "seed": seed, "steps": plan.steps},
            )
            log(
                f"study: {method} seed {seed}: "
                f"{'already finished' if done else 'finished'} ({record['seconds']:.0f} s)"
            )
            records.append(record)
    return records


def _recorded_elsewhere(out: Path, seed: int, plan: StudyPlan) -> bool:
    """Whether every method of ``seed`` is recorded in ``out/records`` without a run folder
    (a seed another machine ran: skipped); a seed only partly recorded is refused, since the
    methods run here would start from another warm start than the recorded ones."""
    recorded = [
        method
        for method in plan.methods
        if record_path(out, method, seed).is_file() and not run_dir(out, method, seed).exists()
    ]
    if not recorded:
        return False
    if len(recorded) < len(plan.methods):
        missing = [method for method in plan.methods if method not in recorded]
        raise MMPOInputError(
            f"seed {seed}: {', '.join(recorded)} recorded in {out / 'records'} with no run "
            f"folder, {', '.join(missing)} not: the runs made here would start from another "
            "warm start than the recorded ones. Run the seed whole here (remove its records) "
            "or record it whole"
        )
    return True
