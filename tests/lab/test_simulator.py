"""The objective lab: exact gradients, hand-written gradients, reproducibility, stability."""

from __future__ import annotations

import math

import pytest
import torch

from nemo_mmpo import available_estimators, moment_objective
from nemo_mmpo.cli import handle
from nemo_mmpo.lab import (
    Simulator,
    SimulatorConfig,
    gradient_study,
    paper_comparison,
    train_side_by_side,
)
from nemo_mmpo.lab.__main__ import main as lab_tool


def lab_main(argv):
    """The lab tool as a person runs it: its errors through the CLI's one handler."""
    return handle(lab_tool, argv, "nemo-mmpo lab")


SMALL = SimulatorConfig(num_problems=200, prompts_per_step=8, group_size=8, seed=3)


def batch_objective(simulator, problems, theta, shared):
    failure = 1.0 - simulator.success_rates(problems, theta, shared)
    return simulator.objective.value(failure).mean()


@pytest.mark.parametrize(
    "objective",
    [moment_objective("mmpo", 4), moment_objective("maxrl", 3), moment_objective("pass_at_k", k=3)],
    ids=lambda objective: objective.name,
)
def test_exact_mode_update_is_the_gradient_of_the_moment_objective(objective):
    """Finite differences of mean_i sum_k a_k f_i^k over the batch vs the exact update."""
    simulator = Simulator(SMALL, objective, exact=True)
    simulator.theta += torch.randn(200, generator=torch.Generator().manual_seed(1)).double()
    problems = simulator.sample_problems()
    analytic = simulator.exact_gradient(problems)
    step = 1e-6
    numeric = []
    for row in problems.tolist():
        for sign in (1, -1):
            simulator.theta[row] += sign * step
            value = batch_objective(simulator, problems, None, None)
            numeric.append(float(value) * sign)
            simulator.theta[row] -= sign * step
    theta_numeric = torch.tensor(numeric, dtype=torch.float64).reshape(-1, 2).sum(dim=1) / (
        2 * step
    )
    for dimension in range(simulator.shared.numel()):
        plus, minus = simulator.shared.clone(), simulator.shared.clone()
        plus[dimension] += step
        minus[dimension] -= step
        difference = batch_objective(simulator, problems, None, plus) - batch_objective(
            simulator, problems, None, minus
        )
        extra = torch.tensor([float(difference) / (2 * step)], dtype=torch.float64)
        theta_numeric = torch.cat([theta_numeric, extra])
    assert torch.allclose(analytic, theta_numeric.double(), rtol=1e-5, atol=1e-9)


def test_hand_written_surrogate_gradient_matches_autograd_with_clipping():
    simulator = Simulator(SMALL, moment_objective("mmpo", 4), "unbiased")
    problems = simulator.sample_problems()
    old = simulator.success_rates(problems)
    rewards = simulator.sample_rewards(old)
    advantages = simulator.advantages(rewards)
    theta = simulator.theta.clone()
    theta[problems] += (
        0.4 * torch.randn(problems.numel(), generator=torch.Generator().manual_seed(0)).double()
    )
    theta.requires_grad_(True)
    success = simulator.success_rates(problems, theta)
    loss = simulator.surrogate_loss(problems, rewards, advantages, old, success)
    (autograd,) = torch.autograd.grad(loss, theta)
    logit_gradient = simulator.surrogate_logit_gradient(rewards, advantages, old, success.detach())
    ratio = torch.where(
        rewards > 0, success[:, None] / old[:, None], (1 - success[:, None]) / (1 - old[:, None])
    )
    assert bool(((ratio - 1).abs() > 0.2).any()), "the check must exercise clipping"
    assert torch.allclose(autograd[problems], logit_gradient, atol=1e-12)


def test_seeds_reproduce_and_differ():
    def run(seed):
        simulator = Simulator(SimulatorConfig(num_problems=300, seed=seed))
        for _ in range(100):
            simulator.step()
        return simulator.theta.clone(), simulator.shared.clone()

    first, again, other = run(7), run(7), run(8)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[0], other[0])


@pytest.mark.parametrize("estimator", available_estimators())
def test_every_registered_estimator_trains_for_1000_steps(estimator):
    options = {"k": 3} if estimator in ("passk_chen", "pkpo") else {}
    simulator = Simulator(SMALL, moment_objective("mmpo", 4), estimator, options)
    start = float(simulator.success_rates().mean())
    for _ in range(1000):
        simulator.step()
    success = simulator.success_rates()
    assert torch.isfinite(success).all() and torch.isfinite(simulator.theta).all()
    assert float(success.mean()) > start  # every one of them learns something


def test_unbiased_estimator_has_far_less_gradient_bias_than_plugin():
    rows = gradient_study(
        ["plugin", "unbiased"],
        [4],
        [4],
        SimulatorConfig(num_problems=100, prompts_per_step=32),
        draws=400,
    )
    by_name = {row["estimator"]: row for row in rows}
    assert by_name["unbiased"]["bias2"] < 0.2 * by_name["plugin"]["bias2"]
    assert by_name["unbiased"]["variance"] > by_name["plugin"]["variance"]


def test_side_by_side_training_starts_every_arm_from_the_same_policy():
    history = train_side_by_side(
        paper_comparison(), SimulatorConfig(num_problems=300), 60, 30, progress=False
    )
    starts = {name: rows[0]["mean_success"] for name, rows in history.items()}
    assert len(set(starts.values())) == 1
    assert all(len(rows) == 3 for rows in history.values())
    assert all(math.isfinite(row["gini"]) for rows in history.values() for row in rows)


def test_cli_writes_report_and_figures(tmp_path):
    lab_main(
        [
            "compare",
            "--steps",
            "40",
            "--log-every",
            "20",
            "--problems",
            "200",
            "--out",
            str(tmp_path),
        ]
    )
    lab_main(
        [
            "gradients",
            "--problems",
            "100",
            "--group-sizes",
            "4",
            "--orders",
            "1,2",
            "--draws",
            "20",
            "--out",
            str(tmp_path),
        ]
    )
    for name in ("lab_training.png", "lab_training.md", "lab_gradients.png", "lab_gradients.md"):
        assert (tmp_path / name).stat().st_size > 0
    assert "MMPO (T=4)" in (tmp_path / "lab_training.md").read_text()


def test_bad_configuration_is_named():
    from nemo_mmpo import MMPOInputError

    with pytest.raises(MMPOInputError, match="difficulty='easy'"):
        SimulatorConfig(difficulty="easy")
    with pytest.raises(MMPOInputError, match="prompts_per_step=50"):
        SimulatorConfig(num_problems=10, prompts_per_step=50)


def test_row_adam_matches_torch_adam():
    from nemo_mmpo.lab.simulator import RowAdam

    generator = torch.Generator().manual_seed(4)
    ours = torch.zeros(5, dtype=torch.float64)
    reference = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.Adam([reference], lr=0.1)
    row_adam = RowAdam(5, 0.1)
    lazy = torch.zeros(5, dtype=torch.float64)
    lazy_adam = RowAdam(5, 0.1)
    for _ in range(20):
        gradient = torch.randn(5, generator=generator, dtype=torch.float64)
        row_adam.update(ours, None, gradient)
        lazy_adam.update(lazy, torch.arange(5), gradient)
        optimizer.zero_grad()
        reference.grad = gradient.clone()
        optimizer.step()
    assert torch.allclose(ours, reference.detach(), atol=1e-12)
    assert torch.allclose(lazy, reference.detach(), atol=1e-12)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["compare", "--group-size", "1"], "--group-size 1: give an integer >= 2"),
        (["compare", "--truncation-order", "0"], "--truncation-order 0: give an integer >= 1"),
        (["compare", "--learning-rate", "nan"], "--learning-rate nan: give a finite number > 0"),
        (["compare", "--k", "9"], "--k 9 exceeds --group-size 8"),
        (["gradients", "--draws", "0"], "--draws 0: give an integer >= 1"),
        (["gradients", "--group-sizes", "4,1"], "--group-sizes 1: give an integer >= 2"),
    ],
)
def test_lab_cli_refuses_bad_flags_in_one_line(arguments, message, capsys, tmp_path):

    assert lab_main([*arguments, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"error: {message}" or (err.startswith("error: ") and message in err)
    assert "Traceback" not in err and not list(tmp_path.iterdir())
