"""First-step outcome checks: what ``install()`` hooks must also land where it matters.

``install()`` checks where its hooks sit in NeMo-RL's code; a NeMo-RL can keep every hook point
and still lose what they produce (a trainer that logs its estimator metrics only for NeMo-RL's
own estimator classes, a metrics call gated by a logger setting, DMPO's metrics merged into
another dict, validation skipped). So the hooked GRPO trainers (``grpo_train``,
``async_grpo_train``, ``grpo_train_sync``) get NeMo-RL's logger wrapped in
:class:`FirstStepLogger`, which passes everything through and, at the end of the trainer's
first step, checks the step's ``train`` metrics: ``mmpo/`` when the recipe trains one of our
estimators, DMPO's batch-term metrics (:data:`DMPO_BATCH_METRIC`) with ``loss_fn.name: dmpo``;
and that the paper's in-loop evaluation ran when the recipe asks for it before step 1
(``evaluation.in_loop`` with ``grpo.val_at_start``).
Otherwise the run stops there in one line naming the trainer and NeMo-RL's version: one step
costs less than a run trained without a word of what it was for.

The step ends, for the check, at the step's ``timing/train`` log (NeMo-RL logs it right after
the ``train`` metrics), at the first log of a later step, or when the trainer returns.
"""

from __future__ import annotations

from typing import Any

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.nemo_rl import dmpo_batch_terms as dmpo
from nemo_mmpo.nemo_rl import sections
from nemo_mmpo.nemo_rl.estimator_settings import is_our_estimator
from nemo_mmpo.nemo_rl.evaluation import in_loop_settings
from nemo_mmpo.nemo_rl.names import DMPO_METRICS, ESTIMATOR_METRICS

#: a step metric only the penalties hook adds with ``loss_fn.name: dmpo`` (DMPO's batch terms)
DMPO_BATCH_METRIC = f"{DMPO_METRICS}counted_groups"
#: how many times the hooked validation ran the paper's evaluation in this process
in_loop_runs = {"count": 0}


class FirstStepLogger:
    """NeMo-RL's ``logger``, passed through, checking the first step's outcome (module doc)."""

    def __init__(self, logger: Any, trainer: str, master_config: Any) -> None:
        self._logger = logger
        self._trainer = trainer
        #: ``(key or key prefix, what it is, the setting that asks for it)``
        self._expected = []
        name = sections.value(master_config, "grpo.adv_estimator.name")
        if is_our_estimator(name):
            setting = f"grpo.adv_estimator.name={name}"
            self._expected.append((ESTIMATOR_METRICS, f"{ESTIMATOR_METRICS} metrics", setting))
        if dmpo.is_dmpo_loss(sections.value(master_config, "loss_fn")):
            # the penalties hook's (the loss's own dmpo/penalty_term comes from the workers)
            self._expected.append((DMPO_BATCH_METRIC, DMPO_BATCH_METRIC, "loss_fn.name=dmpo"))
        self._validates_at_start = in_loop_settings(master_config) is not None and bool(
            sections.value(master_config, "grpo.val_at_start")
        )
        self._runs_before = in_loop_runs["count"]
        self._step: int | None = None
        self._keys: set[str] = set()
        self._checked = not (self._expected or self._validates_at_start)

    def __getattr__(self, name: str) -> Any:
        if name == "_logger" or name.startswith("__"):  # copied or unpickled before __init__
            raise AttributeError(name)
        return getattr(self._logger, name)

    @property
    def checks_anything(self) -> bool:
        """Whether the recipe asks for something this logger checks (else it need not wrap)."""
        return not self._checked

    def log_metrics(self, *args: Any, **kwargs: Any) -> Any:
        # NeMo-RL's Logger.log_metrics(metrics, step, prefix=""): read, then passed on exactly
        # as called (NeMo-RL's own tests read the call's keywords)
        named = dict(zip(("metrics", "step", "prefix"), args, strict=False)) | kwargs
        metrics, step = named.get("metrics"), named.get("step")
        prefix = named.get("prefix") or ""
        if not self._checked and isinstance(step, int) and isinstance(prefix, str):
            if self._step is not None and step > self._step:
                self.check()
            elif prefix == "train":
                self._step = step if self._step is None else self._step
                self._keys.update(map(str, dict(metrics or {})))
            elif self._step == step and prefix.startswith("timing/train"):
                self.check()
        return self._logger.log_metrics(*args, **kwargs)

    def _has(self, key: str) -> bool:
        """Whether the step logged ``key`` (a prefix where it ends with ``/``)."""
        if key.endswith("/"):
            return any(logged.startswith(key) for logged in self._keys)
        return key in self._keys

    def check(self) -> None:
        """Raise where the first step's outcome is missing (once; nothing before a step)."""
        if self._checked or self._step is None:
            return
        self._checked = True
        from nemo_mmpo.nemo_rl.contract import nemo_rl_version

        where = f"NeMo-RL {nemo_rl_version()}'s {self._trainer}"
        missing = [
            f"no {what} ({setting})" for key, what, setting in self._expected if not self._has(key)
        ]
        if missing:
            raise MMPOInputError(
                f"{where} logged step {self._step}'s train metrics with {' and '.join(missing)}: "
                "nemo-mmpo's hooks ran, but what they add no longer reaches the logger in this "
                "NeMo-RL, so the run stops at its first step rather than train without them; "
                "please report the NeMo-RL version"
            )
        if self._validates_at_start and self._step == 1:
            if in_loop_runs["count"] == self._runs_before:
                raise MMPOInputError(
                    f"evaluation.in_loop=true with grpo.val_at_start=true: {where} finished step "
                    "1 without running the paper's evaluation (its validation was skipped or "
                    "not called through nemo-mmpo's hook), so the run stops rather than train "
                    "without it: set evaluation.in_loop=false and evaluate checkpoints with "
                    "`nemo-mmpo eval watch`, and please report the NeMo-RL version"
                )
