"""What one run's hooks share, in one object per process: :data:`RUN`.

The hooks are functions NeMo-RL calls by name, each seeing only its own arguments; what one
must know of another (the estimator the factory built, the loss the trainer trains with, the
engine ``validate_sync`` is not given) lives here, and nowhere else. Tests replace it whole
(``monkeypatch.setattr(run_state, "RUN", RunState())``).
"""

from __future__ import annotations

import contextvars
import weakref
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunState:
    #: the estimator NeMo-RL's factory built last, when it was ours (weakly: the trainer owns it)
    built_estimator: weakref.ref[Any] | None = None
    #: the generation engine of the ``grpo_train_sync`` call in progress
    sync_generation: Any = None
    #: the losses of the hooked trainer calls in progress, innermost last (the penalties hook adds
    #: a loss's per-batch terms only when that loss trains)
    training_losses: list[Any] = field(default_factory=list)
    #: the steps at which the paper's in-loop evaluation ran (the first-step check reads them)
    in_loop_steps: list[int] = field(default_factory=list)
    #: set by the CPU rig while its answers for the single controller are in place: a Ray
    #: cluster without GPUs is then answered, not refused
    cpu_rig_answers_single_controller: bool = False
    #: in the single controller's actor: the estimator unpickled there (weakly)
    actor_estimator: weakref.ref[Any] | None = None
    #: there, the first step's put check: ``checking`` from the unpickling to the first step's
    #: metric reduction; ``compared``: the output the last put was compared with;
    #: ``clip_config``: the GRPO config the stage's clip read last
    first_step: dict[str, Any] = field(
        default_factory=lambda: {"checking": False, "compared": None, "clip_config": None}
    )

    def estimator(self) -> Any:
        """The estimator NeMo-RL's factory built last, when ours and still alive."""
        return None if self.built_estimator is None else self.built_estimator()


RUN = RunState()

#: ``(problem, streaming_chunks)`` of the trainer whose estimator builder is running (the
#: single controller's ``_build_advantage_estimator`` imports grpo's factory inside its body):
#: the factory hook it reaches builds on those terms. Per call, so a context variable.
builder_terms: contextvars.ContextVar[tuple[Any, bool] | None] = contextvars.ContextVar(
    "nemo_mmpo_builder_terms", default=None
)
