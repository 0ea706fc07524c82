"""Generation is resumable and shardable; NeMo-RL eval files load; the report command runs."""

from __future__ import annotations

import json
import zlib

import pytest

from nemo_mmpo.cli import handle
from nemo_mmpo.eval.__main__ import main
from nemo_mmpo.eval.generate import run_generation, shard
from nemo_mmpo.eval.rollouts import problem_counts, read_rollouts
from nemo_mmpo.eval.synthetic import write_synthetic_runs
from nemo_mmpo.eval.verify import Verdict


def eval_main(argv):
    """The eval tool as a person runs it: its errors through the CLI's one handler."""
    return handle(main, argv, "nemo-mmpo eval")


PROBLEMS = [
    {"id": f"p{i}", "problem": f"What is {i}+0?", "answer": str(i), "source": "amc23"}
    for i in range(10)
]


class FakeSampler:
    """Answers correctly for even problems; can fail after some calls (a killed run)."""

    def __init__(self, fail_after: int | None = None):
        self.calls = 0
        self.fail_after = fail_after
        self.prompts: list[str] = []

    def generate(self, prompts, n):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt("killed")
        self.calls += 1
        self.prompts.extend(prompts)
        return [[f"\\boxed{{{prompt.split()[2].split('+')[0]}}}"] * n for prompt in prompts]


def grade(golds, predictions):
    return [
        Verdict(f"\\boxed{{{gold}}}" == prediction and int(gold) % 2 == 0)
        for gold, prediction in zip(golds, predictions, strict=True)
    ]


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_generation_resumes_without_duplicates(tmp_path):
    out = tmp_path / "run.jsonl"
    with pytest.raises(KeyboardInterrupt):
        run_generation(
            PROBLEMS, FakeSampler(fail_after=2), grade, out, 4, batch_size=3, progress=False
        )
    assert len(lines(out)) == 2 * 3 * 4
    with open(out, "a") as handle:
        handle.write('{"benchmark": "amc23", "problem_id": "p9", "sam')  # killed mid-line
    sampler = FakeSampler()
    counts = run_generation(PROBLEMS, sampler, grade, out, 4, batch_size=3, progress=False)
    assert counts == {"written": 4 * 4, "skipped": 24}
    records = lines(out)
    assert len(records) == 40
    assert len({(r["problem_id"], r["sample"]) for r in records}) == 40
    assert sampler.calls == 2
    counts = problem_counts(read_rollouts(out))
    assert counts.correct.tolist() == [4, 0, 4, 0, 4, 0, 4, 0, 4, 0]


def test_prompts_use_the_single_backslash_template(tmp_path):
    sampler = FakeSampler()
    run_generation(PROBLEMS[:1], sampler, grade, tmp_path / "r.jsonl", 1, progress=False)
    assert sampler.prompts == [
        "What is 0+0?\nPlease reason step by step, and put your final answer within \\boxed{}."
    ]


def test_shards_partition_the_problems(tmp_path):
    parts = [shard(PROBLEMS, index, 3) for index in range(3)]
    assert sorted(p["id"] for part in parts for p in part) == sorted(p["id"] for p in PROBLEMS)
    run_generation(PROBLEMS, FakeSampler(), grade, tmp_path / "s1.jsonl", 2, 1, 3, progress=False)
    assert {r["problem_id"] for r in lines(tmp_path / "s1.jsonl")} == {"p1", "p4", "p7"}


def test_nemo_rl_evaluation_files_are_read(tmp_path):
    path = tmp_path / "evaluation_data.json"
    rows = [
        {
            "prompt": "Q1",
            "response": "a",
            "reward": 1.0,
            "message_log": "[]",
            "extra_env_info": "{}",
            "sample_index": i,
        }
        for i in range(3)
    ]
    rows += [
        {
            "prompt": "Q2",
            "response": "b",
            "reward": 0.0,
            "message_log": "[]",
            "extra_env_info": "{}",
            "sample_index": 3 + i,
        }
        for i in range(3)
    ]
    path.write_text(json.dumps({"evaluation_data": rows}))
    counts = problem_counts(read_rollouts(path, benchmark="aime24"))
    assert sorted(zip(counts.samples.tolist(), counts.correct.tolist(), strict=True)) == [
        (3, 0),
        (3, 3),
    ]
    assert counts.benchmarks == ["aime24"]


def test_report_command_on_a_synthetic_two_method_file(tmp_path):
    mmpo, grpo = write_synthetic_runs(tmp_path / "runs", scale=0.2)
    out = tmp_path / "report"
    assert eval_main(["report", str(mmpo), f"GRPO={grpo}", "--out", str(out)]) == 0
    summary = (out / "summary.md").read_text()
    assert "| mmpo |" in summary and "| GRPO |" in summary
    for figure in ("lorenz.png", "gini_vs_alpha.png", "first_success.png", "pass_at_k.png"):
        assert (out / figure).stat().st_size > 1000
    assert eval_main(["report", str(tmp_path / "missing.jsonl"), "--out", str(out)]) == 2


def test_generate_without_vllm_says_what_to_install(tmp_path, capsys):
    pytest.importorskip("math_verify")
    try:
        import vllm  # noqa: F401

        pytest.skip("vLLM is installed here")
    except ImportError:
        pass
    data = tmp_path / "amc.jsonl"
    data.write_text('{"question": "1+1?", "answer": 2.0}\n')
    code = eval_main(
        [
            "generate",
            "--model",
            "m",
            "--out",
            str(tmp_path / "o.jsonl"),
            "--benchmarks",
            "amc23",
            "--data",
            f"amc23={data}",
        ]
    )
    assert code == 2
    assert "vLLM" in capsys.readouterr().err


class CallSeededSampler:
    """Draws fixed by the call, as vLLM with a seed per row (``VLLMSampler(seed_per_row=
    True)``): row ``r`` of a call answers from a seed of the call's prompts and ``r``."""

    draws_fixed_by_call = True

    def generate(self, prompts, n):
        return [
            [
                f"\\boxed{{{zlib.crc32(f'{prompts} {row * n + sample}'.encode()) % 7}}}"
                for sample in range(n)
            ]
            for row in range(len(prompts))
        ]


@pytest.mark.parametrize("kept_lines", [0, 1, 5, 12, 13, 29, 39])
def test_a_resumed_call_seeded_run_writes_what_an_uninterrupted_run_writes(tmp_path, kept_lines):
    """Cut anywhere (a killed run), then resumed: the same records, each once, as a run that
    never stopped (the interrupted call is asked again whole; only missing samples written)."""
    whole, cut = tmp_path / "whole.jsonl", tmp_path / "cut.jsonl"
    run_generation(PROBLEMS, CallSeededSampler(), grade, whole, 4, batch_size=3, progress=False)
    text = whole.read_text().splitlines(keepends=True)
    cut.write_text("".join(text[:kept_lines]))
    counts = run_generation(
        PROBLEMS, CallSeededSampler(), grade, cut, 4, batch_size=3, progress=False
    )
    assert counts == {"written": 40 - kept_lines, "skipped": kept_lines}
    key = lambda record: (record["problem_id"], record["sample"])  # noqa: E731
    assert sorted(lines(cut), key=key) == sorted(lines(whole), key=key)
    assert len({key(record) for record in lines(cut)}) == 40
