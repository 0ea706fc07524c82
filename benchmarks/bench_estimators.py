"""Time the MMPO estimators against named baselines on the same batch, in one run.

Baselines (printed as ratios ``ours / baseline``, lower is better):
- ``loop``: a per-prompt Python loop that groups by comparing prompt-token rows, the way
  NeMo-RL's ``calculate_baseline_and_std_per_prompt`` does, computing the MMPO plug-in
  advantage per group;
- ``nemo_rl_grpo``: NeMo-RL's own ``GRPOAdvantageEstimator`` when ``nemo_rl`` is importable.

Our timings include grouping from the ``[batch, prompt_len]`` token rows
(``group_ids_from_prompt_rows``), exactly the input NeMo-RL gives an estimator. The row
``adapter T=4`` is the whole step as NeMo-RL's trainer calls it:
``MMPOAdvantageEstimator.compute_advantage(prompt_ids, rewards, mask)`` (grouping, the plug-in
advantage, the ``mmpo/`` step metrics, expansion to the ``[batch, seq_len]`` mask).

Usage: ``python benchmarks/bench_estimators.py [--device cuda] [--sizes 64x8,4096x64]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from nemo_mmpo import compute_advantages, group_ids_from_prompt_rows, moment_objective
from nemo_mmpo.nemo_rl import MMPOAdvantageEstimator

DEFAULT_SIZES = "64x8,256x8,1024x16,2048x32,4096x64"


def make_batch(num_prompts: int, group_size: int, prompt_len: int, device: str, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, 32_000, (num_prompts, prompt_len), generator=generator)
    prompt_ids = prompts.repeat_interleave(group_size, dim=0)
    permutation = torch.randperm(prompt_ids.shape[0], generator=generator)
    rewards = (torch.rand(prompt_ids.shape[0], generator=generator) < 0.4).float()
    return prompt_ids[permutation].to(device), rewards.to(device)


def time_call(function: Callable[[], object], device: str, repeats: int, budget: float) -> float:
    """Median seconds of ``function`` (one warm-up; stops early past ``budget`` seconds)."""
    function()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    samples: list[float] = []
    start_all = time.perf_counter()
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
        if time.perf_counter() - start_all > budget:
            break
    return statistics.median(samples)


def loop_plugin(prompt_ids: torch.Tensor, rewards: torch.Tensor, truncation_order: int):
    """The per-prompt loop baseline: MMPO plug-in, one unique prompt row at a time."""
    objective = moment_objective("mmpo", truncation_order)
    advantages = torch.zeros_like(rewards)
    for row in torch.unique(prompt_ids, dim=0):
        members = (prompt_ids == row).all(dim=1)
        group = rewards[members]
        success_rate = group.mean()
        advantages[members] = objective.weight(1.0 - success_rate) * (group - success_rate)
    return advantages


def ours(prompt_ids, rewards, estimator: str, truncation_order: int):
    group_ids = group_ids_from_prompt_rows(prompt_ids)
    objective = moment_objective("mmpo", truncation_order)
    return compute_advantages(rewards, group_ids, objective, estimator)


def nemo_rl_grpo_estimator():
    try:
        from nemo_rl.algorithms.advantage_estimator import GRPOAdvantageEstimator
    except ImportError:
        return None
    config = {"name": "grpo", "normalize_rewards": True, "use_leave_one_out_baseline": False}
    try:
        from nemo_rl.algorithms.advantage_estimator import AdvEstimatorConfig

        config = AdvEstimatorConfig(**config)
    except ImportError:
        pass
    return GRPOAdvantageEstimator(config, {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="comma list of PROMPTSxGROUP")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--budget", type=float, default=10.0, help="seconds per measurement")
    parser.add_argument(
        "--loop-max-rollouts",
        type=int,
        default=70_000,
        help="skip the quadratic per-prompt loop baseline above this many rollouts",
    )
    args = parser.parse_args()

    nemo_estimator = nemo_rl_grpo_estimator()
    print(f"device={args.device} torch={torch.__version__} prompt_len={args.prompt_len}")
    print("nemo_rl GRPOAdvantageEstimator:", "found" if nemo_estimator else "not importable")
    header = (
        f"{'batch':>10} {'rollouts':>9} {'estimator':>14} {'ms':>9} {'ns/rollout':>11}"
        f" {'vs loop':>9} {'vs nemo_rl_grpo':>16}"
    )
    print(header)
    for size in args.sizes.split(","):
        num_prompts, group_size = (int(part) for part in size.lower().split("x"))
        prompt_ids, rewards = make_batch(num_prompts, group_size, args.prompt_len, args.device)
        rollouts = rewards.numel()
        loop_seconds = None
        if rollouts <= args.loop_max_rollouts:
            loop_seconds = time_call(
                lambda p=prompt_ids, r=rewards: loop_plugin(p, r, 4), args.device, 3, args.budget
            )
        nemo_seconds = None
        if nemo_estimator is not None:
            token_mask = torch.ones(rollouts, 8, device=args.device)
            nemo_seconds = time_call(
                lambda p=prompt_ids, r=rewards, m=token_mask: nemo_estimator.compute_advantage(
                    p, r, m
                ),
                args.device,
                3,
                args.budget,
            )
        orders = {
            ("plugin", 4),
            ("unbiased", min(8, group_size)),
            ("unbiased", min(16, group_size)),
        }
        candidates = {
            f"{estimator} T={order}": (
                lambda p=prompt_ids, r=rewards, e=estimator, t=order: ours(p, r, e, t)
            )
            for estimator, order in sorted(orders)
        }
        adapter = MMPOAdvantageEstimator({"name": "mmpo", "truncation_order": 4})
        mask = torch.ones(rollouts, 8, device=args.device)
        candidates["adapter T=4"] = lambda p=prompt_ids, r=rewards, m=mask, a=adapter: (
            a.compute_advantage(p, r, m)
        )
        for label, function in candidates.items():
            seconds = time_call(function, args.device, args.repeats, args.budget)
            versus_nemo = f"{seconds / nemo_seconds:16.4f}" if nemo_seconds else f"{'n/a':>16}"
            versus_loop = f"{seconds / loop_seconds:9.4f}" if loop_seconds else f"{'skipped':>9}"
            print(
                f"{size:>10} {rollouts:>9} {label:>14} {seconds * 1e3:9.2f}"
                f" {seconds / rollouts * 1e9:11.1f} {versus_loop} {versus_nemo}"
            )
        if loop_seconds:
            print(f"{size:>10} {rollouts:>9} {'loop T=4':>14} {loop_seconds * 1e3:9.2f}")
        if nemo_seconds:
            print(f"{size:>10} {rollouts:>9} {'nemo_rl_grpo':>14} {nemo_seconds * 1e3:9.2f}")


if __name__ == "__main__":
    main()
