"""The watcher holds one sampling engine at a time: each checkpoint's engine is closed once its
step is measured, or when the step fails, before the next checkpoint's is built (on a GPU the
next engine needs the memory the last one holds)."""

from __future__ import annotations

import json

import pytest

from nemo_mmpo.eval import watch as watch_module
from nemo_mmpo.eval.protocol import EvaluationSettings, read_steps

PROBLEMS = [
    {"id": f"p{i}", "problem": f"What is {i}+0?", "answer": str(i), "source": "amc23"}
    for i in range(6)
]


class RecordingSampler:
    """Answers every problem correctly; writes what happens to it into ``events``."""

    def __init__(self, step: int, events: list[str], fail: bool = False):
        self.step, self.events, self.fail = step, events, fail
        events.append(f"open {step}")

    def generate(self, prompts, n):
        assert f"close {self.step}" not in self.events, "sampled after close"
        if self.fail:
            raise RuntimeError("the engine died")
        return [[f"\\boxed{{{prompt.split()[2].split('+')[0]}}}"] * n for prompt in prompts]

    def close(self):
        self.events.append(f"close {self.step}")


def checkpoints(root, steps):
    """NeMo-RL's finished ``step_<N>`` folders, each with a Hugging Face ``policy/weights``."""
    for step in steps:
        weights = root / f"step_{step}" / "policy" / "weights"
        weights.mkdir(parents=True)
        (weights / "config.json").write_text("{}")
        (root / f"step_{step}" / "training_info.json").write_text(json.dumps({"step": step}))


@pytest.fixture
def settings(tmp_path):
    benchmark = tmp_path / "amc23.jsonl"
    benchmark.write_text("".join(json.dumps(record) + "\n" for record in PROBLEMS))
    return EvaluationSettings(
        enabled=True,
        benchmarks={"amc23": str(benchmark)},
        samples=2,
        template="{}",  # the problem as it is (no recipe here to take the training prompt from)
        output_dir=str(tmp_path / "evaluation"),
    )


def test_each_checkpoints_engine_is_closed_before_the_next_is_built(
    tmp_path, settings, monkeypatch
):
    events: list[str] = []
    monkeypatch.setattr(
        watch_module,
        "make_sampler",
        lambda backend, model, settings, step, *args: RecordingSampler(step, events),
    )
    checkpoints(tmp_path / "checkpoints", (2, 4, 6))
    done = watch_module.watch(
        settings,
        tmp_path / "checkpoints",
        tmp_path / "tensorboard",
        every=2,
        backend="hf",
        log=lambda _: None,
    )
    assert sorted(done) == [2, 4, 6]
    assert events == ["open 2", "close 2", "open 4", "close 4", "open 6", "close 6"]
    assert read_steps(tmp_path / "evaluation")[4]["average"] == 1.0


def test_an_engine_that_fails_its_step_is_closed_too(tmp_path, settings, monkeypatch):
    events: list[str] = []
    monkeypatch.setattr(
        watch_module,
        "make_sampler",
        lambda backend, model, settings, step, *args: RecordingSampler(step, events, fail=True),
    )
    checkpoints(tmp_path / "checkpoints", (2,))
    with pytest.raises(RuntimeError, match="the engine died"):
        watch_module.watch(
            settings,
            tmp_path / "checkpoints",
            tmp_path / "tensorboard",
            every=2,
            backend="hf",
            log=print,
        )
    assert events == ["open 2", "close 2"]


def test_following_a_run_evaluates_each_checkpoint_as_it_appears(tmp_path, settings, monkeypatch):
    """``--follow``: a checkpoint NeMo-RL finishes while the watcher waits is evaluated once, and
    the watcher stops once ``last_step`` is evaluated (the loop of ``tests/cpu/test_watch.py``'s
    live run, which CI runs on request: its engine, NeMo-RL's checkpoints and kills are the
    Megatron recipe's watcher test's in CI)."""
    events: list[str] = []
    root = tmp_path / "checkpoints"

    def sampler(backend, model, settings, step, *args):
        if step == 2:  # training writes the next checkpoint while step 2 is measured
            checkpoints(root, (4,))
        return RecordingSampler(step, events)

    monkeypatch.setattr(watch_module, "make_sampler", sampler)
    checkpoints(root, (2,))
    (root / "tmp_step_6").mkdir()  # NeMo-RL's checkpoint still being written: not yet
    done = watch_module.watch(
        settings,
        root,
        tmp_path / "tensorboard",
        every=2,
        backend="hf",
        follow=True,
        last_step=4,
        poll_seconds=0.01,
        idle_seconds=60,
        log=lambda _: None,
    )
    assert sorted(done) == [2, 4]
    assert events == ["open 2", "close 2", "open 4", "close 4"]
