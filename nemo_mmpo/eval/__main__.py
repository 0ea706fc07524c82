"""``python -m nemo_mmpo.eval``: sample and grade, grade one answer, report, demo files.

python -m nemo_mmpo.eval generate --model ckpt/hf --out runs/mmpo.jsonl   # 16 samples each
python -m nemo_mmpo.eval generate --backend hf --model tiny/ --out runs/tiny.jsonl
python -m nemo_mmpo.eval grade --gold 25 --prediction '\\boxed{025}'
python -m nemo_mmpo.eval report MMPO=runs/mmpo.jsonl GRPO=runs/grpo.jsonl --out report/
python -m nemo_mmpo.eval synthetic --out runs/demo    # two synthetic runs to try report on
"""

from __future__ import annotations

import argparse
import math
import sys

from nemo_mmpo.data import VALIDATION_BENCHMARKS, load_benchmark
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.eval.generate import DEFAULT_TEMPLATE


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
            template=args.template,
        )
        print(f"{counts}; grading: {dict(pool.counts)}")


def grade(args: argparse.Namespace) -> None:
    from nemo_mmpo.eval.verify import VerifierPool

    with VerifierPool(
        num_workers=1, timeout_seconds=args.grade_timeout, max_chars=args.max_answer_chars
    ) as pool:
        print(pool.verify([args.gold], [args.prediction])[0])


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nemo_mmpo.eval",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    report_parser = commands.add_parser(
        "report", help="rollout files -> summary.md, summary.json and figures (no GPU)"
    )
    report_parser.add_argument(
        "runs", nargs="+", help="rollout files, optionally NAME=path (same NAME: shards)"
    )
    report_parser.add_argument("--out", default="report", help="output directory")
    report_parser.set_defaults(function=report)
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
    grade_parser = commands.add_parser("grade", help="grade one answer")
    grade_parser.add_argument("--gold", required=True)
    grade_parser.add_argument("--prediction", required=True)
    _grading_flags(grade_parser)
    grade_parser.set_defaults(function=grade)
    synthetic_parser = commands.add_parser(
        "synthetic", help="write two synthetic rollout files (mmpo, grpo) to try report on"
    )
    synthetic_parser.add_argument("--out", default="runs/synthetic", help="output directory")
    synthetic_parser.add_argument("--scale", type=float, default=1.0, help="fraction of problems")
    synthetic_parser.set_defaults(function=synthetic)
    args = parser.parse_args(argv)
    try:
        args.function(args)
    except MMPOInputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
