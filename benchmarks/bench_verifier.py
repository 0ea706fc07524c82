"""Verifier throughput: the process pool against a serial loop on the same answers, one run.

Baseline: ``grade_serially`` in a plain loop (Math-Verify in this process, its own SIGALRM
timeouts, no hard budget). The two alternate for ``--rounds`` rounds (the machine's load
drifts); printed: answers/s of each per round and the median speed-up.

Usage: ``python benchmarks/bench_verifier.py [--answers 1000] [--rounds 5] [--workers N]``
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

from nemo_mmpo.eval.verify import VerifierPool, default_workers, grade_serially

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
    parser.add_argument("--answers", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=default_workers())
    args = parser.parse_args()
    golds, predictions = make_answers(args.answers)
    grade_serially(golds[0], predictions[0])  # import and set up Math-Verify, not timed
    speed_ups = []
    with VerifierPool(num_workers=args.workers, timeout_seconds=5.0) as pool:
        pool.verify(golds[: args.workers], predictions[: args.workers])  # start-up, not timed
        print(f"answers={args.answers} workers={args.workers} cpus={os.cpu_count()}")
        for round_index in range(args.rounds):
            start = time.perf_counter()
            serial = [grade_serially(g, p) for g, p in zip(golds, predictions, strict=True)]
            serial_seconds = time.perf_counter() - start
            start = time.perf_counter()
            pooled = pool.verify(golds, predictions)
            pool_seconds = time.perf_counter() - start
            agree = sum(a.correct == b.correct for a, b in zip(serial, pooled, strict=True))
            speed_ups.append(serial_seconds / pool_seconds)
            print(
                f"round {round_index}: serial {args.answers / serial_seconds:7.1f}/s, pool "
                f"{args.answers / pool_seconds:7.1f}/s, {speed_ups[-1]:.2f}x, verdicts agree "
                f"{agree}/{args.answers}"
            )
    print(f"speed-up (median of {args.rounds}): {statistics.median(speed_ups):.2f}x")


if __name__ == "__main__":
    main()
