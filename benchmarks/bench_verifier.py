"""Verifier throughput: the process pool against a serial loop on the same answers, one run.

Baseline: ``grade_serially`` in a plain loop (Math-Verify in this process, its own SIGALRM
timeouts, no hard budget). Printed: answers/s of each and the speed-up.

Usage: ``python benchmarks/bench_verifier.py [--answers 400] [--workers N]``
"""

from __future__ import annotations

import argparse
import os
import random
import time

from nemo_mmpo.eval.verify import VerifierPool, grade_serially

TEMPLATES = [
    ("\\frac{{{a}}}{{{b}}}", "so the answer is \\boxed{{\\frac{{{a}}}{{{b}}}}}"),
    ("{a}", "Therefore $\\boxed{{{a}}}$."),
    ("{a}", "The result is \\boxed{{{b}}}."),
    ("\\sqrt{{{a}}}", "\\boxed{{\\sqrt{{{a}}}}}"),
    ("{a}x+{b}", "we find \\boxed{{{b} + {a}x}}"),
]


def make_answers(count: int, seed: int = 0) -> tuple[list[str], list[str]]:
    generator = random.Random(seed)
    golds, predictions = [], []
    for _ in range(count):
        gold, prediction = generator.choice(TEMPLATES)
        values = {"a": generator.randint(1, 999), "b": generator.randint(1, 999)}
        golds.append(gold.format(**values))
        predictions.append(
            "Let us think. " * generator.randint(1, 50) + prediction.format(**values)
        )
    return golds, predictions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=400)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    golds, predictions = make_answers(args.answers)
    grade_serially(golds[0], predictions[0])  # import and set up Math-Verify, not timed
    start = time.perf_counter()
    serial = [grade_serially(g, p) for g, p in zip(golds, predictions, strict=True)]
    serial_seconds = time.perf_counter() - start
    with VerifierPool(num_workers=args.workers, timeout_seconds=5.0) as pool:
        pool.verify(golds[: args.workers], predictions[: args.workers])  # start-up, not timed
        start = time.perf_counter()
        pooled = pool.verify(golds, predictions)
        pool_seconds = time.perf_counter() - start
    agree = sum(a.correct == b.correct for a, b in zip(serial, pooled, strict=True))
    print(f"answers={args.answers} workers={args.workers} cpus={os.cpu_count()}")
    print(f"serial loop : {args.answers / serial_seconds:8.1f} answers/s")
    print(f"pool        : {args.answers / pool_seconds:8.1f} answers/s")
    speed_up = serial_seconds / pool_seconds
    print(f"speed-up    : {speed_up:8.2f}x  (verdicts agree: {agree}/{args.answers})")


if __name__ == "__main__":
    main()
