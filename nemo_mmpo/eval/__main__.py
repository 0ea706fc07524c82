"""``nemo-mmpo eval`` (or ``python -m nemo_mmpo.eval``): sample and grade, grade one answer,
report, evaluate a run's checkpoints as they appear, summarise a run's evaluations, demo files.

python -m nemo_mmpo.eval generate --model ckpt/hf --out runs/mmpo.jsonl   # 16 samples each
python -m nemo_mmpo.eval generate --backend hf --model tiny/ --out runs/tiny.jsonl
python -m nemo_mmpo.eval grade --gold 25 --prediction '\\boxed{025}'
python -m nemo_mmpo.eval report MMPO=runs/mmpo.jsonl GRPO=runs/grpo.jsonl --out report/
python -m nemo_mmpo.eval synthetic --out runs/demo    # two synthetic runs to try report on
nemo-mmpo eval watch --config nemo_mmpo/mmpo_math_qwen3_1.7b.yaml --follow  # alongside
nemo-mmpo eval watch --config results/mmpo_qwen3_1.7b/nemo_mmpo_recipe.yaml  # as the run started
nemo-mmpo eval watch --config my_recipe.yaml --check   # what it would watch, without watching
nemo-mmpo eval summary logs/mmpo_qwen3_1.7b/evaluation   # the selected step, the final one, curves
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from nemo_mmpo.checkout import find_nemo_rl_root
from nemo_mmpo.data import VALIDATION_BENCHMARKS, load_benchmark
from nemo_mmpo.errors import MMPOInputError, handle
from nemo_mmpo.eval.generate import DEFAULT_TEMPLATE
from nemo_mmpo.recipes import load


def report(args: argparse.Namespace) -> None:
    from nemo_mmpo.eval.report import load_runs, write_report

    summary = write_report(load_runs(args.runs), args.out)
    print(f"wrote {summary} and {summary.with_suffix('.json')}")


def _samples(text: str) -> int | dict[str, int]:
    from nemo_mmpo.eval.generate import PAPER_TABLE_SAMPLES

    if text == "paper":
        return PAPER_TABLE_SAMPLES
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise MMPOInputError(f"--samples {text!r}: give an integer >= 1 or 'paper'")
    return value


def _check_sampling(args: argparse.Namespace) -> None:
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise MMPOInputError(f"--temperature {args.temperature}: give a number >= 0 (0: greedy)")
    if not 0 < args.top_p <= 1:
        raise MMPOInputError(f"--top-p {args.top_p}: give a number in (0, 1]")
    if args.max_tokens < 1:
        raise MMPOInputError(f"--max-tokens {args.max_tokens}: give an integer >= 1")
    if args.num_shards < 1 or not 0 <= args.shard_index < args.num_shards:
        raise MMPOInputError(
            f"--shard-index {args.shard_index} --num-shards {args.num_shards}: need "
            "num-shards >= 1 and 0 <= shard-index < num-shards"
        )


def generate(args: argparse.Namespace) -> None:
    from nemo_mmpo.eval.generate import TransformersSampler, VLLMSampler, run_generation
    from nemo_mmpo.eval.verify import VerifierPool

    _check_sampling(args)
    samples = _samples(args.samples)
    if args.batch_size < 1:
        raise MMPOInputError(f"--batch-size {args.batch_size}: give rows per sampler call >= 1")
    if "{}" not in args.template:
        raise MMPOInputError(f"--template {args.template!r}: put {{}} where the problem goes")
    local = {}
    for item in args.data or []:
        name, separator, path = item.partition("=")
        if not separator or not path:
            raise MMPOInputError(f"--data {item!r}: give NAME=local file, e.g. amc23=amc.jsonl")
        local[name] = path
    problems = [
        record
        for name in args.benchmarks.split(",")
        for record in load_benchmark(name, local.get(name))
    ]
    # The grading workers start before the sampler touches a GPU (see VerifierPool).
    with VerifierPool(
        num_workers=args.grade_workers,
        timeout_seconds=args.grade_timeout,
        max_chars=args.max_answer_chars,
    ) as pool:
        if args.backend == "hf":
            sampler = TransformersSampler(
                args.model, args.temperature, args.top_p, args.max_tokens, args.seed
            )
        else:
            sampler = VLLMSampler(
                args.model,
                args.temperature,
                args.top_p,
                args.max_tokens,
                args.tensor_parallel_size,
                args.seed,
            )
        counts = run_generation(
            problems,
            sampler,
            pool.verify,
            args.out,
            samples,
            args.shard_index,
            args.num_shards,
            batch_size=args.batch_size,
            template=args.template,
        )
        print(f"{counts}; grading: {dict(pool.counts)}")


def grade(args: argparse.Namespace) -> None:
    from nemo_mmpo.eval.verify import VerifierPool

    with VerifierPool(
        num_workers=1, timeout_seconds=args.grade_timeout, max_chars=args.max_answer_chars
    ) as pool:
        print(pool.verify([args.gold], [args.prediction])[0])


def watch(args: argparse.Namespace) -> None:
    import os

    from nemo_mmpo.eval.convert import (
        CPU_RIG_CONVERTER_SETUP,
        CPU_RIG_ENGINE_SETUP,
        is_cpu_rig_recipe,
    )
    from nemo_mmpo.eval.prompts import prompt_format
    from nemo_mmpo.eval.protocol import answer_room_problem, read_settings
    from nemo_mmpo.eval.run_summary import write_summary
    from nemo_mmpo.eval.watch import vllm_engine
    from nemo_mmpo.eval.watch import watch as watch_checkpoints
    from nemo_mmpo.eval.worker_environments import move_into_nemo_rl

    loaded = load(Path(args.config).expanduser(), args.overrides)
    config = loaded.config  # its relative paths (checkpoints, logs, data): from here, as train's
    settings = read_settings(config.get("evaluation"))
    if not settings.enabled:
        raise MMPOInputError(
            "evaluation.enabled is false in this recipe (base/mmpo_common.yaml's default): "
            "nothing to watch for. Name your held-out problems and turn it on, in the recipe or "
            "as overrides: evaluation.enabled=true evaluation.benchmarks.<name>=<your JSONL "
            "with problem and answer> (docs/evaluation.md)"
        )
    if not config["checkpointing"].get("enabled", True):
        raise MMPOInputError(
            "checkpointing.enabled is false in this recipe: the run saves no checkpoints to "
            "evaluate (set checkpointing.enabled=true)"
        )
    every = args.every or config["grpo"].get("val_period") or config["checkpointing"]["save_period"]
    prompts = prompt_format(config, settings.template)  # the training prompt, as the recipe's
    too_long = answer_room_problem(config, settings)  # answers vLLM's model length would cut
    if too_long:
        raise MMPOInputError(too_long)
    cpu_rig = is_cpu_rig_recipe(config)  # its checkpoints and vLLM need the rig's CPU answers
    backend = args.backend or ("hf" if cpu_rig else "vllm")
    if args.check:  # what the watcher would do, without watching (slurm/watch_mmpo.sh's check)
        print(
            f"watch: {config['checkpointing']['checkpoint_dir']}, every {every} steps to step "
            f"{config['grpo']['max_num_steps']} ({backend}); evaluation: "
            f"{', '.join(settings.benchmarks) or 'none named'}, into "
            f"{settings.output_dir}"
        )
        return
    if backend == "vllm" or (config["policy"].get("megatron_cfg") or {}).get("enabled"):
        move_into_nemo_rl(args.argv)  # NeMo-RL finds the vLLM and Megatron workers' environments
    engine_options, environment = vllm_engine(config["policy"])
    for name, value in environment.items():  # vLLM's process inherits them; the caller's win
        os.environ.setdefault(name, value)
    done = watch_checkpoints(
        settings,
        Path(config["checkpointing"]["checkpoint_dir"]),
        Path(config["logger"]["log_dir"]) / "tensorboard" / "paper_evaluation",
        every,
        backend=backend,
        follow=args.follow,
        last_step=config["grpo"]["max_num_steps"],
        poll_seconds=args.poll_seconds,
        idle_seconds=args.idle_seconds,
        batch_size=args.batch_size,
        nemo_rl_root=loaded.nemo_rl_root or find_nemo_rl_root(),
        engine_options=engine_options,
        converter_setup=CPU_RIG_CONVERTER_SETUP if cpu_rig else (),
        engine_setup=CPU_RIG_ENGINE_SETUP if cpu_rig and backend == "vllm" else (),
        prompts=prompts,
    )
    if done:
        print(f"wrote {write_summary(settings.output_dir)}")


def summary(args: argparse.Namespace) -> None:
    from nemo_mmpo.eval.run_summary import write_summary

    print(f"wrote {write_summary(args.folder)}")


def synthetic(args: argparse.Namespace) -> None:
    from nemo_mmpo.eval.synthetic import write_synthetic_runs

    paths = write_synthetic_runs(args.out, scale=args.scale)
    print(f"wrote {', '.join(str(path) for path in paths)} (synthetic, not from a model)")


def _grading_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--grade-timeout", type=float, default=5.0, help="seconds per answer (default 5)"
    )
    parser.add_argument(
        "--max-answer-chars",
        type=int,
        default=None,
        help="grade longer answers as wrong ('too_long'); default: no limit, as NeMo-RL's "
        "math environment (training reward)",
    )


def _add_report(commands: Any) -> None:
    report_parser = commands.add_parser(
        "report", help="rollout files -> summary.md, summary.json and figures (no GPU)"
    )
    report_parser.add_argument(
        "runs", nargs="+", help="rollout files, optionally NAME=path (same NAME: shards)"
    )
    report_parser.add_argument("--out", default="report", help="output directory")
    report_parser.set_defaults(function=report)


def _add_generate(commands: Any) -> None:
    generate_parser = commands.add_parser(
        "generate", help="sample responses (vLLM or transformers), grade, append JSONL"
    )
    generate_parser.add_argument("--model", required=True, help="HF checkpoint directory or id")
    generate_parser.add_argument("--out", required=True, help="JSONL file (appended, resumable)")
    generate_parser.add_argument("--backend", choices=("vllm", "hf"), default="vllm")
    generate_parser.add_argument("--benchmarks", default=",".join(VALIDATION_BENCHMARKS))
    generate_parser.add_argument("--data", nargs="*", help="NAME=local file instead of the hub")
    generate_parser.add_argument(
        "--samples",
        default="16",
        help="per problem: an integer (default 16) or 'paper' (1 for MATH500/OlymMATH, 16 else)",
    )
    generate_parser.add_argument("--temperature", type=float, default=0.6)
    generate_parser.add_argument("--top-p", type=float, default=0.95)
    generate_parser.add_argument("--max-tokens", type=int, default=4096)
    generate_parser.add_argument("--tensor-parallel-size", type=int, default=1, help="vLLM only")
    generate_parser.add_argument(
        "--batch-size", type=int, default=64, help="rows per sampler call, each written when graded"
    )
    generate_parser.add_argument("--seed", type=int, default=0)
    generate_parser.add_argument(
        "--template",
        default=DEFAULT_TEMPLATE,
        help="prompt around each problem ('{}' is the problem; default: the paper's "
        "step-by-step \\boxed{} instruction)",
    )
    generate_parser.add_argument("--shard-index", type=int, default=0)
    generate_parser.add_argument("--num-shards", type=int, default=1)
    generate_parser.add_argument(
        "--grade-workers", type=int, default=None, help="default: usable CPUs, at most 16"
    )
    _grading_flags(generate_parser)
    generate_parser.set_defaults(function=generate)


def _add_grade(commands: Any) -> None:
    grade_parser = commands.add_parser("grade", help="grade one answer")
    grade_parser.add_argument("--gold", required=True)
    grade_parser.add_argument("--prediction", required=True)
    _grading_flags(grade_parser)
    grade_parser.set_defaults(function=grade)


def _add_watch(commands: Any) -> None:
    watch_parser = commands.add_parser(
        "watch",
        help="evaluate a run's checkpoints as they appear (the recipe's evaluation section)",
    )
    watch_parser.add_argument(
        "--config",
        required=True,
        help="the training recipe (its Hydra overrides follow, as for train), the run's "
        "nemo_mmpo_recipe.yaml or a step_<N>/config.yaml of its checkpoints",
    )
    watch_parser.add_argument(
        "--backend",
        choices=("vllm", "hf"),
        default=None,
        help="vllm (in NeMo-RL's vLLM worker environment) or hf (transformers, here); default: "
        "hf for a CPU-rig recipe (cpu_backend.enabled), vllm otherwise",
    )
    watch_parser.add_argument(
        "--every", type=int, default=None, help="steps between evaluations (grpo.val_period)"
    )
    watch_parser.add_argument(
        "--follow", action="store_true", help="keep watching until the last step is evaluated"
    )
    watch_parser.add_argument("--poll-seconds", type=float, default=30.0)
    watch_parser.add_argument(
        "--idle-seconds", type=float, default=None, help="with --follow: stop after this long idle"
    )
    watch_parser.add_argument("--batch-size", type=int, default=64, help="hf: rows per generate")
    watch_parser.add_argument(
        "--check",
        action="store_true",
        help="check the recipe and overrides as the watcher reads them, print what it would "
        "watch, and exit (no GPU; slurm/watch_mmpo.sh runs it before queuing)",
    )
    watch_parser.set_defaults(function=watch)


def _add_summary_and_synthetic(commands: Any) -> None:
    summary_parser = commands.add_parser(
        "summary", help="a run's evaluations: the selected step, the final one, curves"
    )
    summary_parser.add_argument("folder", help="evaluation.output_dir of the run")
    summary_parser.set_defaults(function=summary)
    synthetic_parser = commands.add_parser(
        "synthetic", help="write two synthetic rollout files (mmpo, grpo) to try report on"
    )
    synthetic_parser.add_argument("--out", default="runs/synthetic", help="output directory")
    synthetic_parser.add_argument("--scale", type=float, default=1.0, help="fraction of problems")
    synthetic_parser.set_defaults(function=synthetic)


def main(argv: list[str] | None = None, prog: str = "python -m nemo_mmpo.eval") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for add in (_add_report, _add_generate, _add_grade, _add_watch, _add_summary_and_synthetic):
        add(commands)
    args, extra = parser.parse_known_args(argv)
    if args.command == "watch":  # the recipe's Hydra overrides, as `nemo-mmpo train` takes them
        unknown = [item for item in extra if item.startswith("--")]
        if unknown:
            raise MMPOInputError(f"unknown option {unknown[0]} (overrides are key=value)")
        args.overrides = extra
        args.argv = list(sys.argv[1:] if argv is None else argv)  # to re-run it in NeMo-RL's
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.function(args)
    return 0


if __name__ == "__main__":
    sys.exit(handle(main, None, "python -m nemo_mmpo.eval"))
