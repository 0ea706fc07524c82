"""The study report's paired differences, on hand-made run records (no NeMo-RL): each pair is
matched by seed, seeds one method lacks are left out, and a pair's Gini difference does not
depend on which other methods the study ran."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from study_records import run_record

from nemo_mmpo.eval.metrics import gini_by_method
from nemo_mmpo.study.comparison import _tables, aggregate, paired_difference


@pytest.fixture
def runs() -> list[dict]:
    generator = np.random.default_rng(0)
    records = []
    for seed in range(4):
        for method in ("grpo", "maxrl", "mmpo"):
            if method == "grpo" and seed == 3:
                continue  # GRPO lacks seed 3: pairs with GRPO use seeds 0-2
            success = generator.uniform(0, 1, size=12).round(2).tolist()
            records.append(run_record(method, seed, success, int(generator.integers(0, 5))))
    return records


def test_a_paired_difference_is_the_mean_over_shared_seeds(runs):
    of = {(run["method"], run["seed"]): run["selected"] for run in runs}
    difference = paired_difference(runs, "selected", "mmpo", "grpo")
    expected = [of["mmpo", seed]["average"] - of["grpo", seed]["average"] for seed in range(3)]
    assert difference["average"]["n"] == 3
    assert difference["average"]["mean"] == pytest.approx(np.mean(expected))
    assert difference["average"]["differences"] == pytest.approx(expected)
    half_width = stats.t.ppf(0.975, 2) * np.std(expected, ddof=1) / np.sqrt(3)
    assert difference["average"]["low"] <= np.mean(expected) - half_width + 1e-3  # 3 decimals
    assert difference["average"]["high"] >= np.mean(expected) + half_width - 1e-3  # of t
    assert difference["average"]["p"] == pytest.approx(stats.ttest_1samp(expected, 0).pvalue)
    solved = [
        of["mmpo", seed]["never_solved"] - of["grpo", seed]["never_solved"] for seed in (0, 1, 2)
    ]
    assert difference["never_solved"]["mean"] == pytest.approx(np.mean(solved))
    assert paired_difference(runs, "selected", "mmpo", "maxrl")["average"]["n"] == 4
    assert paired_difference(runs, "selected", "mmpo", "nobody") is None


@pytest.mark.parametrize("alpha", [0.0, 0.1])
def test_a_pairs_gini_is_computed_on_the_two_methods_alone(runs, alpha):
    of = {(run["method"], run["seed"]): run["selected"]["success"] for run in runs}
    expected = []
    for seed in range(3):
        vectors = {name: np.array(list(of[name, seed].values())) for name in ("mmpo", "grpo")}
        gini = gini_by_method(vectors, alpha)["methods"]
        expected.append(gini["mmpo"]["gini"] - gini["grpo"]["gini"])
    difference = paired_difference(runs, "selected", "mmpo", "grpo")[f"gini@{alpha}"]
    assert difference["mean"] == pytest.approx(np.mean(expected))
    without_maxrl = [run for run in runs if run["method"] != "maxrl"]
    assert paired_difference(without_maxrl, "selected", "mmpo", "grpo")[f"gini@{alpha}"] == (
        difference
    )


def test_the_report_has_both_paired_tables_with_mmpo_minus_each_method(runs):
    numbers = aggregate(runs, "selected")
    assert set(numbers["paired_difference_from_grpo"]) == {"maxrl", "mmpo"}
    assert set(numbers["paired_difference_of_mmpo"]) == {"grpo", "maxrl"}
    from_grpo = numbers["paired_difference_from_grpo"]["mmpo"]["average"]
    of_mmpo = numbers["paired_difference_of_mmpo"]["grpo"]["average"]
    assert of_mmpo["mean"] == pytest.approx(from_grpo["mean"])
    text = "\n".join(_tables(numbers, "selected"))
    assert "Paired difference from GRPO" in text
    assert "Paired difference of MMPO (T=4) from each other method" in text
    assert "Gini α = 0.1" in text


def test_every_method_of_the_study_with_its_ablations_gets_its_own_colour():
    from nemo_mmpo.study.figures import _colours
    from nemo_mmpo.study.methods import ALL_METHODS, METHODS

    assert len(set(_colours(len(ALL_METHODS)))) >= len(ALL_METHODS) > 10
    assert len(set(_colours(len(METHODS)))) >= len(METHODS)


def test_the_report_pools_the_finished_runs_of_several_study_folders(tmp_path, monkeypatch):
    """``study report --runs-from``: runs of other folders join the report, no symlinks; the
    same method and seed in two folders is refused (it would count one seed twice)."""
    from nemo_mmpo import MMPOInputError
    from nemo_mmpo.study import comparison

    def finish(study: str, seed: int) -> None:
        folder = tmp_path / study / "runs" / f"mmpo-seed{seed}"
        folder.mkdir(parents=True)
        (folder / "finished.json").write_text("{}")

    for study, seed in (("first", 0), ("first", 1), ("second", 2), ("second", 3)):
        finish(study, seed)
    monkeypatch.setattr(  # the run's numbers are read_run's business (tested with the CPU rig)
        comparison,
        "read_run",
        lambda folder: {"method": "mmpo", "seed": int(folder.name[-1]), "folder": str(folder)},
    )
    pooled = comparison.finished_runs([tmp_path / "first", tmp_path / "second"])
    assert sorted(run["seed"] for run in pooled) == [0, 1, 2, 3]
    assert comparison.finished_runs([tmp_path / "first"])[-1]["seed"] == 1
    finish("second", 1)
    with pytest.raises(MMPOInputError, match="'mmpo' seed 1 finished in both"):
        comparison.finished_runs([tmp_path / "first", tmp_path / "second"])
    with pytest.raises(MMPOInputError, match="hold no finished run"):
        comparison.finished_runs([tmp_path / "empty"])
    with pytest.raises(MMPOInputError, match="hold no finished run of grpo"):
        comparison.write_study_report(tmp_path / "first", methods=("grpo",))


def test_a_report_is_made_again_from_its_run_records_alone(tmp_path, runs, monkeypatch):
    """``study report`` writes each run's record (``records/``); a folder holding only those
    (as ``docs/results/`` does) gives the same ``study.json``, and a run folder wins over a
    record of the same method and seed."""
    import json
    import shutil

    from nemo_mmpo.study import comparison

    for run in runs:
        run |= {"steps": 30, "selected_step": 30, "final_step": 30, "seconds": 1.0}
        run["reward"] = np.linspace(0.1, 0.5 + 0.1 * run["seed"], 30).tolist()
    first = tmp_path / "first"
    comparison.write_records(first, runs)
    made = json.loads(comparison.write_study_report(first).with_suffix(".json").read_text())
    assert len(list((first / "records").glob("*.json"))) == len(runs)
    again = tmp_path / "again"
    shutil.copytree(first / "records", again / "records")
    remade = json.loads(comparison.write_study_report(again).with_suffix(".json").read_text())
    assert remade == made
    assert (again / "study_rewards.png").is_file()
    # a run folder of the same method and seed wins over the record
    folder = first / "runs" / "mmpo-seed0"
    folder.mkdir(parents=True)
    (folder / "finished.json").write_text("{}")
    from_folder = {"method": "mmpo", "seed": 0, "folder": str(folder)}
    with monkeypatch.context() as patch:  # the run's numbers are read_run's business
        patch.setattr(comparison, "read_run", lambda path: from_folder)
        pooled = comparison.finished_runs([first])
    assert [run for run in pooled if (run["method"], run["seed"]) == ("mmpo", 0)] == [from_folder]
    assert len(pooled) == len(runs)
    shutil.rmtree(first / "runs")  # two folders recording one seed: refused
    with pytest.raises(comparison.MMPOInputError, match="'grpo' seed 0 finished in both"):
        comparison.finished_runs([first, again])


def test_a_pooled_report_writes_no_record_of_another_folder_and_is_made_again(tmp_path, runs):
    """``report --out ten --runs-from study check`` (as docs/study.md pools the ten seeds):
    each pooled run's record stays in the folder it came from, so the same command runs again
    with the same numbers (it was refused, each run "finished in both", when the first report
    had copied the pooled records into ``ten``)."""
    import json

    from nemo_mmpo.study import comparison

    for run in runs:
        run |= {"steps": 30, "selected_step": 30, "final_step": 30, "seconds": 1.0}
        run["reward"] = np.linspace(0.1, 0.5, 30).tolist()
    comparison.write_records(tmp_path / "study", [run for run in runs if run["seed"] < 2])
    comparison.write_records(tmp_path / "check", [run for run in runs if run["seed"] >= 2])
    pooled = (tmp_path / "study", tmp_path / "check")
    made = comparison.write_study_report(tmp_path / "ten", pooled).with_suffix(".json")
    first = json.loads(made.read_text())
    assert not (tmp_path / "ten" / comparison.RECORDS).exists()
    again = comparison.write_study_report(tmp_path / "ten", pooled).with_suffix(".json")
    assert json.loads(again.read_text()) == first
    assert {(run["method"], run["seed"]) for run in first["runs"]} == {
        (run["method"], run["seed"]) for run in runs
    }


def test_a_study_continues_from_committed_records_seed_by_seed(tmp_path, monkeypatch):
    """``study run`` skips a seed whose every method is recorded (``records/``, no run folder:
    another machine ran it, as under docs/results/) and runs the others; a seed recorded in
    part is refused, naming the methods and the fix (its runs here would start from another
    warm start). Nothing is trained: ``run_recipe`` is recorded, not run."""
    import json

    from nemo_mmpo import MMPOInputError
    from nemo_mmpo.study import runner
    from nemo_mmpo.study.comparison import record_path

    ran = []

    def run_recipe(folder, recipe, overrides, record):
        ran.append((record["method"], record["seed"]))
        return {**record, "seconds": 0.0}

    monkeypatch.setattr(runner, "run_recipe", run_recipe)
    plan = runner.StudyPlan(methods=("grpo", "mmpo"), seeds=(0, 1))
    for method in plan.methods:
        path = record_path(tmp_path, method, 0)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(run_record(method, 0, [0.5, 0.25], 0)))
    lines = []
    runner.run_study(tmp_path, plan, log=lines.append)
    assert ran == [("grpo", 1), ("mmpo", 1)]
    assert sum("recorded in" in line for line in lines) == 2

    record_path(tmp_path, "mmpo", 0).unlink()
    with pytest.raises(MMPOInputError, match=r"seed 0: grpo recorded .* mmpo not"):
        runner.run_study(tmp_path, plan, log=lines.append)
