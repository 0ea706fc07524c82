"""The seed spread's summary (``nemo-mmpo cpu spread``) on hand-made run records: the table has
one row per run with its warm start, its numerics, its reward blocks and gains, and the
summary line names the smallest and mean gains (no training: records and TensorBoard events
written here)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("tensorboard")
pytest.importorskip("matplotlib")

from torch.utils.tensorboard import SummaryWriter

from nemo_mmpo.cpu.spread.robustness import summarise


def _record(tmp_path, variant, seed, rewards, curve):
    log_dir = tmp_path / f"{variant}-{seed}" / "logs"
    writer = SummaryWriter(str(log_dir / "tensorboard"))
    for step, reward in enumerate(rewards):
        writer.add_scalar("train/reward", reward, step)
    writer.close()
    made_by = {"python": "3.13.0", "torch": "2.11.0", "threads": 2, "kernels": "AVX512"}
    return {
        "variant": variant,
        "seed": seed,
        "log_dir": str(log_dir),
        "seconds": 123.4,
        "warm_start": {"steps": 400, "success": 0.25, "made_by": made_by},
        "expected_success": curve,
    }


def test_the_summary_table_has_a_row_per_run_and_the_smallest_gain(tmp_path):
    records = [
        _record(
            tmp_path,
            "default",
            0,
            [0.2] * 10 + [0.6] * 10,
            {"0": {"train": 0.2, "held_out": 0.1}, "20": {"train": 0.5, "held_out": 0.3}},
        ),
        _record(
            tmp_path,
            "threads1",
            1,
            [0.3] * 10 + [0.4] * 10,
            {"0": {"train": 0.2, "held_out": 0.1}, "20": {"train": 0.3, "held_out": 0.2}},
        ),
    ]
    summary = summarise(records, tmp_path / "out", window=10)

    assert summary["every_run_gained"] is True
    assert summary["gain"]["min"] == pytest.approx(0.1)
    assert summary["gain"]["max"] == pytest.approx(0.4)
    lines = (tmp_path / "out" / "spread.md").read_text().splitlines()
    assert lines[0] == (
        "| variant | seed | warm start (steps, sampled success) | made by | reward, 10-step means "
        "| gain | expected success, train / held-out | seconds |"
    )
    assert lines[1] == "|---|---|---|---|---|---|---|---|"
    assert lines[2] == (
        "| default | 0 | 400, 0.250 | Python 3.13.0, torch 2.11.0, 2 thread(s), AVX512 kernels "
        "| 0.20 → 0.60 | +0.400 | 0.200 → 0.500 / 0.100 → 0.300 | 123 |"
    )
    assert lines[3].startswith("| threads1 | 1 | 400, 0.250 |")
    assert "| 0.30 → 0.40 | +0.100 |" in lines[3]
    assert lines[4] == ""
    assert lines[5].startswith(
        "Training reward gain (last 10-step mean minus first): min +0.100, mean +0.250, max "
        "+0.400 over 2 runs."
    )
    assert json.loads((tmp_path / "out" / "spread.json").read_text())["window"] == 10
    assert (tmp_path / "out" / "spread.png").stat().st_size > 0


def test_runs_shorter_than_two_windows_have_no_reward_gain(tmp_path):
    """A 50-step spread with 50-step windows has one reward window a run: its reward gain is
    n/a (not +0.000), and whether every run gained is read from the expected success."""
    curve = {"0": {"train": 0.2, "held_out": 0.1}, "20": {"train": 0.25, "held_out": 0.1}}
    records = [_record(tmp_path, "default", 0, [0.2] * 20, curve)]
    summary = summarise(records, tmp_path / "out", window=20)
    assert summary["gain"] is None and summary["every_run_gained"] is True
    lines = (tmp_path / "out" / "spread.md").read_text().splitlines()
    assert "| 0.20 | n/a |" in lines[2]
    assert lines[4].startswith(
        "Training reward gain: none (the runs are shorter than two 20-step windows). "
        "Expected success gain, training problems: min +0.050"
    )
    falling = {"0": {"train": 0.2, "held_out": 0.1}, "20": {"train": 0.19, "held_out": 0.1}}
    records = [_record(tmp_path, "default", 1, [0.2] * 20, falling)]
    assert summarise(records, tmp_path / "again", window=20)["every_run_gained"] is False
