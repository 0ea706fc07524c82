"""generate -> grade -> report end to end on CPU: a tiny random causal LM (built from a config,
no hub) sampled through ``--backend hf``, graded by the real Math-Verify pool, reported; and a
driver killed with SIGKILL leaves no grading worker behind and resumes without loss."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import patience
import pytest

pytest.importorskip("math_verify", reason="the eval extra (math-verify) is not installed")
pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")

from nemo_mmpo.cli import handle
from nemo_mmpo.eval.__main__ import main
from nemo_mmpo.eval.verify import grade_serially


def eval_main(argv):
    """The eval tool as a person runs it: its errors through the CLI's one handler."""
    return handle(main, argv, "nemo-mmpo eval")


ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def problems(tmp_path):
    path = tmp_path / "amc.jsonl"
    rows = [{"id": f"q{i}", "question": f"{i} {i}", "answer": float(i % 10)} for i in range(6)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def generate_args(model, data, out, *extra):
    return [
        "generate",
        "--backend",
        "hf",
        "--model",
        str(model),
        "--out",
        str(out),
        "--benchmarks",
        "amc23",
        "--data",
        f"amc23={data}",
        "--samples",
        "4",
        "--max-tokens",
        "4",
        "--temperature",
        "1.0",
        "--top-p",
        "1.0",
        "--grade-workers",
        "2",
        *extra,
    ]


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_generate_grade_report_on_a_tiny_model(tiny_model, problems, tmp_path):
    out = tmp_path / "runs" / "tiny.jsonl"
    assert eval_main(generate_args(tiny_model, problems, out)) == 0
    written = records(out)
    assert len(written) == 6 * 4
    assert {(r["problem_id"], r["sample"]) for r in written} == {
        (f"q{i}", s) for i in range(6) for s in range(4)
    }
    for record in written:  # the pool's verdicts are Math-Verify's on the written response
        assert record["correct"] == grade_serially(record["answer"], record["response"]).correct
    assert eval_main(generate_args(tiny_model, problems, out)) == 0  # resumed: nothing new
    assert len(records(out)) == 24

    report = tmp_path / "report"
    assert eval_main(["report", str(out), "--out", str(report)]) == 0
    numbers = json.loads((report / "summary.json").read_text())
    rates = {}
    for record in written:
        rates.setdefault(record["problem_id"], []).append(record["correct"])
    expected = 100 * sum(sum(v) / len(v) for v in rates.values()) / len(rates)
    assert numbers["benchmarks"]["tiny"]["amc23"]["accuracy_percent"] == pytest.approx(expected)
    solved_any = sum(any(v) for v in rates.values()) / len(rates)
    assert numbers["pass_at_k"]["tiny"]["amc23"]["pass@4"] == pytest.approx(solved_any)
    assert numbers["inputs"]["tiny"]["samples"] == 24


def test_greedy_hf_sampling_is_the_models_greedy_continuation(tiny_model):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nemo_mmpo.eval.generate import TransformersSampler

    sampler = TransformersSampler(str(tiny_model), temperature=0.0, max_tokens=5)
    [[first, second]] = sampler.generate(["12 34"], 2)
    assert first == second  # greedy: every sample is the same
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    ids = tokenizer("12 34", return_tensors="pt")["input_ids"]
    for _ in range(5):  # argmax step by step, by hand
        with torch.no_grad():
            next_id = model(ids).logits[0, -1].argmax()
        ids = torch.cat([ids, next_id.view(1, 1)], dim=1)
        if next_id.item() == tokenizer.eos_token_id:
            break
    assert first == tokenizer.decode(ids[0, 5:], skip_special_tokens=True)


def _alive(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def _marked_processes(mark):
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if mark.encode() in (entry / "environ").read_bytes() and _alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_killed_driver_leaves_no_worker_and_resumes_without_loss(tiny_model, problems, tmp_path):
    out = tmp_path / "run.jsonl"
    mark = f"NEMO_MMPO_TEST_MARK={uuid.uuid4()}"
    environment = {**os.environ, mark.split("=")[0]: mark.split("=")[1]}
    environment["PYTHONPATH"] = os.pathsep.join([str(ROOT), environment.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "nemo_mmpo.eval", *generate_args(tiny_model, problems, out)]
    command[command.index("--samples") + 1] = "64"  # long enough to be killed mid-run:
    command += ["--batch-size", "4"]  # 96 sampler calls, each written when graded
    driver = subprocess.Popen(command, env=environment, stdout=subprocess.DEVNULL)
    deadline = patience.Deadline(patience.COMMAND_S, driver.pid)
    while not deadline.passed() and not (out.exists() and out.stat().st_size > 0):
        time.sleep(0.05)
    workers = [pid for pid in _marked_processes(mark) if pid != driver.pid]
    assert workers, "the grading workers should be running"
    assert driver.poll() is None, "the driver finished before it was killed: make the run longer"
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _marked_processes(mark):
        time.sleep(0.1)
    assert _marked_processes(mark) == []  # no orphan grader left
    partial = len(records(out)) if out.read_text().endswith("\n") else None
    assert eval_main([*command[3:]]) == 0  # resume in this process
    final = records(out)
    keys = [(r["problem_id"], r["sample"]) for r in final]
    assert len(keys) == len(set(keys)) == 6 * 64  # nothing lost, nothing twice
    assert partial is None or partial < 6 * 64


STUCK_DRIVER = """
import sys
from nemo_mmpo.eval.verify import VerifierPool
with VerifierPool(num_workers=1, timeout_seconds=600) as pool:
    pool.verify(["1"], ["\\boxed{1}"])  # the worker is up and grading
    print(pool.pids[0], flush=True)
    pool.verify(["3"], ["\\\\boxed{9^{9^{9^{9^{9}}}}}"])  # hangs in C code for minutes
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_worker_stuck_in_an_answer_dies_with_its_driver(tmp_path):
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    driver = subprocess.Popen(
        [sys.executable, "-c", STUCK_DRIVER], env=environment, stdout=subprocess.PIPE, text=True
    )
    worker = int(driver.stdout.readline())
    time.sleep(1.0)  # the worker is now inside the hanging answer
    assert _alive(worker)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    # well before Math-Verify's own 5-second alarms could end the answer (and the worker
    # notice the closed pipe): only a worker that dies with its driver is gone by then
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and _alive(worker):
        time.sleep(0.1)
    assert not _alive(worker)
