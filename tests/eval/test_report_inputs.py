"""The report reads its inputs strictly: every bad input is one line naming the fix, and what
it accepts (truncated last line, identical duplicates, shards) is reported, never silent."""

from __future__ import annotations

import json

import pytest

from nemo_mmpo.cli import handle
from nemo_mmpo.eval.__main__ import main


def eval_main(argv):
    """The eval tool as a person runs it: its errors through the CLI's one handler."""
    return handle(main, argv, "nemo-mmpo eval")


def record(problem, sample, correct, benchmark="amc23", **extra):
    return {
        "benchmark": benchmark,
        "problem_id": f"p{problem}",
        "sample": sample,
        "response": f"r{problem}-{sample}",
        "correct": correct,
        **extra,
    }


def good_records(problems=4, samples=4):
    """Problem i is solved on samples < i (a mix of rates)."""
    return [record(p, s, s < p) for p in range(problems) for s in range(samples)]


def write(path, records, tail=""):
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


def report(tmp_path, *specs, out=None):
    out = out or tmp_path / "report"
    return eval_main(["report", *map(str, specs), "--out", str(out)]), out


def error_line(capsys):
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert "Traceback" not in err and len(lines) == 1, err
    return lines[0]


def summary_numbers(out):
    return json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        (
            {"correct": "false"},
            "field 'correct' must be a JSON boolean (true/false) or 0/1, got \"false\" (string)",
        ),
        ({"correct": None}, "field 'correct' must be a JSON boolean"),
        ({"correct": 2}, "got 2 (number)"),
        ({"sample": 1.5}, "field 'sample' must be a non-negative integer, got 1.5"),
        ({"sample": "3"}, "field 'sample' must be a non-negative integer"),
        ({"sample": -1}, "field 'sample' must be a non-negative integer, got -1"),
        ({"status": 3}, "field 'status' must be a string"),
        ({"problem_id": None}, "field 'problem_id' must be a string or an integer"),
    ],
)
def test_a_bad_field_names_file_line_and_field(tmp_path, capsys, bad, fragment):
    records = good_records()
    records[5] = {**records[5], **bad}
    path = write(tmp_path / "run.jsonl", records)
    code, out = report(tmp_path, path)
    assert code == 2
    line = error_line(capsys)
    assert f"{path}:6: " in line and fragment in line
    assert not (out / "summary.md").exists()


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("[1, 2]", "expected a JSON object per line, got array"),
        ("7", "expected a JSON object per line, got number"),
        ('"text"', "expected a JSON object per line, got string"),
        ("{not json", "is not valid JSON"),
        ('{"benchmark": "amc23", "correct": true}', "record lacks 'problem_id'"),
    ],
)
def test_a_malformed_line_in_the_middle_is_an_error(tmp_path, capsys, line, fragment):
    path = tmp_path / "run.jsonl"
    records = good_records()
    path.write_text(
        json.dumps(records[0])
        + "\n"
        + line
        + "\n"
        + "".join(json.dumps(r) + "\n" for r in records[1:])
    )
    assert report(tmp_path, path)[0] == 2
    line = error_line(capsys)
    assert f"{path}:2" in line and fragment in line


def test_nemo_rl_reward_null_is_an_error(tmp_path, capsys):
    path = tmp_path / "evaluation_data.json"
    rows = [
        {"prompt": "Q", "response": "a", "reward": 1.0},
        {"prompt": "Q", "response": "b", "reward": None},
    ]
    path.write_text(json.dumps({"evaluation_data": rows}))
    assert report(tmp_path, f"nemo={path}")[0] == 2
    line = error_line(capsys)
    assert "evaluation_data[1]: field 'reward' must be a number, got null" in line


@pytest.mark.parametrize("kind", ["missing", "directory", "empty"])
def test_unusable_paths_are_named(tmp_path, capsys, kind):
    path = tmp_path / "run.jsonl"
    if kind == "directory":
        path.mkdir()
    elif kind == "empty":
        path.write_text("\n")
    assert report(tmp_path, path)[0] == 2
    line = error_line(capsys)
    assert str(path) in line
    assert {"missing": "does not exist", "directory": "is a directory", "empty": "holds no"}[
        kind
    ] in line


def test_out_that_is_a_file_is_refused(tmp_path, capsys):
    path = write(tmp_path / "run.jsonl", good_records())
    out = tmp_path / "report.md"
    out.write_text("keep me")
    assert report(tmp_path, path, out=out)[0] == 2
    assert "--out" in error_line(capsys) and out.read_text() == "keep me"


def test_truncated_last_line_is_reported_and_numbers_unchanged(tmp_path, capsys):
    clean = write(tmp_path / "clean.jsonl", good_records())
    cut = write(tmp_path / "cut.jsonl", good_records(), tail='{"benchmark": "amc23", "probl')
    assert report(tmp_path, clean, out=tmp_path / "a")[0] == 0
    assert report(tmp_path, cut, out=tmp_path / "b")[0] == 0
    assert f"{cut}:17: truncated last line skipped" in capsys.readouterr().err
    assert f"{cut}:17: truncated last line skipped" in (tmp_path / "b" / "summary.md").read_text()
    a, b = summary_numbers(tmp_path / "a"), summary_numbers(tmp_path / "b")
    assert a["benchmarks"]["clean"] == b["benchmarks"]["cut"]


def test_identical_duplicates_count_once_and_are_reported(tmp_path, capsys):
    records = good_records()
    clean = write(tmp_path / "clean.jsonl", records)
    doubled = write(tmp_path / "doubled.jsonl", records + records[3:5])
    assert report(tmp_path, clean, out=tmp_path / "a")[0] == 0
    assert report(tmp_path, doubled, out=tmp_path / "b")[0] == 0
    err = capsys.readouterr().err
    assert f"{doubled}:17: duplicate of {doubled}:4 counted once" in err
    a, b = summary_numbers(tmp_path / "a"), summary_numbers(tmp_path / "b")
    assert a["benchmarks"]["clean"] == b["benchmarks"]["doubled"]
    assert b["inputs"]["doubled"]["samples"] == 16


def test_conflicting_duplicate_is_an_error(tmp_path, capsys):
    records = good_records()
    flipped = {**records[3], "correct": not records[3]["correct"]}
    path = write(tmp_path / "run.jsonl", [*records, flipped])
    assert report(tmp_path, path)[0] == 2
    line = error_line(capsys)
    assert f"{path}:17: sample 3 of amc23/p0 is also at {path}:4 with another verdict" in line


def test_shards_make_one_run_and_paths_may_contain_equals(tmp_path):
    records = good_records()
    whole = write(tmp_path / "whole.jsonl", records)
    first = write(tmp_path / "part=0.jsonl", records[:7])
    second = write(tmp_path / "part=1.jsonl", records[7:])
    assert report(tmp_path, f"whole={whole}", f"sharded={first}", f"sharded={second}")[0] == 0
    numbers = summary_numbers(tmp_path / "report")
    assert numbers["benchmarks"]["whole"] == numbers["benchmarks"]["sharded"]
    assert numbers["inputs"]["sharded"]["files"] == [str(first), str(second)]
    assert report(tmp_path, first, out=tmp_path / "eq")[0] == 0  # an existing path with '='
    assert summary_numbers(tmp_path / "eq")["runs"] == ["part=0"]


def test_two_unnamed_files_with_one_stem_are_refused(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = write(tmp_path / "a" / "run.jsonl", good_records())
    second = write(tmp_path / "b" / "run.jsonl", good_records())
    assert report(tmp_path, first, second)[0] == 2
    assert "two runs are named 'run'" in error_line(capsys)


def test_summary_states_coverage_and_statuses_and_json_matches_the_verdicts(tmp_path):
    records = good_records(problems=4, samples=4)
    records[0]["status"] = "timeout"
    records[1]["status"] = "too_long"
    records += [record(9, s, True, benchmark="aime24") for s in range(2)]  # fewer samples
    records += [record(p, s, s == 0, benchmark="math500") for p in range(3) for s in range(16)]
    records[-1]["correct"] = 1  # 0/1 integers are accepted
    path = write(tmp_path / "mmpo.jsonl", records)
    code, out = report(tmp_path, path)
    assert code == 0
    summary = (out / "summary.md").read_text()
    assert "| mmpo | amc23 | 4 | 16 | 4 |" in summary
    assert "| mmpo | all | 8 | 66 | mixed 2-16 (5 problems with fewer than 16) |" in summary
    assert "status: ok 64, timeout 1, too_long 1" in summary
    numbers = summary_numbers(out)
    per_problem = {}
    for item in records:
        key = (item["benchmark"], item["problem_id"])
        per_problem.setdefault(key, []).append(bool(item["correct"]))
    for benchmark in ("amc23", "aime24", "math500"):
        rates = [sum(v) / len(v) for (b, _), v in per_problem.items() if b == benchmark]
        expected = 100 * sum(rates) / len(rates)
        assert numbers["benchmarks"]["mmpo"][benchmark]["accuracy_percent"] == pytest.approx(
            expected
        )
    # pass@4 is defined for amc23 (4 samples each) but not over all problems (aime24 has 2)
    assert numbers["pass_at_k"]["mmpo"]["amc23"]["pass@4"] == pytest.approx(3 / 4)
    assert numbers["pass_at_k"]["mmpo"]["all"]["pass@4"] is None
    assert numbers["inputs"]["mmpo"]["status_counts"] == {"ok": 64, "timeout": 1, "too_long": 1}


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--samples", "0"], "--samples '0': give an integer >= 1 or 'paper'"),
        (["--top-p", "2"], "--top-p 2.0: give a number in (0, 1]"),
        (["--temperature", "nan"], "--temperature nan: give a number >= 0"),
        (["--max-tokens", "0"], "--max-tokens 0: give an integer >= 1"),
        (["--shard-index", "3", "--num-shards", "2"], "--shard-index 3 --num-shards 2"),
        (["--grade-timeout", "0"], "--grade-timeout 0.0 must be > 0 seconds"),
        (["--data", "amc23"], "--data 'amc23': give NAME=local file"),
    ],
)
def test_generate_flags_are_checked_before_any_work(tmp_path, capsys, flags, fragment):
    data = tmp_path / "amc.jsonl"
    data.write_text('{"question": "1+1?", "answer": 2}\n')
    base = ["generate", "--model", str(tmp_path), "--out", str(tmp_path / "o.jsonl")]
    base += ["--benchmarks", "amc23", "--data", f"amc23={data}"]
    if "--data" in flags:
        base = base[:-2]
    assert eval_main([*base, *flags]) == 2
    assert fragment in error_line(capsys)


def test_a_run_covering_fewer_problems_is_stated(tmp_path, capsys):
    full = write(tmp_path / "full.jsonl", good_records(problems=4))
    half = write(tmp_path / "half.jsonl", good_records(problems=2))
    code, out = report(tmp_path, full, half)
    assert code == 0
    sentence = "the runs cover different problems (half has 2 of 4)"
    assert sentence in capsys.readouterr().err
    assert sentence in (out / "summary.md").read_text()
