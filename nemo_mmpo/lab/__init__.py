"""The objective lab: a CPU simulator that trains with the library's own estimators."""

from nemo_mmpo.lab.experiments import (
    ObjectiveSpec,
    gradient_study,
    paper_comparison,
    population_metrics,
    train_side_by_side,
)
from nemo_mmpo.lab.simulator import Simulator, SimulatorConfig

__all__ = [
    "ObjectiveSpec",
    "Simulator",
    "SimulatorConfig",
    "gradient_study",
    "paper_comparison",
    "population_metrics",
    "train_side_by_side",
]
