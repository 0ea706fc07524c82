"""``nemo-mmpo study check`` on studies aggregated from hand-made run records (no NeMo-RL): a
study checked against itself reproduces everything, a shifted method and a flipped paired
difference are found and listed, and a folder without a report gets an error naming the fix."""

from __future__ import annotations

import json

import numpy as np
import pytest
from study_records import run_record

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.study.__main__ import main
from nemo_mmpo.study.check import compare_studies, write_check
from nemo_mmpo.study.comparison import aggregate


def _study(seeds: range, shift: dict[str, float] | None = None) -> dict:
    """A study's ``study.json`` numbers; ``shift`` adds to a method's per-problem success."""
    generator = np.random.default_rng(seeds.start)
    base = {seed: generator.uniform(0.1, 0.8, size=24) for seed in seeds}
    records = []
    for seed in seeds:
        for offset, method in enumerate(("grpo", "maxrl", "mmpo")):
            noise = generator.normal(0, 0.01, size=24)
            success = base[seed] + 0.002 * offset + noise + (shift or {}).get(method, 0.0)
            success = np.clip(success, 0, 1).round(3).tolist()
            records.append(run_record(method, seed, success, int(seed % 3)))
    return {which: aggregate(records, which) for which in ("selected", "final")}


def test_a_study_checked_against_itself_reproduces_every_number():
    study = _study(range(5))
    result = compare_studies(study, study)
    assert result["compared"] > 0 and result["inside"] == result["compared"]
    assert result["verdicts_agree"] == result["verdicts_compared"] > 0
    assert result["verdicts_flipped"] == 0
    assert result["claims_agree"] == result["claims_compared"] > 0


def test_a_shifted_method_and_a_flipped_difference_are_found():
    reference = _study(range(5), shift={"mmpo": 0.05})
    check = _study(range(5, 10), shift={"mmpo": -0.05})
    result = compare_studies(reference, check)
    outside = {
        (row["table"], row["method"], row["metric"])
        for row in result["rows"]
        if not row["inside"] and row["checkpoint"] == "selected"
    }
    assert ("per method", "mmpo", "average") in outside
    assert ("paired_difference_from_grpo", "mmpo", "average") in outside
    resolved = {"above zero", "below zero"}
    flipped = [
        row
        for row in result["rows"]
        if {row.get("reference_verdict"), row.get("check_verdict")} == resolved
    ]
    assert ("paired_difference_from_grpo", "mmpo", "average") in {
        (row["table"], row["method"], row["metric"]) for row in flipped
    }
    assert result["verdicts_flipped"] == len(flipped) > 0
    claims = {
        (row["checkpoint"], row["comparison"], row["metric"]): row for row in result["claims"]
    }
    lead = claims["selected", "MMPO (T=4) minus GRPO", "average"]
    assert (lead["reference_verdict"], lead["check_verdict"]) == ("above zero", "below zero")
    assert result["claims_flipped"] > 0
    for row in result["claims"]:  # after Holm, never a verdict the raw interval does not give
        for study in ("reference", "check"):
            if row[f"{study}_verdict"] != "includes zero":
                assert row[f"{study}_verdict"] == row[f"{study}_raw_verdict"]
    assert ("per method", "grpo", "average") not in outside  # GRPO did not move


def test_the_command_writes_check_files_and_refuses_a_folder_without_a_report(tmp_path, capsys):
    for name, seeds in (("reference", range(5)), ("check", range(5, 10))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "study.json").write_text(json.dumps(_study(seeds)))
    args = ["check", "--out", str(tmp_path / "check"), "--against", str(tmp_path / "reference")]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "lie inside the reference's 95% interval" in printed
    assert "after Holm's correction" in printed
    saved = json.loads((tmp_path / "check" / "check.json").read_text())
    assert saved["compared"] == len(saved["rows"]) > 0
    assert (
        "## Means outside the reference's interval" in (tmp_path / "check" / "check.md").read_text()
    )
    older = _study(range(5))  # a study.json from before the p-values: re-run the report
    for entry in older["selected"]["paired_difference_from_grpo"]["mmpo"].values():
        del entry["p"]
    (tmp_path / "older").mkdir()
    (tmp_path / "older" / "study.json").write_text(json.dumps(older))
    with pytest.raises(MMPOInputError, match="study report --out"):
        write_check(tmp_path / "reference", tmp_path / "older")
    (tmp_path / "empty").mkdir()
    with pytest.raises(MMPOInputError, match="study report --out"):
        write_check(tmp_path / "reference", tmp_path / "empty")
