"""``nemo-mmpo study report``: the study's numbers and tables, laid out like the paper's.

For every run (method x seed) it reads the in-loop evaluations (``logs/evaluation/step_<N>``)
and takes two checkpoints: the one the paper's rule selects (the best average over the steps
evaluated) and the final one. From their rollouts, with the project's metric code:

- Table 1: accuracy (avg@n) per difficulty stratum and their average, mean and 95% interval
  over seeds (Student's t);
- pass@k (k = 1, 4, 8, 16) over the held-out problems;
- Gini of per-problem success for each alpha of the paper's filter (the filter common to the
  methods of a seed, as in ``nemo-mmpo eval report``), never-solved counts, the first-success
  distribution;
- each method's paired difference from GRPO, and MMPO's from each other method (same seed,
  same warm start): accuracy, pass@k, never solved and Gini, with a 95% interval over seeds
  calibrated from two seeds on (:func:`nemo_mmpo.study.intervals.paired_bounds`: the wider
  of the paired t interval and the expanded percentile bootstrap) and the paired t-test's
  p-value;
- the claims the study reads (:data:`nemo_mmpo.study.claims.CLAIMS`), each comparison with
  its raw interval and its verdict after Holm's correction over the family;
- with fewer than five seeds, what so few seeds can and cannot tell (:func:`seeds_note`);
- figures: training reward (mean and band over seeds), pass@k, Lorenz curves, first success.

``study.md``, ``study.json`` (every number) and each run's record (``records/``: what the
report read, so that it can be made again with no run folder) go to the study folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from nemo_mmpo.cpu.rig.task import STRATA, Problem
from nemo_mmpo.cpu.spread.curves import reward_curve
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.eval.metrics import (
    TABLE_PASS_AT,
    first_success_distribution,
    gini_by_method,
    pass_at_k,
)
from nemo_mmpo.eval.protocol import read_steps
from nemo_mmpo.eval.report import ALPHAS
from nemo_mmpo.eval.rollouts import load_run
from nemo_mmpo.io import markdown_table, write_text_atomic
from nemo_mmpo.study.claims import claim_summary, family_verdicts
from nemo_mmpo.study.figures import figures
from nemo_mmpo.study.intervals import interval, paired_interval, t_975
from nemo_mmpo.study.methods import ALL_METHODS, PROPOSED, REFERENCE


def checkpoint_numbers(rollouts: Path) -> dict[str, Any]:
    """One evaluated checkpoint: accuracy per stratum, pass@k, never solved, first success,
    and per-problem success (for Gini and Lorenz)."""
    counts = load_run([rollouts])
    success = counts.correct / counts.samples
    strata: dict[str, list[float]] = {name: [] for name in STRATA}
    for (_, problem_id), value in zip(counts.keys, success, strict=True):
        a, b = (int(part) for part in problem_id.split("+"))
        strata[Problem(a, b).stratum].append(float(value))
    accuracy = {name: float(np.mean(values)) for name, values in strata.items() if values}
    samples = int(counts.samples.min())
    return {
        "accuracy": accuracy,
        "average": float(np.mean(list(accuracy.values()))),
        "pass_at_k": {
            f"pass@{k}": float(pass_at_k(counts.samples, counts.correct, k).mean())
            for k in TABLE_PASS_AT
            if k <= samples
        },
        "never_solved": int((counts.correct == 0).sum()),
        "problems": len(counts.keys),
        "first_success": [
            float(value)
            for value in first_success_distribution(counts.samples, counts.correct)["pmf"]
        ],
        "success": {key[1]: float(value) for key, value in zip(counts.keys, success, strict=True)},
    }


def read_run(folder: Path) -> dict[str, Any]:
    """A finished run's selected and final checkpoints (see the module docstring)."""
    record = json.loads((folder / "finished.json").read_text())
    evaluation = folder / "logs" / "evaluation"
    steps = read_steps(evaluation)
    if not steps:
        raise MMPOInputError(f"{folder}: no evaluation was written ({evaluation})")
    selected = max(steps.values(), key=lambda entry: (entry["average"], -entry["step"]))["step"]
    final = max(steps)
    return {
        **record,
        "folder": str(folder),
        "reward": [value for _, value in reward_curve(folder / "logs")],
        "selected_step": selected,
        "final_step": final,
        "selected": checkpoint_numbers(evaluation / f"step_{selected}.jsonl"),
        "final": checkpoint_numbers(evaluation / f"step_{final}.jsonl"),
    }


def _gini_by_seed(runs: list[dict], which: str) -> dict[str, dict[str, dict[int, float]]]:
    """``{method: {alpha: {seed: Gini}}}`` with the common filter of each seed's methods."""
    result: dict[str, dict[str, dict[int, float]]] = {}
    seeds = sorted({run["seed"] for run in runs})
    for seed in seeds:
        of_seed = {run["method"]: run[which]["success"] for run in runs if run["seed"] == seed}
        shared = sorted(set.intersection(*(set(values) for values in of_seed.values())))
        vectors = {
            method: np.array([values[key] for key in shared]) for method, values in of_seed.items()
        }
        for alpha in ALPHAS:
            gini = gini_by_method(vectors, alpha)
            for method in vectors:
                result.setdefault(method, {}).setdefault(str(alpha), {})[seed] = float(
                    gini["methods"][method]["gini"]
                )
    return result


#: The Gini columns of the paired tables (the paper's unfiltered one and a filtered one).
PAIRED_GINI_ALPHAS = (0.0, 0.1)


def _pair_gini(mine: dict[str, Any], theirs: dict[str, Any], alpha: float) -> float:
    """Gini of ``mine`` minus Gini of ``theirs`` on the filter common to the two alone."""
    shared = sorted(set(mine["success"]) & set(theirs["success"]))
    vectors = {
        name: np.array([row["success"][key] for key in shared])
        for name, row in (("mine", mine), ("theirs", theirs))
    }
    gini = gini_by_method(vectors, alpha)["methods"]
    return float(gini["mine"]["gini"] - gini["theirs"]["gini"])


def paired_difference(
    runs: list[dict[str, Any]], which: str, method: str, other: str
) -> dict[str, dict[str, float]] | None:
    """``method`` minus ``other`` on the seeds both ran (same seed: same warm start and data
    order), every metric with :func:`nemo_mmpo.study.intervals.paired_interval` over those
    seeds; None if none is shared.

    Accuracy and pass@k are fractions, never solved a count, Gini a coefficient, computed on
    the alpha filter common to the two methods (so a pair's numbers do not depend on which
    other methods the study ran; the Gini table's filter is common to all of a seed's).
    """
    of_method = {run["seed"]: run[which] for run in runs if run["method"] == method}
    of_other = {run["seed"]: run[which] for run in runs if run["method"] == other}
    seeds = sorted(set(of_method) & set(of_other))
    if not seeds:
        return None
    pairs = [(of_method[seed], of_other[seed]) for seed in seeds]
    return {
        "average": paired_interval([mine["average"] - theirs["average"] for mine, theirs in pairs]),
        **{
            key: paired_interval(
                [mine["pass_at_k"][key] - theirs["pass_at_k"][key] for mine, theirs in pairs]
            )
            for key in pairs[0][0]["pass_at_k"]
        },
        "never_solved": paired_interval(
            [float(mine["never_solved"] - theirs["never_solved"]) for mine, theirs in pairs]
        ),
        **{
            f"gini@{alpha}": paired_interval(
                [_pair_gini(mine, theirs, alpha) for mine, theirs in pairs]
            )
            for alpha in PAIRED_GINI_ALPHAS
        },
    }


def aggregate(runs: list[dict[str, Any]], which: str) -> dict[str, Any]:
    """Every table's numbers for the ``selected`` or ``final`` checkpoints."""
    methods = [name for name in ALL_METHODS if any(run["method"] == name for run in runs)]
    by_method = {name: [run for run in runs if run["method"] == name] for name in methods}
    numbers: dict[str, Any] = {"methods": {}}
    ginis = _gini_by_seed(runs, which)
    for name, of_method in by_method.items():
        rows = [run[which] for run in of_method]
        numbers["methods"][name] = {
            "seeds": [run["seed"] for run in of_method],
            "accuracy": {
                stratum: interval([row["accuracy"][stratum] for row in rows])
                for stratum in STRATA
                if all(stratum in row["accuracy"] for row in rows)
            },
            "average": interval([row["average"] for row in rows]),
            "pass_at_k": {
                key: interval([row["pass_at_k"][key] for row in rows])
                for key in rows[0]["pass_at_k"]
            },
            "never_solved": interval([row["never_solved"] for row in rows]),
            "gini": {
                alpha: interval(list(by_seed.values())) for alpha, by_seed in ginis[name].items()
            },
            "first_success": [
                float(np.mean(column))
                for column in zip(*(row["first_success"] for row in rows), strict=True)
            ],
        }
    for key, reference, flip in (
        ("paired_difference_from_grpo", REFERENCE, False),
        ("paired_difference_of_mmpo", PROPOSED, True),
    ):
        if reference not in by_method:
            continue
        numbers[key] = {}
        for name in by_method:
            if name == reference:
                continue
            method, other = (reference, name) if flip else (name, reference)
            difference = paired_difference(runs, which, method, other)
            if difference is not None:
                numbers[key][name] = difference
    numbers["claims"] = family_verdicts(numbers)
    return numbers


def _cell(entry: dict[str, float], scale: float = 100.0, digits: int = 1) -> str:
    if entry["n"] < 2:
        return f"{scale * entry['mean']:.{digits}f}"
    return f"{scale * entry['mean']:.{digits}f} ± {scale * entry['half_width']:.{digits}f}"


def _tables(numbers: dict[str, Any], title: str) -> list[str]:
    methods = numbers["methods"]
    strata = [name for name in STRATA if all(name in row["accuracy"] for row in methods.values())]
    lines = [
        f"### {title}",
        "",
        "Accuracy (avg@n, %) per difficulty stratum, mean ± 95% interval over seeds:",
        "",
    ]
    lines += markdown_table(
        ["method", "seeds", *strata, "average"],
        (
            [
                ALL_METHODS[name].label,
                len(row["seeds"]),
                *(_cell(row["accuracy"][stratum]) for stratum in strata),
                _cell(row["average"]),
            ]
            for name, row in methods.items()
        ),
    )
    keys = list(next(iter(methods.values()))["pass_at_k"])
    lines += ["", "pass@k (%):", ""]
    lines += markdown_table(
        ["method", *keys, "never solved (of the held-out problems)"],
        (
            [
                ALL_METHODS[name].label,
                *(_cell(row["pass_at_k"][key]) for key in keys),
                _cell(row["never_solved"], 1.0),
            ]
            for name, row in methods.items()
        ),
    )
    alphas = list(next(iter(methods.values()))["gini"])
    lines += ["", "Gini of per-problem success (lower: more even), by the filter alpha:", ""]
    lines += markdown_table(
        ["method", *(f"α = {alpha}" for alpha in alphas)],
        (
            [ALL_METHODS[name].label, *(_cell(row["gini"][alpha], 1.0, 3) for alpha in alphas)]
            for name, row in methods.items()
        ),
    )
    for key, heading in (
        (
            "paired_difference_from_grpo",
            "Paired difference from GRPO (method minus GRPO, same seed and warm start; "
            "percentage points, never solved in problems, Gini in coefficient units; 95% "
            "interval over seeds, the wider of the paired t interval and the expanded "
            "percentile bootstrap; each interval alone, no correction for how many are read):",
        ),
        (
            "paired_difference_of_mmpo",
            f"Paired difference of {ALL_METHODS[PROPOSED].label} from each other method "
            "(MMPO minus the method, same units; positive accuracy and negative never solved "
            "and Gini favour MMPO):",
        ),
    ):
        paired = numbers.get(key) or {}
        if paired:
            lines += ["", heading, ""]
            lines += _paired_table(paired)
    if numbers.get("claims"):
        lines += ["", *_claims_table(numbers["claims"])]
    return [*lines, ""]


def _claims_table(rows: list[dict[str, Any]]) -> list[str]:
    """The claims' family: each comparison's raw interval and verdict beside its verdict
    after Holm's correction over the family (:mod:`nemo_mmpo.study.claims`)."""
    size = rows[0]["family_size"]
    lines = [
        f"The claims, read as one family of {size} paired comparisons (the paper's claims and "
        "the README's observations, `nemo_mmpo/study/claims.py`): each comparison's raw 95% "
        "interval and verdict, and its verdict after Holm's correction over the family "
        "(family-wise error 5%; resolved when the Holm-adjusted paired t-test p-value is "
        "below 0.05 and the raw interval excludes zero):",
        "",
    ]
    table = []
    for claim in dict.fromkeys(row["claim"] for row in rows):
        of_claim = [row for row in rows if row["claim"] == claim]
        summary = claim_summary(of_claim)
        for index, row in enumerate(of_claim):
            scale, digits = display_scale(row["metric"])
            p_values = "-" if row["p"] is None else f"{row['p']:.3f} ({row['p_holm']:.3f})"
            table.append(
                [
                    claim if index == 0 else "",
                    summary if index == 0 else "",
                    f"{row['comparison']} (n = {row['n']})",
                    row["metric"],
                    format_difference(row, scale, digits),
                    row["raw_verdict"],
                    p_values,
                    row["verdict"],
                ]
            )
    header = ["claim", "the claim after Holm", "comparison", "metric"]
    header += ["difference [raw 95% interval]", "raw verdict", "p (Holm-adjusted)", "after Holm"]
    return lines + markdown_table(header, table)


def seeds_note(count: int) -> list[str]:
    """What ``count`` seeds (the fewest any paired difference rests on) can and cannot tell;
    nothing from five seeds on. With n seeds the 95% interval is the mean plus or minus
    ``t_{0.975, n - 1}`` standard errors: 12.7 at two seeds, 4.3 at three, 3.2 at four."""
    if count >= 5:
        return []
    if count < 2:
        return [
            "**One seed: no interval and no verdict.** The tables give each seed's numbers; "
            "whether two methods differ needs two seeds at the very least, five for a "
            "verdict that can resolve a difference of about the seed-to-seed spread.",
            "",
        ]
    t = t_975(count - 1)
    if count == 2:
        return [
            f"**Two seeds: what they can and cannot tell.** They tell that every method "
            "trains and is evaluated, each seed's numbers, and whether the two seeds' "
            "paired differences point the same way (which they do half the time when the "
            "methods do not differ at all). They cannot resolve a difference: a 95% "
            f"interval over two seeds is the mean ± {t:.1f} standard errors, which excludes "
            "zero only when the two seeds' differences agree to within about 15% of each "
            "other. Every paired interval below is that t interval (not the range of the two "
            "seeds); run five seeds or more (`--seeds 0 1 2 3 4`) for a verdict.",
            "",
        ]
    return [
        f"**{count} seeds: few.** A 95% interval over {count} seeds is the mean ± {t:.1f} "
        f"standard errors ({t / 1.96:.1f} times a normal interval's): only differences large "
        "against the seed-to-seed spread resolve; five seeds or more for a verdict on a "
        "difference of about that spread.",
        "",
    ]


def _paired_table(paired: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    keys = list(next(iter(paired.values())))
    header = [key.replace("gini@", "Gini α = ").replace("_", " ") for key in keys]
    return markdown_table(
        ["method", *header],
        (
            [ALL_METHODS[name].label]
            + [format_difference(row[key], *display_scale(key)) for key in keys]
            for name, row in paired.items()
        ),
    )


def display_scale(metric: str) -> tuple[float, int]:
    """Scale and digits a metric is shown with: accuracy and pass@k in points, never solved
    in problems, Gini as a coefficient."""
    if metric.startswith("gini"):
        return 1.0, 3
    if metric == "never_solved":
        return 1.0, 1
    return 100.0, 1


def format_difference(entry: dict[str, float], scale: float, digits: int = 1) -> str:
    """``+mean [+low, +high]`` of a paired difference, scaled (one seed: no interval)."""
    if entry.get("low") is None:
        return f"{scale * entry['mean']:+.{digits}f} (one seed: no interval)"
    mean, low, high = (scale * entry[key] for key in ("mean", "low", "high"))
    return f"{mean:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"


def _fewest_paired_seeds(numbers: dict[str, Any], default: int) -> int:
    """The fewest seeds any paired difference rests on (``default`` if there is none)."""
    counts = [
        entry["n"]
        for key in ("paired_difference_from_grpo", "paired_difference_of_mmpo")
        for row in (numbers.get(key) or {}).values()
        for entry in row.values()
    ]
    return min(counts, default=default)


#: A study folder's run records: ``records/<method>-seed<seed>.json``, each what
#: :func:`read_run` returns (without ``folder``). ``study report`` writes one for every run it
#: reads, so a report can be made again, and checked against, with no run folder (the ones
#: committed under ``docs/results/``).
RECORDS = "records"


def record_path(study: Path, method: str, seed: int) -> Path:
    return study / RECORDS / f"{method}-seed{seed}.json"


def _pool(
    found: list[tuple[dict[str, Any], Path]], methods: tuple[str, ...] | None
) -> dict[tuple[str, int], tuple[dict[str, Any], Path]]:
    """``(method, seed) -> (run, where)``; a method and seed found twice is refused."""
    pooled: dict[tuple[str, int], tuple[dict[str, Any], Path]] = {}
    for run, where in found:
        if methods is not None and run["method"] not in methods:
            continue
        key = (run["method"], run["seed"])
        if key in pooled:
            raise MMPOInputError(
                f"method {key[0]!r} seed {key[1]} finished in both {pooled[key][1]} and "
                f"{where}: pool studies with different seeds (or drop one folder)"
            )
        pooled[key] = (run, where)
    return pooled


def finished_runs(
    studies: list[Path], methods: tuple[str, ...] | None = None
) -> list[dict[str, Any]]:
    """Every finished run under ``study/runs`` of each study folder (of ``methods`` only, when
    given), pooled, then every run record under ``study/records`` (:data:`RECORDS`) of a run
    no folder holds; a method and seed finished in two folders (or recorded in two) is refused
    (pooling it twice would count one seed twice)."""
    folders = [
        path.parent for study in studies for path in (study / "runs").glob("*/finished.json")
    ]
    from_runs = _pool([(read_run(folder), folder) for folder in sorted(folders)], methods)
    recorded = [
        (json.loads(path.read_text()), path)
        for study in studies
        for path in sorted((study / RECORDS).glob("*.json"))
    ]
    from_records = _pool(
        [(run, path) for run, path in recorded if (run["method"], run["seed"]) not in from_runs],
        methods,
    )
    runs = [run for run, _ in from_runs.values()] + [run for run, _ in from_records.values()]
    if not runs:
        searched = ", ".join(str(study / "runs") for study in studies)
        which = f" of {', '.join(methods)}" if methods else ""
        raise MMPOInputError(
            f"{searched} hold no finished run{which} (nor {RECORDS}/ a run record): run "
            "`nemo-mmpo study run` first"
        )
    return runs


def write_records(out: Path, runs: list[dict[str, Any]]) -> None:
    """Each run's record into ``out/records`` (atomically; ``folder`` left out: it names a
    path on the machine that ran it)."""
    for run in runs:
        record = {key: value for key, value in run.items() if key != "folder"}
        path = record_path(out, run["method"], run["seed"])
        write_text_atomic(path, json.dumps(record, separators=(",", ":")) + "\n")


def runs_of(study: Path, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs read from ``study``'s own run folders (``study/runs/*``): the ones whose
    records a report of ``study`` writes. A run read from a record is recorded already, and a
    run of a pooled folder (``--runs-from``) is that folder's to record: were its record
    written into ``study`` too, the same pooled report made again would find each such run in
    two folders and refuse it."""
    own = (study / "runs").resolve()
    return [run for run in runs if "folder" in run and Path(run["folder"]).resolve().parent == own]


def write_study_report(
    out: str | Path,
    runs_from: tuple[str | Path, ...] = (),
    methods: tuple[str, ...] | None = None,
) -> Path:
    """``study.md``, ``study.json`` and the figures in ``out`` for every finished run (of
    ``methods``, when given) under ``out`` and under each folder of ``runs_from`` (other
    studies, pooled: other seeds of the same methods, or other methods), and the record of
    each run of ``out``'s own run folders into ``out/records`` (a pooled folder is only read)."""
    out = Path(out)
    runs = finished_runs([out, *(Path(folder) for folder in runs_from)], methods)
    write_records(out, runs_of(out, runs))
    numbers = {
        "selected": aggregate(runs, "selected"),
        "final": aggregate(runs, "final"),
        "runs": [
            {
                key: run[key]
                for key in (
                    "method",
                    "seed",
                    "steps",
                    "selected_step",
                    "final_step",
                    "seconds",
                    "folder",  # where the run was read; absent for a run read from its record
                )
                if key in run
            }
            | {"selected": {k: v for k, v in run["selected"].items() if k != "success"}}
            | {"final": {k: v for k, v in run["final"].items() if k != "success"}}
            for run in runs
        ],
    }
    write_text_atomic(out / "study.json", json.dumps(numbers, indent=2) + "\n")
    seeds = sorted({run["seed"] for run in runs})
    lines = [
        "# Study: the paper's comparison on the tiny CPU task",
        "",
        f"{len(runs)} runs: methods {', '.join(sorted({run['method'] for run in runs}))}; seeds "
        f"{', '.join(map(str, seeds))}; {runs[0]['steps']} GRPO steps each, NeMo-RL's "
        "grpo_train with nemo-mmpo's CPU engines. Held-out: the task's problems in four "
        "difficulty strata, 16 samples (or as set) at temperature 0.6, top-p 0.95.",
        "",
        *seeds_note(_fewest_paired_seeds(numbers["selected"], len(seeds))),
        *_tables(numbers["selected"], "At the checkpoint the paper's rule selects (best average)"),
        *_tables(numbers["final"], "At the final step"),
        *figures(runs, numbers["selected"], out),
    ]
    path = out / "study.md"
    write_text_atomic(path, "\n".join(lines))
    return path
