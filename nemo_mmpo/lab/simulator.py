"""A CPU simulator that trains problem-level policies with the library's estimators.

Each of ``N`` problems has a success probability

    s_i = sigmoid(theta_i + x_i . w - d_i),

with a private logit ``theta_i``, a shared weight vector ``w`` seen through the problem's
features ``x_i`` (so an update for one problem moves the others, as in an LLM) and a
difficulty ``d_i`` drawn once from a configurable distribution. A training step samples ``B``
problems and ``G`` Bernoulli rollouts each, computes advantages with any registered
estimator, and takes an optimiser step on the PPO clipped surrogate of the rollouts'
likelihoods (``pi(y=1) = s``, ``pi(y=0) = 1 - s``).

``exact=True`` replaces sampling by the expected update: the gradient of
``mean_i sum_k a_k f_i^k`` over the sampled problems, i.e. ``-mean_i w(f_i) grad s_i``.

Gradients are written out by hand (the model is a logistic unit per problem), which keeps a
step at a few dozen small tensor operations; the tests check them against autograd.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.estimators import get_estimator
from nemo_mmpo.grouping import RewardGroups
from nemo_mmpo.objectives import MomentObjective, moment_objective

DIFFICULTIES = ("beta", "hard_tail")


@dataclass(frozen=True)
class SimulatorConfig:
    """Everything a lab run depends on; equal configs and seeds give equal runs."""

    num_problems: int = 2_000
    feature_dim: int = 8
    shared_scale: float = 0.5  # size of the features x_i (how strongly problems interfere)
    difficulty: str = "hard_tail"  # "beta" or "hard_tail" (a Beta bulk plus a hard cluster)
    initial_success_alpha: float = 1.0  # initial success rates ~ Beta(alpha, beta)
    initial_success_beta: float = 1.5
    hard_fraction: float = 0.2  # hard_tail: share of problems in the hard cluster
    hard_success: float = 0.02  # hard_tail: their initial success rate
    prompts_per_step: int = 16  # B
    group_size: int = 8  # G
    learning_rate: float = 0.05
    optimizer: str = "adam"  # "adam" or "sgd"
    clip_epsilon: float = 0.2
    ppo_epochs: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.difficulty not in DIFFICULTIES:
            raise MMPOInputError(
                f"difficulty={self.difficulty!r}; choose one of {', '.join(DIFFICULTIES)}"
            )
        if self.optimizer not in ("adam", "sgd"):
            raise MMPOInputError(f"optimizer={self.optimizer!r}; choose 'adam' or 'sgd'")
        for name in ("num_problems", "prompts_per_step", "group_size", "ppo_epochs"):
            if getattr(self, name) < 1:
                raise MMPOInputError(f"{name}={getattr(self, name)} must be >= 1")
        if self.prompts_per_step > self.num_problems:
            raise MMPOInputError(
                f"prompts_per_step={self.prompts_per_step} exceeds num_problems="
                f"{self.num_problems}; lower B or add problems"
            )


def initial_success_rates(config: SimulatorConfig, generator: torch.Generator) -> torch.Tensor:
    """``[num_problems]`` success rates at step 0 (which fix the difficulties)."""
    beta = torch.distributions.Beta(
        torch.tensor(config.initial_success_alpha, dtype=torch.float64),
        torch.tensor(config.initial_success_beta, dtype=torch.float64),
    )
    # torch.distributions has no generator argument: draw through the inverse of a uniform
    # with a fixed local seed derived from the generator, so runs are reproducible.
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        success = beta.sample((config.num_problems,))
    if config.difficulty == "hard_tail":
        hard = torch.rand(config.num_problems, generator=generator, dtype=torch.float64)
        success = torch.where(hard < config.hard_fraction, config.hard_success, success)
    return success.clamp(1e-4, 1 - 1e-4)


class RowAdam:
    """Adam (or SGD) that updates only the given rows of a parameter vector (lazy Adam)."""

    def __init__(self, size: int, learning_rate: float, kind: str = "adam") -> None:
        self.learning_rate = learning_rate
        self.kind = kind
        self.first = torch.zeros(size, dtype=torch.float64)
        self.second = torch.zeros(size, dtype=torch.float64)
        self.count = torch.zeros(size, dtype=torch.float64)

    def update(
        self, parameter: torch.Tensor, rows: torch.Tensor | None, gradient: torch.Tensor
    ) -> None:
        """Step ``parameter[rows]`` (every entry when ``rows`` is None) against ``gradient``."""
        if self.kind == "sgd":
            if rows is None:
                parameter -= self.learning_rate * gradient
            else:
                parameter[rows] -= self.learning_rate * gradient
            return
        beta1, beta2, epsilon = 0.9, 0.999, 1e-8
        if rows is None:
            first = self.first.mul_(beta1).add_(gradient, alpha=1 - beta1)
            second = self.second.mul_(beta2).addcmul_(gradient, gradient, value=1 - beta2)
            count = self.count.add_(1)
        else:
            first = beta1 * self.first[rows] + (1 - beta1) * gradient
            second = beta2 * self.second[rows] + (1 - beta2) * gradient.square()
            count = self.count[rows] + 1
            self.first[rows], self.second[rows], self.count[rows] = first, second, count
        step = first / (1 - beta1**count) / ((second / (1 - beta2**count)).sqrt() + epsilon)
        if rows is None:
            parameter -= self.learning_rate * step
        else:
            parameter[rows] -= self.learning_rate * step


@dataclass
class Simulator:
    """Policy parameters and the step function of one lab run."""

    config: SimulatorConfig
    objective: MomentObjective = field(default_factory=lambda: moment_objective("mmpo", 4))
    estimator: str = "plugin"
    estimator_options: dict[str, Any] = field(default_factory=dict)
    exact: bool = False

    def __post_init__(self) -> None:
        config = self.config
        self.generator = torch.Generator().manual_seed(config.seed)
        success = initial_success_rates(config, self.generator)
        self.features = config.shared_scale * torch.randn(
            config.num_problems, config.feature_dim, generator=self.generator, dtype=torch.float64
        )
        self.difficulty = -torch.logit(success)  # theta = w = 0 gives the initial rates
        self.theta = torch.zeros(config.num_problems, dtype=torch.float64)
        self.shared = torch.zeros(config.feature_dim, dtype=torch.float64)
        self.theta_optimizer = RowAdam(config.num_problems, config.learning_rate, config.optimizer)
        self.shared_optimizer = RowAdam(config.feature_dim, config.learning_rate, config.optimizer)
        # The batch layout never changes: B groups of G valid rollouts.
        self.group_index = torch.arange(config.prompts_per_step).repeat_interleave(
            config.group_size
        )
        self.group_sizes = torch.full(
            (config.prompts_per_step,), float(config.group_size), dtype=torch.float64
        )
        self.all_valid = torch.ones(config.prompts_per_step * config.group_size, dtype=torch.bool)
        self.estimate = get_estimator(self.estimator)
        self.steps = 0

    def success_rates(
        self,
        problems: torch.Tensor | None = None,
        theta: torch.Tensor | None = None,
        shared: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[N]`` (or ``[len(problems)]``) success probabilities.

        ``theta``/``shared`` replace the current parameters (for autograd checks); ``theta`` is
        then the full ``[N]`` vector.
        """
        theta = self.theta if theta is None else theta
        shared = self.shared if shared is None else shared
        if problems is None:
            return torch.sigmoid(theta + self.features @ shared - self.difficulty)
        logits = theta[problems] + self.features[problems] @ shared - self.difficulty[problems]
        return torch.sigmoid(logits)

    def objective_value(
        self, theta: torch.Tensor | None = None, shared: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``mean_i sum_k a_k f_i^k`` over all problems."""
        return self.objective.value(1.0 - self.success_rates(None, theta, shared)).mean()

    def sample_problems(self) -> torch.Tensor:
        """``B`` distinct problems, uniformly (redrawn on the rare collision)."""
        size, count = self.config.num_problems, self.config.prompts_per_step
        if count * 4 > size:
            return torch.randperm(size, generator=self.generator)[:count]
        while True:
            problems = torch.randint(0, size, (count,), generator=self.generator)
            if torch.unique(problems).numel() == count:
                return problems

    def sample_rewards(self, success: torch.Tensor) -> torch.Tensor:
        """``[B, G]`` Bernoulli rewards for ``[B]`` success probabilities."""
        draws = torch.rand(
            success.shape[0], self.config.group_size, generator=self.generator, dtype=torch.float64
        )
        return (draws < success.unsqueeze(1)).to(torch.float64)

    def advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        """``[B, G]`` advantages of the configured estimator (rewards are 0/1 by construction)."""
        groups = RewardGroups(
            rewards.reshape(-1),
            self.all_valid,
            self.group_index,
            self.group_sizes,
            rewards.sum(dim=1),
        )
        return self.estimate(groups, self.objective, **self.estimator_options).reshape(
            rewards.shape
        )

    def surrogate_loss(self, problems, rewards, advantages, old_success, success) -> torch.Tensor:
        """Negative PPO clipped surrogate over the ``B x G`` rollouts, for ``[B]`` ``success``."""
        success, old = success.unsqueeze(1), old_success.unsqueeze(1)
        ratio = torch.where(rewards > 0, success / old, (1 - success) / (1 - old))
        epsilon = self.config.clip_epsilon
        clipped = ratio.clamp(1 - epsilon, 1 + epsilon)
        return -torch.minimum(ratio * advantages, clipped * advantages).mean()

    def surrogate_logit_gradient(self, rewards, advantages, old_success, success) -> torch.Tensor:
        """``[B]`` d(surrogate_loss)/d(logit_i), by hand.

        ``ratio = s/s_old`` (success) or ``(1-s)/(1-s_old)`` (failure), so
        ``d ratio / d logit = ratio (1 - s)`` or ``-ratio s``; the gradient flows where the
        unclipped term is the minimum.
        """
        s, old = success.unsqueeze(1), old_success.unsqueeze(1)
        ratio = torch.where(rewards > 0, s / old, (1 - s) / (1 - old))
        epsilon = self.config.clip_epsilon
        active = ratio * advantages <= ratio.clamp(1 - epsilon, 1 + epsilon) * advantages
        ratio_slope = torch.where(rewards > 0, ratio * (1 - s), -ratio * s)
        per_rollout = torch.where(active, advantages * ratio_slope, torch.zeros_like(ratio))
        return -per_rollout.sum(dim=1) / rewards.numel()

    def exact_logit_gradient(self, success: torch.Tensor) -> torch.Tensor:
        """``[B]`` expected update ``-w(f_i) s_i (1 - s_i) / B`` per logit."""
        weight = self.objective.weight(1.0 - success)
        return -weight * success * (1 - success) / success.numel()

    def _apply(self, problems: torch.Tensor, logit_gradient: torch.Tensor) -> None:
        shared_gradient = self.features[problems].T @ logit_gradient
        self.theta_optimizer.update(self.theta, problems, logit_gradient)
        self.shared_optimizer.update(self.shared, None, shared_gradient)

    def step(self) -> dict[str, float]:
        """One training step; returns the batch's mean reward and mean |advantage|."""
        problems = self.sample_problems()
        old_success = self.success_rates(problems)
        if self.exact:
            self._apply(problems, self.exact_logit_gradient(old_success))
            self.steps += 1
            return {"batch_success": float(old_success.mean())}
        rewards = self.sample_rewards(old_success)
        advantages = self.advantages(rewards)
        success = old_success
        for _ in range(self.config.ppo_epochs):
            gradient = self.surrogate_logit_gradient(rewards, advantages, old_success, success)
            self._apply(problems, gradient)
            success = self.success_rates(problems)
        self.steps += 1
        return {
            "batch_success": float(rewards.mean()),
            "advantage_abs_mean": float(advantages.abs().mean()),
        }

    def _parameter_gradient(self, problems: torch.Tensor, logit_gradient: torch.Tensor):
        return torch.cat([logit_gradient, self.features[problems].T @ logit_gradient])

    def gradient_estimate(self, problems: torch.Tensor) -> torch.Tensor:
        """One sampled gradient at ratio 1 over ``(theta[problems], w)``: ``[B + feature_dim]``."""
        success = self.success_rates(problems)
        rewards = self.sample_rewards(success)
        advantages = self.advantages(rewards)
        gradient = self.surrogate_logit_gradient(rewards, advantages, success, success)
        return self._parameter_gradient(problems, gradient)

    def exact_gradient(self, problems: torch.Tensor) -> torch.Tensor:
        """The expectation of :meth:`gradient_estimate` for an unbiased estimator."""
        gradient = self.exact_logit_gradient(self.success_rates(problems))
        return self._parameter_gradient(problems, gradient)
