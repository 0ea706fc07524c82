"""Lab experiments: objectives trained side by side, and gradient bias/variance studies."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from nemo_mmpo.eval.metrics import TABLE_PASS_AT, gini
from nemo_mmpo.lab.simulator import Simulator, SimulatorConfig
from nemo_mmpo.objectives import MomentObjective, moment_objective


@dataclass(frozen=True)
class ObjectiveSpec:
    """One arm of a comparison: a name, a registered estimator, its objective and options."""

    name: str
    estimator: str
    objective: MomentObjective
    options: dict[str, Any] = field(default_factory=dict)


def paper_comparison(truncation_order: int = 4, k: int = 3) -> list[ObjectiveSpec]:
    """GRPO, MMPO (plug-in, T), pass@K training (Chen, K) and MaxRL, as in the paper."""
    return [
        ObjectiveSpec("GRPO", "grpo", moment_objective("reinforce")),
        ObjectiveSpec(
            f"MMPO (T={truncation_order})", "plugin", moment_objective("mmpo", truncation_order)
        ),
        ObjectiveSpec(f"pass@{k}", "passk_chen", moment_objective("pass_at_k", k=k), {"k": k}),
        ObjectiveSpec("MaxRL", "maxrl", moment_objective("maxrl", truncation_order)),
    ]


def population_metrics(simulator: Simulator, num_moments: int = 4) -> dict[str, float]:
    """Exact statistics of the current policy over all problems."""
    with torch.no_grad():
        success = simulator.success_rates()
    failure = 1.0 - success
    row = {"mean_success": float(success.mean()), "gini": gini(success.numpy())}
    moments = [float((failure**k).mean()) for k in range(1, num_moments + 1)]
    for k, value in enumerate(moments, start=1):
        row[f"failure_moment_{k}"] = value
    for k in TABLE_PASS_AT:
        row[f"pass@{k}"] = float(1.0 - (failure**k).mean())
    row["truncated_first_success_time"] = 1.0 + sum(moments)
    return row


def train_side_by_side(
    specs: Sequence[ObjectiveSpec],
    config: SimulatorConfig,
    steps: int,
    log_every: int = 50,
    progress: bool = True,
) -> dict[str, list[dict[str, float]]]:
    """Train each arm from the same initial policy and seed; metrics every ``log_every`` steps."""
    try:
        from tqdm.auto import tqdm
    except ImportError:  # progress bars are optional
        tqdm = None
    history: dict[str, list[dict[str, float]]] = {}
    for spec in specs:
        simulator = Simulator(config, spec.objective, spec.estimator, dict(spec.options))
        rows = [{"step": 0, **population_metrics(simulator)}]
        iterator = range(1, steps + 1)
        if progress and tqdm is not None:
            iterator = tqdm(iterator, desc=spec.name, leave=False)
        for step in iterator:
            simulator.step()
            if step % log_every == 0 or step == steps:
                rows.append({"step": step, **population_metrics(simulator)})
        history[spec.name] = rows
    return history


def gradient_study(
    estimators: Sequence[str],
    group_sizes: Sequence[int],
    orders: Sequence[int],
    config: SimulatorConfig,
    draws: int = 400,
) -> list[dict[str, float]]:
    """Bias and variance of each estimator's gradient against the exact one.

    The policy is the simulator's initial one; every draw samples fresh rollouts for a fixed
    batch of problems. Reported relative to ``|g_exact|^2``: ``bias2`` = ``|mean g - g_exact|^2``,
    ``variance`` = ``mean |g - mean g|^2``, ``mse`` = their sum.
    """
    rows = []
    for group_size in group_sizes:
        for order in orders:
            for estimator in estimators:
                if estimator == "unbiased" and order > group_size:
                    continue
                simulator = Simulator(
                    replace(config, group_size=group_size),
                    moment_objective("mmpo", order),
                    estimator,
                )
                problems = simulator.sample_problems()
                exact = simulator.exact_gradient(problems)
                samples = torch.stack([simulator.gradient_estimate(problems) for _ in range(draws)])
                mean = samples.mean(dim=0)
                scale = float(exact.square().sum())
                bias2 = float((mean - exact).square().sum()) / scale
                variance = float((samples - mean).square().sum(dim=1).mean()) / scale
                rows.append(
                    {
                        "estimator": estimator,
                        "group_size": group_size,
                        "truncation_order": order,
                        "bias2": bias2,
                        "variance": variance,
                        "mse": bias2 + variance,
                    }
                )
    return rows
