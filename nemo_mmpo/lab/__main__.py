"""``python -m nemo_mmpo.lab``: run lab experiments and write a report folder.

python -m nemo_mmpo.lab compare --steps 3000 --out lab_results
python -m nemo_mmpo.lab gradients --out lab_results
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict
from pathlib import Path

from nemo_mmpo.errors import MMPOInputError, handle
from nemo_mmpo.io import write_text_atomic
from nemo_mmpo.lab.experiments import gradient_study, paper_comparison, train_side_by_side
from nemo_mmpo.lab.plots import (
    gradient_table,
    plot_gradient_study,
    plot_training,
    training_table,
)
from nemo_mmpo.lab.simulator import SimulatorConfig


def _at_least(flag: str, value: int, minimum: int, why: str = "") -> None:
    if value < minimum:
        raise MMPOInputError(f"{flag} {value}: give an integer >= {minimum}{why}")


def _integers(flag: str, text: str, minimum: int) -> list[int]:
    try:
        values = [int(item) for item in text.split(",")]
    except ValueError:
        raise MMPOInputError(f"{flag} {text!r}: give comma-separated integers") from None
    for value in values:
        _at_least(flag, value, minimum)
    return values


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse values the lab cannot run, naming the flag (before any work starts)."""
    _at_least("--problems", args.problems, 1)
    _at_least("--prompts", args.prompts, 1)
    if args.prompts > args.problems:
        raise MMPOInputError(f"--prompts {args.prompts} exceeds --problems {args.problems}")
    _at_least("--group-size", args.group_size, 2, " (the estimators compare rollouts of a group)")
    if not (math.isfinite(args.learning_rate) and args.learning_rate > 0):
        raise MMPOInputError(f"--learning-rate {args.learning_rate}: give a finite number > 0")
    if args.command == "compare":
        _at_least("--steps", args.steps, 1)
        _at_least("--log-every", args.log_every, 1)
        _at_least("--truncation-order", args.truncation_order, 1)
        _at_least("--k", args.k, 1)
        if args.k > args.group_size:
            raise MMPOInputError(
                f"--k {args.k} exceeds --group-size {args.group_size}: pass@k needs k <= G"
            )
    else:
        _at_least("--draws", args.draws, 1)
        _integers("--group-sizes", args.group_sizes, 2)
        _integers("--orders", args.orders, 1)


def _config(args: argparse.Namespace) -> SimulatorConfig:
    return SimulatorConfig(
        num_problems=args.problems,
        prompts_per_step=args.prompts,
        group_size=args.group_size,
        learning_rate=args.learning_rate,
        difficulty=args.difficulty,
        seed=args.seed,
    )


def compare(args: argparse.Namespace) -> None:
    config = _config(args)
    history = train_side_by_side(
        paper_comparison(args.truncation_order, args.k), config, args.steps, args.log_every
    )
    out = Path(args.out)
    plot_training(
        history,
        out / "lab_training.png",
        f"{config.num_problems} problems, B={config.prompts_per_step}, G={config.group_size}",
    )
    write_text_atomic(out / "lab_training.json", json.dumps(history, indent=1))
    summary = (
        f"# Objective lab: training comparison\n\nConfig: `{json.dumps(asdict(config))}`, "
        f"{args.steps} steps.\n\nStart → end of training:\n\n{training_table(history)}\n\n"
        "![training](lab_training.png)\n"
    )
    write_text_atomic(out / "lab_training.md", summary)
    print(summary)


def gradients(args: argparse.Namespace) -> None:
    config = _config(args)
    rows = gradient_study(
        args.estimators.split(","),
        _integers("--group-sizes", args.group_sizes, 2),
        _integers("--orders", args.orders, 1),
        config,
        args.draws,
    )
    out = Path(args.out)
    plot_gradient_study(rows, out / "lab_gradients.png")
    write_text_atomic(out / "lab_gradients.json", json.dumps(rows, indent=1))
    summary = (
        "# Objective lab: gradient bias and variance\n\nRelative to |exact gradient|², "
        f"{args.draws} draws per cell, initial policy, B={config.prompts_per_step}.\n\n"
        f"{gradient_table(rows)}\n\n![gradients](lab_gradients.png)\n"
    )
    write_text_atomic(out / "lab_gradients.md", summary)
    print(summary)


def main(argv: list[str] | None = None, prog: str = "python -m nemo_mmpo.lab") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, function in (("compare", compare), ("gradients", gradients)):
        command = commands.add_parser(name)
        command.set_defaults(function=function)
        command.add_argument("--out", default="lab_results")
        command.add_argument("--problems", type=int, default=2000)
        command.add_argument("--prompts", type=int, default=16)
        command.add_argument("--group-size", type=int, default=8)
        command.add_argument("--learning-rate", type=float, default=0.05)
        command.add_argument("--difficulty", default="hard_tail", choices=("beta", "hard_tail"))
        command.add_argument("--seed", type=int, default=0)
    compare_parser = commands.choices["compare"]
    compare_parser.add_argument("--steps", type=int, default=3000)
    compare_parser.add_argument("--log-every", type=int, default=100)
    compare_parser.add_argument("--truncation-order", type=int, default=4)
    compare_parser.add_argument("--k", type=int, default=3)
    gradient_parser = commands.choices["gradients"]
    gradient_parser.add_argument("--estimators", default="plugin,unbiased,empirical_bayes")
    gradient_parser.add_argument("--group-sizes", default="4,8,16")
    gradient_parser.add_argument("--orders", default="1,2,4,8")
    gradient_parser.add_argument("--draws", type=int, default=400)
    args = parser.parse_args(argv)
    check_arguments(args)
    args.function(args)
    return 0


if __name__ == "__main__":
    sys.exit(handle(main, None, "python -m nemo_mmpo.lab"))
