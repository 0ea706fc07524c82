"""Simulated rollouts per second of the objective lab, against a named baseline in the same run.

Baseline: drawing the same rollouts alone (``torch.rand`` of ``[B, G]`` per step), i.e. the
floor any simulator step costs. Printed: steps/s, rollouts/s and the ratio to that floor.

Usage: ``python benchmarks/bench_lab.py [--problems 10000] [--steps 3000]``
"""

from __future__ import annotations

import argparse
import time

import torch

from nemo_mmpo import moment_objective
from nemo_mmpo.lab import Simulator, SimulatorConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=3_000)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = SimulatorConfig(num_problems=args.problems)
    rollouts_per_step = config.prompts_per_step * config.group_size
    generator = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    for _ in range(args.steps):
        torch.rand(config.prompts_per_step, config.group_size, generator=generator)
    floor = (time.perf_counter() - start) / args.steps
    print(
        f"N={args.problems} B={config.prompts_per_step} G={config.group_size} "
        f"threads={args.threads}"
    )
    print(f"{'estimator':>16} {'steps/s':>9} {'rollouts/s':>11} {'x sampling floor':>17}")
    for estimator, objective in (
        ("grpo", moment_objective("reinforce")),
        ("plugin", moment_objective("mmpo", 4)),
        ("unbiased", moment_objective("mmpo", 4)),
        ("empirical_bayes", moment_objective("mmpo", 4)),
    ):
        simulator = Simulator(config, objective, estimator)
        for _ in range(50):
            simulator.step()
        start = time.perf_counter()
        for _ in range(args.steps):
            simulator.step()
        per_step = (time.perf_counter() - start) / args.steps
        print(
            f"{estimator:>16} {1 / per_step:9.0f} {rollouts_per_step / per_step:11.0f}"
            f" {per_step / floor:17.1f}"
        )


if __name__ == "__main__":
    main()
