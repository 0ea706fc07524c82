"""A smoke run of the study (two methods, one seed, two steps) through NeMo-RL's loop: the
report is written, its numbers are the evaluation report's on the same rollouts, and the run
records it writes make the same report with no run folder."""

from __future__ import annotations

import json
import shutil

import pytest
from nemo_rl_support import import_nemo_rl

# CI time: on v0.7.0, beside main's session (the long pole since its single controller's, resumed
# step's and TransferQueue trainer's runs)
pytestmark = [pytest.mark.nemo_rl, pytest.mark.one_snapshot, pytest.mark.long_run]
import_nemo_rl("nemo_rl.algorithms.grpo")

from nemo_mmpo.eval.report import load_runs, write_report
from nemo_mmpo.study.comparison import write_study_report
from nemo_mmpo.study.runner import StudyPlan, run_study


def test_a_two_method_study_reports_the_evaluation_reports_numbers(tmp_path, tiny_warm_starts):
    out = tmp_path / "study"
    plan = StudyPlan(
        methods=("grpo", "mmpo"),
        seeds=(0,),
        steps=2,  # CI time: two evaluations a run (steps 0 and 2) are enough to select from
        eval_every=2,
        samples=2,
        extra=(f"cpu_backend.warm_start_cache={tiny_warm_starts}",),
    )
    records = run_study(out, plan, log=lambda message: None)
    assert [(record["method"], record["seed"]) for record in records] == [("grpo", 0), ("mmpo", 0)]
    assert run_study(out, plan, log=lambda message: None) == records  # finished runs are skipped
    study = json.loads(write_study_report(out).with_suffix(".json").read_text())
    assert set(study["selected"]["methods"]) == {"grpo", "mmpo"}
    assert "mmpo" in study["selected"]["paired_difference_from_grpo"]
    for run in study["runs"]:
        for which in ("selected", "final"):
            step = run[f"{which}_step"]
            rollouts = f"{run['folder']}/logs/evaluation/step_{step}.jsonl"
            report = json.loads(
                write_report(load_runs([f"r={rollouts}"], progress=False), tmp_path / "r")
                .with_suffix(".json")
                .read_text()
            )
            ours = run[which]
            # equal strata (60 problems each): the mean of the strata is the mean of all,
            # which is the report's pass@1 (the mean over problems of correct / samples)
            theirs = report["pass_at_k"]["r"]["arithmetic"]
            assert ours["average"] == pytest.approx(theirs["pass@1"], rel=1e-9)
            for key, value in ours["pass_at_k"].items():
                assert value == pytest.approx(theirs[key], rel=1e-9)
            assert ours["problems"] == 240
    figures = ("study_rewards", "study_pass_at_k", "study_paired_pass_at_k", "study_lorenz")
    for figure in (*figures, "study_first_success"):
        assert (out / f"{figure}.png").is_file()
    text = (out / "study.md").read_text()
    assert "Paired difference from GRPO" in text
    assert "Paired difference of MMPO (T=4) from each other method" in text
    assert set(study["final"]["paired_difference_of_mmpo"]) == {"grpo"}
    # the run records alone (what docs/results/ commits) give the same numbers
    again = tmp_path / "again"
    shutil.copytree(out / "records", again / "records")
    remade = json.loads(write_study_report(again).with_suffix(".json").read_text())
    assert {which: remade[which] for which in ("selected", "final")} == {
        which: study[which] for which in ("selected", "final")
    }
