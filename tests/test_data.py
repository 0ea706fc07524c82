"""Benchmark loaders normalise every upload's fields to one schema, offline."""

from __future__ import annotations

import json

import pytest

from nemo_mmpo import MMPOInputError
from nemo_mmpo.data import (
    BENCHMARKS,
    last_boxed,
    load_benchmark,
    normalise_answer,
    prepare_training_data,
    read_local,
    write_jsonl_atomic,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so the answer is $\\boxed{5}$.", "5"),
        ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        (
            "\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}",
            "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}",
        ),
        ("\\fbox{x^{2}}", "x^{2}"),
        ("no box here", None),
        ("\\boxed{unclosed", None),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    ("answer", "integer", "expected"),
    [
        (27.0, True, "27"),
        ("27.0", True, "27"),
        ("025", True, "25"),
        ("025", False, "025"),
        (" $\\frac{3}{4}$ ", False, "\\frac{3}{4}"),
        (113, True, "113"),
        (0.5, False, "0.5"),
    ],
)
def test_normalise_answer(answer, integer, expected):
    assert normalise_answer(answer, integer) == expected


def write(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_each_upload_shape_normalises(tmp_path):
    amc = write(tmp_path / "amc.jsonl", [{"question": "Q1", "answer": 27.0, "id": 7}])
    aime = write(tmp_path / "aime.jsonl", [{"problem": "Q2", "answer": "025", "id": "2024-I-1"}])
    math_train = write(
        tmp_path / "train.jsonl",
        [{"problem": "Q3", "solution": "... \\boxed{\\frac{1}{2}}.", "level": "Level 3"}],
    )
    assert load_benchmark("amc23", amc)[0] == {
        "id": "7",
        "problem": "Q1",
        "answer": "27",
        "source": "amc23",
    }
    assert load_benchmark("aime24", aime)[0]["answer"] == "25"
    record = load_benchmark("math_train", math_train)[0]
    assert record["answer"] == "\\frac{1}{2}" and record["level"] == "Level 3"


def test_bad_rows_name_the_problem(tmp_path):
    rows = write(tmp_path / "bad.jsonl", [{"question": "Q", "solution": "no answer"}])
    with pytest.raises(MMPOInputError, match="row 0"):
        load_benchmark("math_train", rows)
    with pytest.raises(MMPOInputError, match="gsm8k row 0"):
        load_benchmark("gsm8k", rows)  # a user's own benchmark: the same checks
    with pytest.raises(MMPOInputError, match=r"benchmark 'gsm8k' has no file.*benchmarks.gsm8k="):
        load_benchmark("gsm8k")
    with pytest.raises(MMPOInputError, match="does not exist"):
        read_local(tmp_path / "missing.jsonl")


def test_a_users_own_benchmark_reads_under_any_name(tmp_path):
    """The README's recipe evaluates the user's held-out JSONL (``problem``, ``answer``)."""
    rows = [{"problem": "What is 2 + 3?", "answer": 5}, {"question": "Q", "answer": "$x$"}]
    records = load_benchmark("my_held_out", write(tmp_path / "held_out.jsonl", rows))
    assert [(r["id"], r["problem"], r["answer"], r["source"]) for r in records] == [
        ("my_held_out-0", "What is 2 + 3?", "5", "my_held_out"),
        ("my_held_out-1", "Q", "x", "my_held_out"),
    ]


def test_parquet_files_load(tmp_path):
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet as parquet

    table = pyarrow.table({"problem": ["Q"], "answer": ["$5$"], "unique_id": ["test/1.json"]})
    parquet.write_table(table, tmp_path / "math500.parquet")
    assert load_benchmark("math500", tmp_path / "math500.parquet")[0]["answer"] == "5"


def test_prepare_training_data_writes_both_files(tmp_path):
    sources = {
        "math_train": write(tmp_path / "t.jsonl", [{"problem": "P", "solution": "\\boxed{1}"}]),
        "math500": write(tmp_path / "m.jsonl", [{"problem": "A", "answer": "2"}]),
        "olymmath": write(tmp_path / "o.jsonl", [{"problem": "B", "answer": "$3$"}]),
        "amc23": write(tmp_path / "a.jsonl", [{"question": "C", "answer": 4.0}]),
        "aime24": write(tmp_path / "i.jsonl", [{"problem": "D", "answer": "005"}]),
        "aime25": write(tmp_path / "j.jsonl", [{"question": "E", "answer": "6"}]),
    }
    paths = prepare_training_data(tmp_path / "out", sources)
    train = read_local(paths["train"])
    validation = read_local(paths["validation"])
    assert [row["answer"] for row in train] == ["1"]
    assert [row["answer"] for row in validation] == ["2", "3", "4", "5", "6"]
    assert [row["source"] for row in validation] == [
        "math500",
        "olymmath",
        "amc23",
        "aime24",
        "aime25",
    ]


def test_atomic_write_leaves_no_partial_file(tmp_path):
    target = tmp_path / "out.jsonl"
    write_jsonl_atomic([{"a": 1}], target)

    def broken():
        yield {"a": 2}
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        write_jsonl_atomic(broken(), target)
    assert read_local(target) == [{"a": 1}]
    assert [path.name for path in tmp_path.iterdir()] == ["out.jsonl"]


def test_registry_holds_the_paper_benchmarks_with_unpinned_revisions():
    assert BENCHMARKS["math_train"].hub_id == "DigitalLearningGmbH/MATH-lighteval"
    assert all(spec.revision_label == "unpinned" for spec in BENCHMARKS.values())
    sizes = {name: spec.expected_size for name, spec in BENCHMARKS.items() if spec.hub_id}
    assert sizes == {
        "math_train": 7500,
        "math500": 500,
        "olymmath": 200,
        "amc23": 40,
        "aime24": 30,
        "aime25": 30,
    }


def test_repeated_problem_ids_are_named_at_load(tmp_path):
    from nemo_mmpo import MMPOInputError
    from nemo_mmpo.data import load_benchmark

    path = tmp_path / "aime.jsonl"
    rows = [{"id": i % 3, "problem": f"Q{i}", "answer": i} for i in range(5)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(MMPOInputError) as error:
        load_benchmark("aime24", path)
    assert "problem ids repeat (2 ids, e.g. '0', '1')" in str(error.value)
    assert str(path) in str(error.value)


def test_a_local_only_benchmark_asks_for_its_file():
    from nemo_mmpo.data import load_benchmark

    with pytest.raises(MMPOInputError, match="--data arithmetic=FILE"):
        load_benchmark("arithmetic")
