"""``python -m nemo_mmpo.eval``: prepare data, generate and grade, and report.

python -m nemo_mmpo.eval report runs/mmpo.jsonl runs/grpo.jsonl --out report/
python -m nemo_mmpo.eval generate --model ckpt/hf --out runs/mmpo.jsonl [--samples 16]
python -m nemo_mmpo.eval grade --gold 25 --prediction '\\boxed{025}'
"""

from __future__ import annotations

import argparse
import sys

from nemo_mmpo.data import VALIDATION_BENCHMARKS, load_benchmark
from nemo_mmpo.errors import MMPOInputError


def report(args: argparse.Namespace) -> None:
    from nemo_mmpo.eval.report import load_runs, write_report

    summary = write_report(load_runs(args.runs), args.out)
    print(f"wrote {summary}")


def generate(args: argparse.Namespace) -> None:
    from nemo_mmpo.eval.generate import PAPER_SAMPLES, VLLMSampler, run_generation
    from nemo_mmpo.eval.verify import VerifierPool

    local = dict(item.split("=", 1) for item in args.data) if args.data else {}
    problems = [
        record
        for name in args.benchmarks.split(",")
        for record in load_benchmark(name, local.get(name))
    ]
    samples = PAPER_SAMPLES if args.samples == "paper" else int(args.samples)
    sampler = VLLMSampler(
        args.model,
        args.temperature,
        args.top_p,
        args.max_tokens,
        args.tensor_parallel_size,
        args.seed,
    )
    with VerifierPool(timeout_seconds=args.grade_timeout) as pool:
        counts = run_generation(
            problems,
            sampler,
            pool.verify,
            args.out,
            samples,
            args.shard_index,
            args.num_shards,
        )
        print(f"{counts}; grading: {dict(pool.counts)}")


def grade(args: argparse.Namespace) -> None:
    from nemo_mmpo.eval.verify import VerifierPool

    with VerifierPool(num_workers=1, timeout_seconds=args.grade_timeout) as pool:
        print(pool.verify([args.gold], [args.prediction])[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nemo_mmpo.eval", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    report_parser = commands.add_parser("report", help="rollout files -> summary.md + figures")
    report_parser.add_argument("runs", nargs="+", help="rollout files, optionally NAME=path")
    report_parser.add_argument("--out", default="report")
    report_parser.set_defaults(function=report)
    generate_parser = commands.add_parser("generate", help="sample with vLLM and grade")
    generate_parser.add_argument("--model", required=True, help="HF checkpoint directory or id")
    generate_parser.add_argument("--out", required=True, help="JSONL file (appended, resumable)")
    generate_parser.add_argument("--benchmarks", default=",".join(VALIDATION_BENCHMARKS))
    generate_parser.add_argument("--data", nargs="*", help="NAME=local file instead of the hub")
    generate_parser.add_argument("--samples", default="paper", help="'paper' or an integer")
    generate_parser.add_argument("--temperature", type=float, default=0.6)
    generate_parser.add_argument("--top-p", type=float, default=0.95)
    generate_parser.add_argument("--max-tokens", type=int, default=4096)
    generate_parser.add_argument("--tensor-parallel-size", type=int, default=1)
    generate_parser.add_argument("--seed", type=int, default=0)
    generate_parser.add_argument("--shard-index", type=int, default=0)
    generate_parser.add_argument("--num-shards", type=int, default=1)
    generate_parser.add_argument("--grade-timeout", type=float, default=5.0)
    generate_parser.set_defaults(function=generate)
    grade_parser = commands.add_parser("grade", help="grade one answer")
    grade_parser.add_argument("--gold", required=True)
    grade_parser.add_argument("--prediction", required=True)
    grade_parser.add_argument("--grade-timeout", type=float, default=5.0)
    grade_parser.set_defaults(function=grade)
    args = parser.parse_args(argv)
    try:
        args.function(args)
    except MMPOInputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
