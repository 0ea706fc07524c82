"""``nemo-mmpo study`` (or ``python -m nemo_mmpo.study``): the paper's comparison on a laptop.

    nemo-mmpo study run --out results/study              # 5 methods x 5 seeds, 300 steps
    nemo-mmpo study run --out results/study --ablations  # and T, U and the unbiased estimator
    nemo-mmpo study run --out results/study_quick --quick   # the same pipeline, minutes
    nemo-mmpo study report --out results/study           # study.md, study.json, figures
    nemo-mmpo study report --out results/ten --runs-from results/study results/check \
        --methods grpo passk maxrl dmpo mmpo              # ten seeds pooled, no ablations
    nemo-mmpo study check --out results/check --against results/study  # reproduced?
    nemo-mmpo study power --records docs/results/study docs/results/check --claims 3 4 19
    nemo-mmpo study confirm --records results/confirmatory --out results/confirmatory

Runs need NeMo-RL (its environment, as the tiny run: ``bash scripts/tiny_run.sh`` builds it);
``report`` and ``check`` need only the files the runs wrote.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from nemo_mmpo.errors import handle
from nemo_mmpo.study.methods import ABLATIONS, ALL_METHODS


def main(argv: list[str] | None = None, prog: str = "python -m nemo_mmpo.study") -> int:
    from nemo_mmpo.study.runner import QUICK, StudyPlan

    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="train and evaluate methods x seeds (resumable)")
    run.add_argument("--out", required=True, help="the study's folder")
    run.add_argument("--quick", action="store_true", help=f"{QUICK}")
    run.add_argument("--methods", nargs="+", choices=list(ALL_METHODS), default=None)
    run.add_argument("--ablations", action="store_true", help="add " + ", ".join(ABLATIONS))
    run.add_argument("--seeds", nargs="+", type=int, default=None)
    run.add_argument("--steps", type=int, default=None)
    run.add_argument("--eval-every", type=int, default=None)
    run.add_argument("--samples", type=int, default=None, help="per held-out problem")
    run.add_argument("--no-report", action="store_true", help="do not write the report after")
    report = commands.add_parser("report", help="tables and figures from the finished runs")
    report.add_argument("--out", required=True, help="the study's folder")
    report.add_argument(
        "--runs-from",
        nargs="+",
        default=(),
        metavar="STUDY",
        help="also pool the finished runs of these study folders (e.g. other seeds)",
    )
    report.add_argument(
        "--methods", nargs="+", choices=list(ALL_METHODS), default=None, help="only these"
    )
    check = commands.add_parser(
        "check", help="does a study on other seeds reproduce a reference study's numbers?"
    )
    check.add_argument("--out", required=True, help="the second study's folder (reported)")
    check.add_argument("--against", required=True, help="the reference study's folder")
    power = commands.add_parser(
        "power", help="seeds a paired, Holm-corrected claim needs, from a pilot's records"
    )
    power.add_argument("--records", nargs="+", required=True, metavar="STUDY")
    power.add_argument(
        "--claims", nargs="+", type=int, default=[3], help="family sizes m (each claim at 0.05/m)"
    )
    power.add_argument("--planned", type=int, default=40, help="seeds the plan would run")
    confirm = commands.add_parser(
        "confirm", help="the registered plan's analysis of its runs (verdicts, report, figure)"
    )
    confirm.add_argument(
        "--plan",
        default=None,
        help="the registered plan (default: docs/results/confirmatory/plan.md)",
    )
    confirm.add_argument("--records", nargs="+", required=True, metavar="STUDY")
    confirm.add_argument("--out", required=True, help="where report.md and report.json go")
    args, extra = parser.parse_known_args(argv)
    if args.command in ("power", "confirm") and extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "power":
        from nemo_mmpo.study.power import power_table

        print(power_table(args.records, tuple(args.claims), args.planned), end="")
        return 0
    if args.command == "confirm":
        from nemo_mmpo.study.confirm import write_confirmation
        from nemo_mmpo.study.plan import PLAN

        path = write_confirmation(args.plan or PLAN, args.records, args.out)
        print(path.read_text().split("\n## Secondary")[0].strip())
        print(f"wrote {path}")
        return 0
    if args.command == "check":
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        from nemo_mmpo.study.check import write_check

        path = write_check(args.against, args.out)
        print(path.read_text().split("\n## ")[0].strip())
        print(f"wrote {path}")
        return 0
    if args.command == "report":
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        from nemo_mmpo.study.comparison import write_study_report

        methods = tuple(args.methods) if args.methods else None
        print(f"wrote {write_study_report(args.out, tuple(args.runs_from), methods)}")
        return 0
    plan = QUICK if args.quick else StudyPlan()
    changes = {
        key: value
        for key, value in (
            ("methods", tuple(args.methods) if args.methods else None),
            ("seeds", tuple(args.seeds) if args.seeds else None),
            ("steps", args.steps),
            ("eval_every", args.eval_every),
            ("samples", args.samples),
        )
        if value is not None
    }
    if args.ablations:
        changes["methods"] = (*changes.get("methods", plan.methods), *ABLATIONS)
    plan = dataclasses.replace(plan, **changes, extra=tuple(extra))
    from nemo_mmpo.study.runner import run_study

    run_study(Path(args.out), plan)
    if not args.no_report:
        from nemo_mmpo.study.comparison import write_study_report

        print(f"wrote {write_study_report(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(handle(main, None, "python -m nemo_mmpo.study"))
