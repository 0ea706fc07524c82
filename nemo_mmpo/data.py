"""Math benchmarks as data: loaders that normalise every upload to one schema.

Schema of a record: ``{"id", "problem", "answer", "source"}`` (plus ``level``/``subject``
when the upload has them). Hugging Face dataset ids are fixed in :data:`BENCHMARKS`; their
revisions are unpinned (``revision=None``: the hub's current version), because no public
source we know of states the commit the paper used. Any benchmark can also be read from a
local JSONL or Parquet file with the same fields (or the upload's own field names, which are
normalised the same way). Problem ids are unique per benchmark (checked at load); rows of a
benchmark made of several hub configs get ids prefixed with their config.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.io import write_jsonl_atomic


@dataclass(frozen=True)
class BenchmarkSpec:
    """Where a benchmark lives on the hub and how its fields are named there."""

    name: str
    hub_id: str
    splits: tuple[tuple[str | None, str], ...]  # (config, split) pairs, concatenated
    problem_field: str
    answer_field: str | None  # None: take the last \\boxed{} of ``solution_field``
    solution_field: str | None = None
    integer_answers: bool = False
    expected_size: int | None = None
    revision: str | None = None  # None: unpinned (see the module docstring)

    @property
    def revision_label(self) -> str:
        return self.revision or "unpinned"


BENCHMARKS: dict[str, BenchmarkSpec] = {
    spec.name: spec
    for spec in (
        BenchmarkSpec(
            "math_train",
            "DigitalLearningGmbH/MATH-lighteval",
            (("default", "train"),),
            "problem",
            None,
            "solution",
            expected_size=7500,
        ),
        BenchmarkSpec(
            "math500",
            "HuggingFaceH4/MATH-500",
            ((None, "test"),),
            "problem",
            "answer",
            expected_size=500,
        ),
        BenchmarkSpec(
            "olymmath",
            "RUC-AIBOX/OlymMATH",
            (("en-easy", "test"), ("en-hard", "test")),
            "problem",
            "answer",
            expected_size=200,
        ),
        BenchmarkSpec(
            "amc23",
            "math-ai/amc23",
            ((None, "test"),),
            "question",
            "answer",
            integer_answers=True,
            expected_size=40,
        ),
        BenchmarkSpec(
            "aime24",
            "HuggingFaceH4/aime_2024",
            ((None, "train"),),
            "problem",
            "answer",
            integer_answers=True,
            expected_size=30,
        ),
        BenchmarkSpec(
            "aime25",
            "opencompass/AIME2025",
            (("AIME2025-I", "test"), ("AIME2025-II", "test")),
            "question",
            "answer",
            integer_answers=True,
            expected_size=30,
        ),
        # local files only (no hub upload): the tiny CPU run's held-out one-digit sums
        BenchmarkSpec("arithmetic", "", (), "problem", "answer", integer_answers=True),
    )
}
VALIDATION_BENCHMARKS = ("math500", "olymmath", "amc23", "aime24", "aime25")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced."""
    starts = [match.end() for match in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    if not starts:
        return None
    start = starts[-1]
    depth = 1
    for position in range(start, len(text)):
        if text[position] == "{":
            depth += 1
        elif text[position] == "}":
            depth -= 1
            if depth == 0:
                return text[start:position].strip()
    return None


def normalise_answer(answer: Any, integer_answer: bool = False) -> str:
    """One canonical string per answer.

    Strips surrounding ``$`` and whitespace; a float that is an integer (``27.0``) becomes
    ``27``; for integer-answer benchmarks (AIME/AMC) leading zeros go (``025`` -> ``25``).
    """
    if isinstance(answer, bool) or answer is None:
        raise MMPOInputError(f"answer {answer!r} is not a number or string; fix the data file")
    if isinstance(answer, (int, float)):
        if isinstance(answer, float) and answer.is_integer():
            return str(int(answer))
        return repr(answer) if isinstance(answer, float) else str(answer)
    text = str(answer).strip()
    while len(text) >= 2 and text.startswith("$") and text.endswith("$"):
        text = text[1:-1].strip()
    if re.fullmatch(r"[+-]?\d+\.0+", text):
        text = text.split(".")[0]
    if integer_answer and re.fullmatch(r"[+-]?\d+", text):
        text = str(int(text))
    return text


def normalise_record(raw: dict[str, Any], spec: BenchmarkSpec, index: int) -> dict[str, Any]:
    """A raw upload row -> ``{"id", "problem", "answer", "source", ...}``."""
    problem = raw.get(spec.problem_field, raw.get("problem", raw.get("question")))
    if not isinstance(problem, str) or not problem.strip():
        raise MMPOInputError(
            f"{spec.name} row {index} has no problem text in field {spec.problem_field!r}; "
            f"fields present: {sorted(raw)}"
        )
    if spec.answer_field is not None and raw.get(spec.answer_field) is not None:
        answer = normalise_answer(raw[spec.answer_field], spec.integer_answers)
    elif raw.get("answer") is not None:
        answer = normalise_answer(raw["answer"], spec.integer_answers)
    else:
        solution = raw.get(spec.solution_field or "solution", "")
        boxed = last_boxed(solution or "")
        if boxed is None:
            raise MMPOInputError(
                f"{spec.name} row {index} has no answer field and no \\boxed{{}} in its solution"
            )
        answer = normalise_answer(boxed, spec.integer_answers)
    problem_id = str(raw.get("unique_id", raw.get("id", f"{spec.name}-{index}")))
    if raw.get("_config"):
        problem_id = f"{raw['_config']}/{problem_id}"
    record = {
        "id": problem_id,
        "problem": problem.strip(),
        "answer": answer,
        "source": spec.name,
    }
    for key in ("level", "subject", "type"):
        if key in raw and raw[key] is not None:
            record[key] = raw[key]
    return record


def read_local(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a local ``.jsonl`` / ``.json`` / ``.parquet`` file."""
    path = Path(path)
    if not path.exists():
        raise MMPOInputError(f"data file {str(path)!r} does not exist")
    if path.suffix == ".parquet":
        import pyarrow.parquet as parquet

        return parquet.read_table(path).to_pylist()
    if path.suffix == ".json":
        rows = json.loads(path.read_text())
        return rows if isinstance(rows, list) else rows["data"]
    with path.open() as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _hub_rows(spec: BenchmarkSpec) -> Iterator[dict[str, Any]]:
    if not spec.hub_id:
        raise MMPOInputError(
            f"benchmark {spec.name} has no hub upload: give a local file (--data {spec.name}=FILE)"
        )
    from datasets import load_dataset

    for config, split in spec.splits:
        for row in load_dataset(spec.hub_id, config, split=split, revision=spec.revision):
            yield {**row, "_config": config} if len(spec.splits) > 1 else row


def users_benchmark(name: str) -> BenchmarkSpec:
    """A benchmark of the user's own, under any name: a local file whose rows hold ``problem``
    (or ``question``) and ``answer`` (or a ``solution`` with a ``\\boxed{}`` answer)."""
    return BenchmarkSpec(name, "", (), "problem", "answer")


def load_benchmark(name: str, path: str | Path | None = None) -> list[dict[str, Any]]:
    """Normalised records of benchmark ``name`` from ``path`` or, without one, the hub (the
    paper's benchmarks, :data:`BENCHMARKS`); any other name is the user's own local file."""
    if name not in BENCHMARKS and path is None:
        raise MMPOInputError(
            f"benchmark {name!r} has no file: give your benchmark's local JSONL or Parquet file "
            f"(evaluation.benchmarks.{name}=<file>), or name one of the paper's, which are read "
            f"from the hub: {', '.join(BENCHMARKS)}"
        )
    spec = BENCHMARKS.get(name) or users_benchmark(name)
    rows: Iterable[dict[str, Any]] = read_local(path) if path is not None else _hub_rows(spec)
    records = [normalise_record(dict(row), spec, index) for index, row in enumerate(rows)]
    seen: dict[str, int] = {}
    repeated = []
    for record in records:
        seen[record["id"]] = seen.get(record["id"], 0) + 1
        if seen[record["id"]] == 2:
            repeated.append(record["id"])
    if repeated:
        where = str(path) if path is not None else f"{spec.hub_id} ({spec.revision_label})"
        raise MMPOInputError(
            f"benchmark {name} from {where}: problem ids repeat ({len(repeated)} ids, e.g. "
            f"{', '.join(repr(i) for i in repeated[:5])}); ids must be unique per benchmark: "
            "give each row its own 'id' (or 'unique_id'), or drop the id fields to number rows"
        )
    return records


#: The MATH task's files, in one folder (``data/`` in ``base/paper_math.yaml``): NeMo-RL's
#: training and validation sets, and the prompt its math processor formats them with
MATH_TRAIN, MATH_VALIDATION = "math_train.jsonl", "math_validation.jsonl"
MATH_PROMPT = "math_boxed.txt"
#: The paper's prompt, package data (copied beside the data: NeMo-RL reads ``prompt_file``
#: relative to the working directory)
MATH_PROMPT_SOURCE = Path(__file__).resolve().parent / "configs" / "prompts" / MATH_PROMPT


def math_task_files(config: dict[str, Any]) -> list[Path] | None:
    """The MATH task's files a resolved recipe reads, when its ``data.train.data_path`` is
    ``<folder>/math_train.jsonl`` (the paper's task): that file, and those of its validation
    set, prompt and evaluation benchmarks that the recipe names in the same folder. None for any
    other data section (NeMo-RL's own datasets, a list of datasets, a user's JSONL): NeMo-RL
    reads it as the recipe says and nemo-mmpo prepares nothing."""
    data = config.get("data")
    train = data.get("train") if isinstance(data, dict) else None
    if not isinstance(train, dict) or Path(str(train.get("data_path") or "")).name != MATH_TRAIN:
        return None
    folder = Path(train["data_path"]).parent
    validation = data.get("validation")
    default, evaluation = data.get("default"), config.get("evaluation")
    benchmarks = evaluation.get("benchmarks") if isinstance(evaluation, dict) else None
    named = [  # a value of another type is the typed rules' to report
        train["data_path"],
        validation.get("data_path") if isinstance(validation, dict) else None,
        default.get("prompt_file") if isinstance(default, dict) else None,
        *(benchmarks.values() if isinstance(benchmarks, dict) else ()),
    ]
    ours = {folder / MATH_TRAIN, folder / MATH_VALIDATION, folder / MATH_PROMPT}
    ours |= {folder / "validation" / f"{name}.jsonl" for name in VALIDATION_BENCHMARKS}
    return [Path(path) for path in named if isinstance(path, str) and Path(path) in ours]


def prepare_math_task(files: list[Path], everything: bool = False) -> list[Path]:
    """Write the MATH task's ``files`` (:func:`math_task_files`) that are missing (all of them
    with ``everything``): the prompt from the package, the data from the hub (needs the eval
    extra's ``datasets``). Returns what was written."""
    folder = files[0].parent
    prompt = folder / MATH_PROMPT
    written = []
    if prompt in files and (everything or not prompt.exists()):
        prompt.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(MATH_PROMPT_SOURCE, prompt)
        written.append(prompt)
    if everything or not all(path.exists() for path in files):
        written += [path for path in prepare_training_data(folder).values() if path != prompt]
    return written


def prepare_training_data(
    out_dir: str | Path, local_paths: dict[str, str | Path] | None = None
) -> dict[str, Path]:
    """Write ``math_train.jsonl``, ``math_validation.jsonl`` (the paper's five benchmarks, for
    NeMo-RL's validation), ``validation/<benchmark>.jsonl`` (each, for the evaluation) and the
    prompt (``math_boxed.txt``).

    Args:
        out_dir: folder for the two files.
        local_paths: optional ``{benchmark name: local file}`` used instead of the hub.
    """
    local_paths = local_paths or {}
    out_dir = Path(out_dir)
    train = load_benchmark("math_train", local_paths.get("math_train"))
    benchmarks = {
        name: load_benchmark(name, local_paths.get(name)) for name in VALIDATION_BENCHMARKS
    }
    paths = {"train": out_dir / "math_train.jsonl", "validation": out_dir / "math_validation.jsonl"}
    write_jsonl_atomic(train, paths["train"])
    write_jsonl_atomic(
        [record for records in benchmarks.values() for record in records], paths["validation"]
    )
    for name, records in benchmarks.items():
        paths[name] = out_dir / "validation" / f"{name}.jsonl"
        write_jsonl_atomic(records, paths[name])
    paths["prompt"] = out_dir / MATH_PROMPT
    shutil.copyfile(MATH_PROMPT_SOURCE, paths["prompt"])
    return paths
