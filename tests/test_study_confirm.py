"""The confirmatory study's registered plan and its analysis, fixed before any run (issue 48).

The committed plan (``docs/results/confirmatory/plan.md``) agrees with the code: its block
parses, its power table is what ``study power`` prints from the committed records, its run
command names its seeds, and no committed record, test, example or script used those seeds.
The analysis (``study confirm``) gives each verdict kind on hand-made records, refuses records
that are not the plan's, and runs on the pilot's real records."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest
from study_records import run_record

from nemo_mmpo.checkout import REPO_ROOT
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.study.__main__ import main
from nemo_mmpo.study.comparison import finished_runs, write_records
from nemo_mmpo.study.confirm import (
    FIGURE,
    NULL,
    RESOLVED_AGAINST,
    RESOLVED_FOR,
    analyse,
    seed_ranges,
)
from nemo_mmpo.study.plan import PLAN, parse_plan, read_plan
from nemo_mmpo.study.power import power_table

RESULTS = REPO_ROOT / "docs" / "results"
PLAN_TEXT = (REPO_ROOT / PLAN).read_text()


def test_the_committed_plan_is_three_final_step_claims_on_forty_new_seeds():
    plan = read_plan(REPO_ROOT / PLAN)
    assert (plan.method, plan.other, plan.steps, plan.alpha) == ("mmpo", "grpo", 300, 0.05)
    assert plan.seeds == tuple(range(100, 140)) and plan.reserve_seeds == tuple(range(140, 150))
    assert [(claim.metric, claim.sign) for claim in plan.primary] == [
        ("gini@0.0", -1),
        ("never_solved", -1),
        ("pass@16 - pass@1", 1),
    ]
    assert {claim.checkpoint for claim in plan.primary} == {"final"}
    assert not plan.amendments and "## Amendments\n\nNone." in PLAN_TEXT


def test_the_plans_power_table_is_the_codes_on_the_committed_records():
    plan = read_plan(REPO_ROOT / PLAN)
    arguments = plan.power
    command = (
        f"python -m nemo_mmpo.study power --records {' '.join(arguments['records'])} "
        f"--claims {' '.join(map(str, arguments['claims']))} --planned {arguments['planned']}"
    )
    assert command in PLAN_TEXT
    table = PLAN_TEXT.split("checks it -->\n\n")[1].split("<!-- end of the power table -->")[0]
    records = [REPO_ROOT / folder for folder in arguments["records"]]
    assert table == power_table(records, tuple(arguments["claims"]), arguments["planned"])


def test_the_plans_commands_name_its_seeds_and_methods():
    plan = read_plan(REPO_ROOT / PLAN)
    first, last = re.search(r"\$\(seq (\d+) (\d+)\)", PLAN_TEXT).groups()
    assert tuple(range(int(first), int(last) + 1)) == plan.seeds
    assert f"--methods {plan.other} {plan.method}" in PLAN_TEXT
    assert "python -m nemo_mmpo.study confirm --records docs/results/confirmatory" in PLAN_TEXT


TRAINING_SEED = re.compile(r'cpu_backend\.seed=(\d+)|--seeds((?: \d+)+)|"seed": ?(\d+)|seed(\d+)\.')


def test_the_plans_seeds_were_never_used():
    """Not in any committed study's records, nor named as a training seed by a test, example,
    script, benchmark or document (the plan's own folder aside)."""
    planned = set(read_plan(REPO_ROOT / PLAN).seeds + read_plan(REPO_ROOT / PLAN).reserve_seeds)
    recorded = {
        json.loads(path.read_text())["seed"]
        for path in RESULTS.glob("*/records/*.json")
        if path.parent.parent.name != "confirmatory"
    }
    assert recorded == set(range(10)) and not recorded & planned
    folders = ("tests", "examples", "scripts", "slurm", "benchmarks", "docs", "nemo_mmpo")
    for folder in folders:
        for path in (REPO_ROOT / folder).rglob("*"):
            if path.suffix not in (".py", ".md", ".sh", ".yaml", ".json") or "confirmatory" in (
                str(path)
            ):
                continue
            for match in TRAINING_SEED.finditer(path.read_text(errors="replace")):
                named = {int(seed) for group in match.groups() if group for seed in group.split()}
                assert not named & planned, (path, match.group(0))


def _plan_text(seeds: list[int], amendment: dict | None = None, **changes) -> str:
    """A plan like the committed one on ``seeds``, its primary claims those the hand-made
    records give: a lower Gini, fewer never solved, and pass@4's lead over pass@1's."""
    block = {
        "registered": "2026-11-27",
        "method": "mmpo",
        "other": "grpo",
        "seeds": seeds,
        "reserve_seeds": [90, 91],
        "steps": 300,
        "alpha": 0.05,
        "primary": [
            {"text": "more even", "metric": "gini@0.0", "sign": -1, "checkpoint": "final"},
            {
                "text": "fewer never solved",
                "metric": "never_solved",
                "sign": -1,
                "checkpoint": "final",
            },
            {"text": "lead grows", "metric": "pass@4 - pass@1", "sign": 1, "checkpoint": "final"},
        ],
        "secondary": [
            {"text": "average higher", "metric": "average", "sign": 1, "checkpoint": "selected"}
        ],
        "power": {},
    } | changes
    text = f"# plan\n\n```json confirmatory-plan\n{json.dumps(block, indent=1)}\n```\n"
    if amendment:
        text += f"\n```json confirmatory-amendment\n{json.dumps(amendment)}\n```\n"
    return text


#: Per seed: MMPO's accuracy shift (alternating: no lead, no lead growth) and its never solved
#: minus GRPO's (+3 or +4: against the paper). MMPO's success is GRPO's squeezed to 0.8 of
#: its spread: a Gini lower on every seed (for the paper).
SHIFTS = [0.010, -0.010, 0.012, -0.012, 0.008, -0.008, 0.011, -0.011]
MORE_NEVER_SOLVED = [3, 4, 3, 4, 3, 4, 3, 4]


def _records(seeds: list[int]) -> list[dict]:
    base = np.linspace(0.3, 0.6, 24)
    squeezed = base.mean() + 0.8 * (base - base.mean())
    runs = []
    for seed, shift, more in zip(seeds, SHIFTS, MORE_NEVER_SOLVED, strict=True):
        runs.append(run_record("grpo", seed, base.tolist(), 10))
        runs.append(run_record("mmpo", seed, (squeezed + shift).tolist(), 10 + more))
    return [run | {"steps": 300, "final_step": 300, "selected_step": 200} for run in runs]


def test_each_verdict_kind_on_hand_made_records():
    seeds = list(range(8))
    result = analyse(_records(seeds), parse_plan(_plan_text(seeds)))
    gini, never, growth = result["primary"]
    assert gini["verdict"] == RESOLVED_FOR and gini["mean"] < 0 and gini["p_holm"] < 0.05
    assert never["verdict"] == RESOLVED_AGAINST and never["mean"] == pytest.approx(3.5)
    assert growth["verdict"] == NULL and growth["mean"] == pytest.approx(0.0, abs=1e-12)
    # a null rules out what its family-wise interval excludes on the paper's side
    assert growth["family_low"] < 0 < growth["family_high"] == growth["rules_out"]
    assert growth["family_low"] < growth["low"] and growth["high"] < growth["family_high"]
    assert {row["n"] for row in result["primary"]} == {8}
    ordered = sorted(row["p"] for row in result["primary"])
    assert min(row["p_holm"] for row in result["primary"]) == pytest.approx(3 * ordered[0])
    (average,) = result["secondary"]
    assert "verdict" not in average and "p_holm" not in average and average["n"] == 8


def test_the_analysis_refuses_records_that_are_not_the_plans():
    seeds = list(range(8))
    plan = parse_plan(_plan_text(seeds))
    runs = _records(seeds)
    for wrong, message in (
        ([run for run in runs if run["seed"] != 7], r"seeds missing \[7\]"),
        ([run for run in runs if (run["seed"], run["method"]) != (3, "mmpo")], "missing"),
        (_records(list(range(1, 9))), r"not in the plan \[8\]"),
        ([run | {"steps": 200} for run in runs], "the plan runs 300"),
    ):
        with pytest.raises(MMPOInputError, match=message):
            analyse(wrong, plan)


def test_an_amendment_replaces_a_seed_by_a_reserve_and_nothing_else():
    seeds = list(range(8))
    why = {"date": "2026-12-01", "why": "seed 3's warm start never reached the band"}
    plan = parse_plan(_plan_text(seeds, why | {"replace_seeds": {"3": 90}}))
    assert plan.seeds == (0, 1, 2, 90, 4, 5, 6, 7) and plan.amendments[0]["date"] == "2026-12-01"
    assert seed_ranges(list(plan.seeds)) == "0-2, 90, 4-7"
    for bad in ({"replace_seeds": {"3": 95}}, {"replace_seeds": {"9": 90}}, {"date": ""}):
        with pytest.raises(MMPOInputError):
            parse_plan(_plan_text(seeds, why | bad))


def test_a_plan_is_refused_unless_its_family_is_small_and_final():
    claim = {"text": "x", "metric": "average", "sign": 1, "checkpoint": "final"}
    for changes in (
        {"primary": [claim] * 5},
        {"primary": [claim | {"checkpoint": "selected"}]},
        {"primary": [claim | {"sign": 0}]},
        {"primary": [claim | {"metric": "accuracy"}]},
        {"method": "ppo"},
        {"reserve_seeds": [0]},
    ):
        with pytest.raises(MMPOInputError):
            parse_plan(_plan_text(list(range(8)), **changes))
    with pytest.raises(MMPOInputError, match="blocks"):
        parse_plan(_plan_text([0, 1]) * 2)


def test_the_confirm_command_writes_the_report_json_and_figure(tmp_path, capsys):
    seeds = list(range(8))
    plan = tmp_path / "plan.md"
    plan.write_text(_plan_text(seeds))
    write_records(tmp_path / "study", _records(seeds))
    out = tmp_path / "out"
    args = ["confirm", "--plan", str(plan), "--records", str(tmp_path / "study"), "--out", str(out)]
    assert main(args) == 0
    assert "wrote" in capsys.readouterr().out
    report = (out / "report.md").read_text()
    for text in ("**resolved for the paper**", "**resolved against it**", "**null**: rules out"):
        assert text in report
    assert "exploratory" in report and (out / FIGURE).is_file()
    numbers = json.loads((out / "report.json").read_text())
    assert [row["verdict"] for row in numbers["primary"]] == [RESOLVED_FOR, RESOLVED_AGAINST, NULL]


def test_the_plans_analysis_runs_on_the_pilots_records():
    """The committed plan's claims on the pilot's seeds 0-9 (its real records): every metric
    exists, the means are the pilot report's, and ten seeds resolve none of the three."""
    plan = dataclasses.replace(read_plan(REPO_ROOT / PLAN), seeds=tuple(range(10)))
    runs = finished_runs([RESULTS / "study", RESULTS / "check"], ("mmpo", "grpo"))
    result = analyse(runs, plan)
    ten = json.loads((RESULTS / "ten" / "study.json").read_text())["final"]
    paired = ten["paired_difference_from_grpo"]["mmpo"]
    gini, never, growth = result["primary"]
    assert gini["mean"] == pytest.approx(paired["gini@0.0"]["mean"])
    assert never["mean"] == pytest.approx(paired["never_solved"]["mean"])
    assert growth["mean"] == pytest.approx(paired["pass@16"]["mean"] - paired["pass@1"]["mean"])
    assert {row["verdict"] for row in result["primary"]} == {NULL}
    assert len(result["secondary"]) == len(plan.secondary)
