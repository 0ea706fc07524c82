"""Rollout files: one JSON record per (problem, sample) with its verdict, read strictly.

Our format (JSONL, written by :mod:`nemo_mmpo.eval.generate`)::

    {"benchmark": "aime24", "problem_id": "...", "sample": 3, "answer": "25",
     "response": "...", "correct": true, "status": "ok"}

``correct`` must be a JSON boolean (or the integers 0/1); ``sample`` a non-negative integer
(records without one are numbered in file order); ``status`` a string (``ok``, ``timeout``,
``too_long``, ...). NeMo-RL's ``run_eval.py`` writes ``evaluation_data.json``
(``{"evaluation_data": [{"prompt", "response", "reward", ...}]}``, samples of one prompt
repeated); :func:`read_rollouts` reads that too, grouping by prompt text, with ``reward``
a number (``>= 1`` is a success).

Nothing is dropped silently: a malformed record is an error naming file, line and field; a
truncated last line (a killed writer) and identical duplicates are accepted and reported in
:attr:`RunRecords.notes`; a duplicate with another verdict is an error. A run may span several
files (shards).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
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
    status_counts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

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


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _check_path(path: Path) -> None:
    if not path.exists():
        raise MMPOInputError(f"rollout file {str(path)!r} does not exist")
    if path.is_dir():
        raise MMPOInputError(
            f"{path} is a directory: give its rollout files (a run may span several files: "
            "NAME=shard0.jsonl NAME=shard1.jsonl)"
        )


def read_jsonl_lines(path: Path, notes: list[str] | None = None) -> list[tuple[int, Any]]:
    """``(line number, value)`` of each non-blank line; a truncated last line is reported in
    ``notes`` and skipped, any other line that is not JSON is an error."""
    _check_path(path)
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    values = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            values.append((number, json.loads(line)))
        except json.JSONDecodeError as error:
            if number == len(lines) and not text.endswith("\n"):
                if notes is not None:
                    notes.append(f"{path}:{number}: truncated last line skipped (a killed writer)")
                break
            raise MMPOInputError(f"{path}:{number} is not valid JSON ({error.msg})") from None
    return values


def read_jsonl_tolerant(path: Path) -> list[dict[str, Any]]:
    """JSON lines, skipping a truncated last line (a killed writer) but nothing else."""
    return [value for _, value in read_jsonl_lines(path)]


def _field_error(where: str, name: str, value: Any, wanted: str) -> MMPOInputError:
    return MMPOInputError(
        f"{where}: field {name!r} must be {wanted}, got {json.dumps(value)} ({_json_type(value)})"
    )


def checked_record(value: Any, where: str) -> dict[str, Any]:
    """One record of our format, validated: ``benchmark``, ``problem_id`` (str), ``sample``
    (int or None), ``correct`` (bool), ``status`` (str), ``response`` (or None)."""
    if not isinstance(value, dict):
        raise MMPOInputError(
            f"{where}: expected a JSON object per line, got {_json_type(value)} "
            f"{json.dumps(value)[:60]}"
        )
    missing = [name for name in ("benchmark", "problem_id", "correct") if name not in value]
    if missing:
        raise MMPOInputError(f"{where}: record lacks {', '.join(repr(m) for m in missing)}")
    benchmark, problem_id = value["benchmark"], value["problem_id"]
    if not isinstance(benchmark, str) or not benchmark:
        raise _field_error(where, "benchmark", benchmark, "a non-empty string")
    if isinstance(problem_id, bool) or not isinstance(problem_id, (str, int)):
        raise _field_error(where, "problem_id", problem_id, "a string or an integer")
    correct = value["correct"]
    if isinstance(correct, bool):
        pass
    elif isinstance(correct, int) and correct in (0, 1):
        correct = bool(correct)
    else:
        raise _field_error(where, "correct", correct, "a JSON boolean (true/false) or 0/1")
    sample = value.get("sample")
    if sample is not None and (
        isinstance(sample, bool) or not isinstance(sample, int) or sample < 0
    ):
        raise _field_error(where, "sample", sample, "a non-negative integer")
    status = value.get("status", "ok")
    if not isinstance(status, str):
        raise _field_error(where, "status", status, "a string")
    return {
        "benchmark": benchmark,
        "problem_id": str(problem_id),
        "sample": sample,
        "correct": correct,
        "status": status,
        "response": value.get("response"),
        "where": where,
    }


def _nemo_rl_records(data: dict[str, Any], benchmark: str, path: Path) -> list[dict[str, Any]]:
    rows = data["evaluation_data"]
    if not isinstance(rows, list):
        raise _field_error(str(path), "evaluation_data", rows, "an array of records")
    records = []
    seen: dict[str, int] = defaultdict(int)
    for index, row in enumerate(rows):
        where = f"{path} evaluation_data[{index}]"
        if not isinstance(row, dict):
            raise MMPOInputError(f"{where}: expected an object, got {_json_type(row)}")
        reward = row.get("reward")
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or reward != reward:
            raise _field_error(where, "reward", reward, "a number")
        prompt = str(row.get("prompt", ""))
        problem_id = hashlib.sha1(prompt.encode()).hexdigest()[:16]
        records.append(
            {
                "benchmark": benchmark,
                "problem_id": problem_id,
                "sample": seen[problem_id],
                "response": row.get("response", ""),
                "correct": float(reward) >= 1.0,
                "status": "ok",
                "where": where,
            }
        )
        seen[problem_id] += 1
    return records


def read_rollouts(
    path: str | Path, benchmark: str | None = None, notes: list[str] | None = None
) -> list[dict[str, Any]]:
    """Validated records of one file: our JSONL, or NeMo-RL's ``evaluation_data.json``.

    Args:
        notes: receives what was accepted but is worth knowing (a truncated last line).
    """
    path = Path(path)
    _check_path(path)
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise MMPOInputError(f"{path} is not valid JSON ({error.msg})") from None
        if isinstance(data, dict) and "evaluation_data" in data:
            name = benchmark or data.get("config", {}).get("data", {}).get("dataset_name")
            records = _nemo_rl_records(data, str(name or path.parent.name), path)
        else:
            raise MMPOInputError(
                f"{path} is neither JSONL rollouts nor NeMo-RL evaluation_data.json"
            )
    else:
        records = [
            checked_record(value, f"{path}:{number}")
            for number, value in read_jsonl_lines(path, notes)
        ]
    if not records:
        raise MMPOInputError(f"{path} holds no rollout records")
    return records


def problem_counts(records: list[dict[str, Any]], notes: list[str] | None = None) -> ProblemCounts:
    """Aggregate validated records into per-problem counts.

    A repeated ``(benchmark, problem_id, sample)`` with the same verdict (and response) counts
    once and is reported in ``notes``; with another verdict it is an error naming both places.
    Records without ``sample`` take the next free number of their problem, in order.
    """
    notes = [] if notes is None else notes
    by_problem: dict[tuple[str, str], dict[int, dict[str, Any]]] = defaultdict(dict)
    duplicates = 0
    statuses: Counter[str] = Counter()
    for record in records:
        key = (str(record["benchmark"]), str(record["problem_id"]))
        samples = by_problem[key]
        sample = record.get("sample")
        if sample is None:
            sample = len(samples)
            while sample in samples:
                sample += 1
        earlier = samples.get(sample)
        if earlier is not None:
            if bool(earlier["correct"]) != bool(record["correct"]) or earlier.get(
                "response"
            ) != record.get("response"):
                raise MMPOInputError(
                    f"{record.get('where', '?')}: sample {sample} of {key[0]}/{key[1]} is also at "
                    f"{earlier.get('where', '?')} with another "
                    f"{'verdict' if earlier['correct'] != record['correct'] else 'response'}; "
                    "remove one of them"
                )
            duplicates += 1
            if duplicates <= 3:
                notes.append(
                    f"{record.get('where', '?')}: duplicate of {earlier.get('where', '?')} "
                    "counted once"
                )
            continue
        samples[sample] = record
        statuses[str(record.get("status", "ok"))] += 1
    if duplicates > 3:
        notes.append(f"{duplicates} identical duplicate records in all, each counted once")
    keys = sorted(by_problem)
    ordered = [
        [bool(by_problem[key][sample]["correct"]) for sample in sorted(by_problem[key])]
        for key in keys
    ]
    samples = np.array([len(outcomes) for outcomes in ordered], dtype=np.int64)
    correct = np.array([sum(outcomes) for outcomes in ordered], dtype=np.int64)
    return ProblemCounts(keys, samples, correct, ordered, dict(statuses), notes)


def load_run(paths: list[str | Path], benchmark: str | None = None) -> ProblemCounts:
    """One run from one or more files (shards), with its notes and status counts."""
    notes: list[str] = []
    records = []
    for path in paths:
        records.extend(read_rollouts(path, benchmark, notes))
    counts = problem_counts(records, notes)
    counts.files = [str(path) for path in paths]
    return counts
