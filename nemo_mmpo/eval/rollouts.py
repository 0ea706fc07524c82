"""Rollout files: one JSON record per (problem, sample) with its verdict.

Our format (JSONL, written by :mod:`nemo_mmpo.eval.generate`)::

    {"benchmark": "aime24", "problem_id": "...", "sample": 3, "answer": "25",
     "response": "...", "correct": true, "status": "ok"}

NeMo-RL's ``run_eval.py`` writes ``evaluation_data.json`` (``{"evaluation_data": [{"prompt",
"response", "reward", ...}]}``, samples of one prompt repeated); :func:`read_rollouts` reads
that too, grouping by prompt text.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nemo_mmpo.errors import MMPOInputError


@dataclass
class ProblemCounts:
    """Per-problem sample and success counts of one run, in a fixed problem order."""

    keys: list[tuple[str, str]]  # (benchmark, problem_id)
    samples: np.ndarray  # [num_problems]
    correct: np.ndarray  # [num_problems]
    first_success: list[list[bool]]  # per problem, correctness in sample order

    def benchmark(self, name: str) -> ProblemCounts:
        rows = [index for index, key in enumerate(self.keys) if key[0] == name]
        return ProblemCounts(
            [self.keys[i] for i in rows],
            self.samples[rows],
            self.correct[rows],
            [self.first_success[i] for i in rows],
        )

    @property
    def benchmarks(self) -> list[str]:
        return sorted({key[0] for key in self.keys})


def read_jsonl_tolerant(path: Path) -> list[dict[str, Any]]:
    """JSON lines, skipping a truncated last line (a killed writer) but nothing else."""
    records = []
    lines = path.read_text().splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            if number == len(lines):
                break
            raise MMPOInputError(f"{path}:{number} is not valid JSON ({error})") from None
    return records


def _nemo_rl_records(data: dict[str, Any], benchmark: str) -> list[dict[str, Any]]:
    records = []
    seen: dict[str, int] = defaultdict(int)
    for row in data["evaluation_data"]:
        prompt = str(row.get("prompt", ""))
        problem_id = hashlib.sha1(prompt.encode()).hexdigest()[:16]
        records.append(
            {
                "benchmark": benchmark,
                "problem_id": problem_id,
                "sample": seen[problem_id],
                "response": row.get("response", ""),
                "correct": float(row.get("reward", 0.0)) >= 1.0,
                "status": "ok",
            }
        )
        seen[problem_id] += 1
    return records


def read_rollouts(path: str | Path, benchmark: str | None = None) -> list[dict[str, Any]]:
    """Records of one run: our JSONL, or NeMo-RL's ``evaluation_data.json``."""
    path = Path(path)
    if not path.exists():
        raise MMPOInputError(f"rollout file {str(path)!r} does not exist")
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "evaluation_data" in data:
            name = benchmark or data.get("config", {}).get("data", {}).get("dataset_name")
            return _nemo_rl_records(data, str(name or path.parent.name))
        raise MMPOInputError(f"{path} is neither JSONL rollouts nor NeMo-RL evaluation_data.json")
    records = read_jsonl_tolerant(path)
    for number, record in enumerate(records):
        missing = {"benchmark", "problem_id", "correct"} - set(record)
        if missing:
            raise MMPOInputError(f"{path} record {number} lacks {sorted(missing)}")
    return records


def problem_counts(records: list[dict[str, Any]]) -> ProblemCounts:
    """Aggregate records into per-problem counts (duplicates of a sample count once)."""
    by_problem: dict[tuple[str, str], dict[int, bool]] = defaultdict(dict)
    for record in records:
        key = (str(record["benchmark"]), str(record["problem_id"]))
        sample = int(record.get("sample", len(by_problem[key])))
        by_problem[key].setdefault(sample, bool(record["correct"]))
    keys = sorted(by_problem)
    ordered = [[by_problem[key][sample] for sample in sorted(by_problem[key])] for key in keys]
    samples = np.array([len(outcomes) for outcomes in ordered], dtype=np.int64)
    correct = np.array([sum(outcomes) for outcomes in ordered], dtype=np.int64)
    return ProblemCounts(keys, samples, correct, ordered)
