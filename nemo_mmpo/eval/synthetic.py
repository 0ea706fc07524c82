"""Synthetic rollout files for tests, demos and benchmarks (clearly not model output).

Each method draws per-problem success rates from a Beta distribution with a given mean and
concentration (higher concentration: success spread more evenly), then Bernoulli samples.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from nemo_mmpo.data import VALIDATION_BENCHMARKS
from nemo_mmpo.io import write_jsonl_atomic

SIZES = {"math500": 500, "olymmath": 200, "amc23": 40, "aime24": 30, "aime25": 30}


def synthetic_records(
    mean: float, concentration: float, samples: int = 16, scale: float = 1.0, seed: int = 0
) -> list[dict]:
    """Records for the paper's five benchmarks (sizes scaled by ``scale``)."""
    generator = np.random.default_rng(seed)
    problem_rng = np.random.default_rng(12345)  # same latent difficulty order for every method
    records = []
    for benchmark in VALIDATION_BENCHMARKS:
        count = max(1, int(SIZES[benchmark] * scale))
        rank = problem_rng.permutation(count) / max(count - 1, 1)
        alpha, beta = mean * concentration, (1 - mean) * concentration
        quantiles = np.sort(generator.beta(alpha, beta, size=count))
        success = quantiles[np.argsort(np.argsort(rank))]  # comonotone with the shared difficulty
        outcomes = generator.random((count, samples)) < success[:, None]
        for problem in range(count):
            for sample in range(samples):
                records.append(
                    {
                        "benchmark": benchmark,
                        "problem_id": f"{benchmark}-{problem}",
                        "sample": sample,
                        "answer": "0",
                        "response": "",
                        "correct": bool(outcomes[problem, sample]),
                        "status": "ok",
                    }
                )
    return records


def write_synthetic_runs(out_dir: str | Path, scale: float = 1.0, samples: int = 16) -> list[Path]:
    """Two runs, ``mmpo.jsonl`` (more even) and ``grpo.jsonl`` (more dispersed)."""
    out_dir = Path(out_dir)
    paths = []
    for name, mean, concentration, seed in (("mmpo", 0.5, 2.0, 1), ("grpo", 0.48, 0.8, 2)):
        path = out_dir / f"{name}.jsonl"
        write_jsonl_atomic(synthetic_records(mean, concentration, samples, scale, seed), path)
        paths.append(path)
    return paths
