"""``python -m nemo_mmpo.cpu``: the CPU rig's tools.

- ``warm-start --config RECIPE [overrides]``: only the recipe's warm start, into its cache
  (needs no NeMo-RL, except for a recipe's own data section, ``cpu_backend.problems: recipe``,
  whose formatting NeMo-RL's data setup gives: another interpreter or torch build can make it
  for a run here);
- ``plot NAME=LOG_DIR[,LOG_DIR...] ... --out FIGURE.png``: training reward, mean and band over
  the runs (seeds) of each name;
- ``spread --out DIR``: the tiny recipe over seeds and perturbed numerics
  (:mod:`nemo_mmpo.cpu.spread.robustness`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nemo_mmpo.errors import MMPOInputError, handle
from nemo_mmpo.recipes import load


def warm_start_command(args: argparse.Namespace, overrides: list[str]) -> int:
    from nemo_mmpo.cpu.rig.measure import success_profile
    from nemo_mmpo.cpu.rig.model import char_tokenizer
    from nemo_mmpo.cpu.rig.policy_start import recipe_task_start, warm_start_prompts
    from nemo_mmpo.cpu.rig.rig_settings import TinySettings
    from nemo_mmpo.cpu.rig.task import FormattedProblem
    from nemo_mmpo.cpu.rig.warm_start import load_or_make

    config = load(args.config, overrides).config
    settings = TinySettings.from_config(config.get("cpu_backend"))
    if settings.warm_start_cache is None:
        raise MMPOInputError("cpu_backend.warm_start_cache is null: give a directory to write to")
    tokenizer, sums = char_tokenizer(), None
    if settings.problems == "recipe":  # the sums as NeMo-RL formats the recipe's data section
        tokenizer, _, sums = recipe_task_start(settings, config["data"])
    prompts = warm_start_prompts(settings, sums)
    spec = settings.warm_start_spec(config["policy"]["generation"], prompts)
    model, _, directory = load_or_make(spec, tokenizer, Path(settings.warm_start_cache))
    print(f"warm start: {directory}")
    temperature = float(config["policy"]["generation"]["temperature"])
    train, held_out = settings.task.split()
    if sums is not None:  # measured on the prompts the run gives the policy
        train, held_out = (
            [FormattedProblem(sum_, text) for sum_, text in zip(part, sums(part), strict=True)]
            for part in (train, held_out)
        )
    for name, problems in (("training", train), ("held-out", held_out)):
        profile = success_profile(model, tokenizer, problems, temperature)
        print(
            f"{name} problems ({len(problems)}): probability of the exact answer at "
            f"temperature {temperature:g}: mean {profile['mean']:.3f}, below 0.2 on "
            f"{profile['below_0.2']:.0%}, above 0.8 on {profile['above_0.8']:.0%}"
        )
    return 0


def plot_command(args: argparse.Namespace) -> int:
    from nemo_mmpo.cpu.spread.curves import plot_reward_bands

    runs: dict[str, list[str]] = {}
    for spec in args.runs:
        name, separator, directories = spec.partition("=")
        if not separator or not directories:
            raise MMPOInputError(f"{spec!r}: give NAME=LOG_DIR[,LOG_DIR...]")
        runs.setdefault(name, []).extend(directories.split(","))
    print(f"wrote {plot_reward_bands(runs, args.out, window=args.window)}")
    return 0


def spread_command(args: argparse.Namespace, overrides: list[str]) -> int:
    from nemo_mmpo.cpu.spread.robustness import run_spread

    summary = run_spread(
        Path(args.out),
        args.seeds,
        args.variants,
        Path(args.config),
        overrides,
        args.other_python,
        perturbed_seeds=args.perturbed_seeds,
    )
    expected = summary["expected_gain"]["train"]
    print(
        f"expected success gain over {len(summary['runs'])} runs: min {expected['min']:+.3f}, "
        f"mean {expected['mean']:+.3f}, max {expected['max']:+.3f}; every run gained: "
        f"{summary['every_run_gained']}; see {Path(args.out) / 'spread.md'}"
    )
    return 0


def main(argv: list[str] | None = None, prog: str = "python -m nemo_mmpo.cpu") -> int:
    from nemo_mmpo.cpu.spread.robustness import VARIANTS
    from nemo_mmpo.cpu.spread.runs import TINY_RECIPE

    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    warm = commands.add_parser("warm-start", help="only the recipe's warm start, into its cache")
    warm.add_argument("--config", type=Path, default=TINY_RECIPE)
    plot = commands.add_parser("plot", help="training reward of runs from TensorBoard")
    plot.add_argument("runs", nargs="+", help="NAME=LOG_DIR[,LOG_DIR...] (logger.log_dir)")
    plot.add_argument("--out", required=True, help="PNG path")
    plot.add_argument("--window", type=int, default=20, help="moving-average steps")
    spread = commands.add_parser("spread", help="the tiny recipe over seeds and numerics")
    spread.add_argument("--out", required=True)
    spread.add_argument("--config", type=Path, default=TINY_RECIPE)
    spread.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    spread.add_argument("--variants", nargs="+", default=list(VARIANTS))
    spread.add_argument(
        "--perturbed-seeds",
        type=int,
        nargs="+",
        help="seeds of the variants other than default (default: --seeds)",
    )
    spread.add_argument("--other-python", help="interpreter for the python311 variant's warm start")
    args, overrides = parser.parse_known_args(argv)
    if args.command == "plot" and overrides:
        parser.error(f"unrecognised arguments: {' '.join(overrides)}")
    if args.command == "warm-start":
        return warm_start_command(args, overrides)
    if args.command == "plot":
        return plot_command(args)
    return spread_command(args, overrides)


if __name__ == "__main__":
    sys.exit(handle(main, None, "python -m nemo_mmpo.cpu"))
