"""The study's results committed under ``docs/results/`` are what their committed run records
give, and ``study check --against`` them runs on a fresh clone (no run, no NeMo-RL).

``docs/results/study`` (seeds 0-4, the five methods and the six ablations) and
``docs/results/check`` (seeds 5-9, the five methods) hold each run's record and the report made
from it; ``docs/results/ten`` holds the report pooled from both folders' records (the five
methods on ten seeds, the ablations on five: one family of claims, one Holm correction). A
change to the report not followed by re-reporting the committed results (as docs/study.md
says) fails here, and so does a committed number edited by hand.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from nemo_mmpo.checkout import REPO_ROOT
from nemo_mmpo.study.__main__ import main
from nemo_mmpo.study.check import read_study
from nemo_mmpo.study.comparison import write_study_report
from nemo_mmpo.study.methods import ALL_METHODS, METHODS

RESULTS = REPO_ROOT / "docs" / "results"

#: committed report -> the committed folders whose records it pools
REPORTS = {"study": ("study",), "check": ("check",), "ten": ("study", "check")}


def _same(made: Any, committed: Any, where: str = "") -> None:
    """Equal, floats to 1e-9 relative (a sum's last bits may differ between CPUs' numpy)."""
    if isinstance(committed, dict):
        assert isinstance(made, dict) and made.keys() == committed.keys(), where
        for key in committed:
            _same(made[key], committed[key], f"{where}.{key}")
    elif isinstance(committed, list):
        assert isinstance(made, list) and len(made) == len(committed), where
        for index, (one, other) in enumerate(zip(made, committed, strict=True)):
            _same(one, other, f"{where}[{index}]")
    elif isinstance(committed, float) and isinstance(made, float):
        assert math.isclose(made, committed, rel_tol=1e-9, abs_tol=1e-12), where
    else:
        assert made == committed, where


def _read(path: Path) -> Any:
    return json.loads(path.read_text())


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_a_committed_report_is_what_its_committed_records_give(tmp_path, name):
    """``study report --runs-from`` copies of the committed records writes the committed
    study.json (every run, interval, p-value and verdict)."""
    copies = []
    for source in REPORTS[name]:
        shutil.copytree(RESULTS / source / "records", tmp_path / source / "records")
        copies.append(tmp_path / source)
    out = tmp_path / f"{name}-report"
    write_study_report(out, tuple(copies))
    _same(read_study(out), read_study(RESULTS / name))
    assert (out / "study_paired_pass_at_k.png").is_file()


def test_the_check_seeds_are_checked_against_the_committed_study(tmp_path, capsys):
    """``nemo-mmpo study check --out <seeds 5-9> --against docs/results/study``: the committed
    check.json again, from the committed folders alone (the reference folder is only read)."""
    check = tmp_path / "check"
    shutil.copytree(RESULTS / "check", check)
    (check / "check.json").unlink()
    assert main(["check", "--out", str(check), "--against", str(RESULTS / "study")]) == 0
    assert "wrote" in capsys.readouterr().out
    _same(_read(check / "check.json"), _read(RESULTS / "check" / "check.json"))


def test_the_committed_runs_are_the_seeds_and_methods_the_docs_name():
    """Seeds 0-4 with every method and ablation, seeds 5-9 with the five methods, 300 steps."""
    runs = {name: read_study(RESULTS / name)["runs"] for name in ("study", "check")}
    study = {(run["method"], run["seed"]) for run in runs["study"]}
    check = {(run["method"], run["seed"]) for run in runs["check"]}
    assert study == {(method, seed) for method in ALL_METHODS for seed in range(5)}
    assert check == {(method, seed) for method in METHODS for seed in range(5, 10)}
    assert {run["steps"] for run in runs["study"] + runs["check"]} == {300}
