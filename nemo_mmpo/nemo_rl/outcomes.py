"""First-step outcome checks: what ``install()`` hooks must also land where it matters.

A NeMo-RL can keep every hook point and still lose what the hooks produce, so the hooked GRPO
trainers run with their ``logger`` in :class:`FirstStepLogger` (the first step's metrics must
hold ``mmpo/``, DMPO's :data:`DMPO_BATCH_METRIC` and the in-loop evaluation where the recipe
asks for them) and their ``policy`` in :class:`FirstStepPolicy` (its first training call must
bring the estimator's output, :func:`advantage_difference`). Otherwise the run stops in one
line: one step costs less than a run trained without a word of what it was for. The first step
is the first step number on a ``train`` or ``timing/train`` log (its metrics: every key logged
at that number, any prefix); it ends at its ``timing/train`` log, at a later step's first log,
or when the trainer returns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from nemo_mmpo import sections
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.eval.in_loop import in_loop_settings
from nemo_mmpo.nemo_rl import dmpo_batch_terms as dmpo
from nemo_mmpo.nemo_rl import run_state as state
from nemo_mmpo.nemo_rl.estimator_settings import advantage_clip_keys, is_function_estimator
from nemo_mmpo.nemo_rl.names import DMPO_METRICS, ESTIMATOR_METRICS

#: a step metric only the penalties hook adds with ``loss_fn.name: dmpo`` (DMPO's batch terms)
DMPO_BATCH_METRIC = f"{DMPO_METRICS}counted_groups"
#: NeMo-RL's settings that overwrite flagged message spans' advantages with their value
#: (NeMo-RL's ``_apply_message_level_advantage_penalties``)
PENALTY_KEYS = ("invalid_tool_call_advantage", "malformed_thinking_advantage")


def where(trainer: str) -> str:
    from nemo_mmpo.nemo_rl.contract import nemo_rl_version

    return f"NeMo-RL {nemo_rl_version()}'s {trainer}"


class FirstStepLogger:
    """NeMo-RL's ``logger``, passed through, checking the first step's outcome (module doc)."""

    def __init__(self, logger: Any, trainer: str, master_config: Any) -> None:
        self._logger = logger
        self._trainer = trainer
        #: ``(key or key prefix, what it is, the setting that asks for it)``
        self._expected = []
        name = sections.value(master_config, "grpo.adv_estimator.name")
        if is_function_estimator(master_config):
            setting = f"grpo.adv_estimator.name={name}"
            self._expected.append((ESTIMATOR_METRICS, f"{ESTIMATOR_METRICS} metrics", setting))
        if dmpo.is_dmpo_loss(sections.value(master_config, "loss_fn")):
            # the penalties hook's (the loss's own dmpo/penalty_term comes from the workers)
            setting = f"loss_fn.name={dmpo.dmpo_name()}"
            self._expected.append((DMPO_BATCH_METRIC, DMPO_BATCH_METRIC, setting))
        in_loop = in_loop_settings(master_config) is not None
        self._validates_at_start = in_loop and bool(
            sections.value(master_config, "grpo.val_at_start")
        )
        self._val_period = int(sections.value(master_config, "grpo.val_period") or 0) * in_loop
        self._val_start_at = int(sections.value(master_config, "grpo.val_start_at") or 0)
        #: the policy checker of the same trainer call (:class:`FirstStepPolicy`), if any
        self.policy: FirstStepPolicy | None = None
        self._validated_before = len(state.RUN.in_loop_steps)
        self._first: int | None = None  # the first step's number
        self._validation_due: int | None = None  # the first step that must validate
        self._step: int | None = None  # the step being logged
        self._ended = False
        #: the metric keys logged at each step number, under any prefix, until the first
        #: step is checked
        self._logged: dict[int, set[str]] = {}
        #: the error a check raised (a trainer that catches it, as v0.7.0's async loop does,
        #: has it raised again when it returns: ``wrappers.checking_first_step``)
        self.error: MMPOInputError | None = None
        self._pending = bool(self._expected or self._validates_at_start or self._val_period)

    def __getattr__(self, name: str) -> Any:
        if name == "_logger" or name.startswith("__"):  # copied or unpickled before __init__
            raise AttributeError(name)
        return getattr(self._logger, name)

    @property
    def checks_anything(self) -> bool:
        """Whether the recipe asks for something this logger checks (else it need not wrap)."""
        return self._pending

    def log_metrics(self, *args: Any, **kwargs: Any) -> Any:
        # NeMo-RL's Logger.log_metrics(metrics, step, prefix=""): read, then passed on exactly
        # as called (NeMo-RL's own tests read the call's keywords)
        named = dict(zip(("metrics", "step", "prefix"), args, strict=False)) | kwargs
        metrics, step = named.get("metrics"), named.get("step")
        prefix = named.get("prefix") or ""
        if self._pending and isinstance(step, int) and isinstance(prefix, str):
            if self._step is not None and step > self._step and not self._ended:
                self._end_step()
            if self._pending:
                if self._first is None and isinstance(metrics, Mapping):  # until step 1's check
                    self._logged.setdefault(step, set()).update(map(str, metrics))
                ends_step = prefix.startswith("timing/train")
                if (prefix == "train" or ends_step) and (self._step is None or step > self._step):
                    self._step, self._ended = step, False  # a new step
                if ends_step and self._step == step and not self._ended:
                    self._end_step()
        return self._logger.log_metrics(*args, **kwargs)

    def check(self) -> None:
        """End the step being logged (the trainer returned); raises as a step's end does."""
        if self._pending and self._step is not None and not self._ended:
            self._end_step()
        elif self._step is None and self.policy is not None and self.policy.seen:
            self.error = MMPOInputError(
                f"{where(self._trainer)} trained its policy and returned without logging a "
                "train or timing/train step, so nemo-mmpo could not check that its "
                f"{ESTIMATOR_METRICS} metrics reached the logger; please report the NeMo-RL "
                "version"
            )
            raise self.error

    def _has(self, key: str) -> bool:
        """Whether the step logged ``key`` (a prefix where it ends with ``/``)."""
        keys = self._logged.get(self._step, set())
        if key.endswith("/"):
            return any(logged.startswith(key) for logged in keys)
        return key in keys

    def _end_step(self) -> None:
        """Check what must have happened by the end of step ``self._step`` (raises if not,
        keeping the error in :attr:`error`)."""
        try:
            self._check_step()
        except MMPOInputError as error:
            self.error = error
            raise

    def _check_step(self) -> None:
        step, self._ended = self._step, True
        validated = state.RUN.in_loop_steps[self._validated_before :]
        if self._first is None:
            self._first = step
            self._check_first_step(step, validated)
            self._logged.clear()  # read only for the first step
            if self._val_period > 0:
                due = max(step, self._val_start_at, 1)
                self._validation_due = due + (-due) % self._val_period
        due = self._validation_due
        if due is not None and step >= due:
            self._validation_due = None
            if due not in validated:
                raise MMPOInputError(
                    f"evaluation.in_loop=true with grpo.val_period={self._val_period}: "
                    f"{where(self._trainer)} finished step {due} without running the paper's "
                    "evaluation (its validation was skipped or not called through nemo-mmpo's "
                    "hook), so the run stops rather than train without it: set "
                    "evaluation.in_loop=false and evaluate checkpoints with `nemo-mmpo eval "
                    "watch`, and please report the NeMo-RL version"
                )
        self._pending = self._validation_due is not None

    def _check_first_step(self, step: int, validated: list[int]) -> None:
        missing = [
            f"no {what} ({setting})" for key, what, setting in self._expected if not self._has(key)
        ]
        if missing:
            raise MMPOInputError(
                f"{where(self._trainer)} logged step {step}'s metrics with "
                f"{' and '.join(missing)}: nemo-mmpo's hooks ran, but what they add no longer "
                "reaches the logger in this NeMo-RL, so the run stops at its first step rather "
                "than train without them; please report the NeMo-RL version"
            )
        if self.policy is not None and not self.policy.seen:
            raise MMPOInputError(
                f"{where(self._trainer)} finished step {step} without handing its policy the "
                "advantages to train on through policy.train or policy.write_to_dataplane, "
                "where nemo-mmpo checks that they are its estimator's, so the run stops at its "
                "first step; please report the NeMo-RL version"
            )
        if self._validates_at_start and step == 1 and not any(s < step for s in validated):
            raise MMPOInputError(
                f"evaluation.in_loop=true with grpo.val_at_start=true: {where(self._trainer)} "
                "finished step 1 without running the paper's evaluation (its validation was "
                "skipped or not called through nemo-mmpo's hook), so the run stops rather than "
                "train without it: set evaluation.in_loop=false and evaluate checkpoints with "
                "`nemo-mmpo eval watch`, and please report the NeMo-RL version"
            )


def allowed_changes(master_config: Any, grpo_config_model: Any = None) -> dict[str, Any]:
    """What the recipe itself asks NeMo-RL to do to the estimator's advantages: the clip
    bounds (``low``, ``high``; keys read from NeMo-RL's config model,
    :func:`~nemo_mmpo.nemo_rl.estimator_settings.advantage_clip_keys`) and the message-level
    penalty values (:data:`PENALTY_KEYS`), each with the setting that asks for it."""
    grpo = sections.value(master_config, "grpo")
    changes: dict[str, Any] = {"low": None, "high": None, "penalties": [], "settings": []}
    for key in advantage_clip_keys(grpo_config_model):
        bound = sections.value(grpo, key)
        if bound is not None:
            side = "low" if key.endswith(("low", "min")) else "high"
            changes[side] = float(bound)
            changes["settings"].append(f"grpo.{key}={bound}")
    for key in PENALTY_KEYS:
        penalty = sections.value(grpo, key)
        if penalty is not None:
            changes["penalties"].append(float(penalty))
            changes["settings"].append(f"grpo.{key}={penalty}")
    return changes


def advantage_difference(
    received: torch.Tensor,
    received_mask: torch.Tensor,
    row_advantages: torch.Tensor,
    mask: torch.Tensor,
    changes: dict[str, Any],
) -> str | None:
    """How the advantages a loss receives differ from the estimator's, or None.

    Args:
        received: ``[batch, seq_len]`` advantages the policy trains on.
        received_mask: ``[batch, seq_len]`` the tokens its loss counts
            (``token_mask * sample_mask``).
        row_advantages: ``[batch]`` the estimator's per-response advantages.
        mask: ``[batch, seq_len]`` the token mask the estimator was given.
        changes: :func:`allowed_changes` (the recipe's clip bounds and penalty values).
    """
    if tuple(received.shape) != tuple(mask.shape):
        return f"advantages of shape {list(received.shape)} for the estimator's {list(mask.shape)}"
    counted, loss_counts = mask.cpu() != 0, received_mask.cpu() != 0
    left_out, added = int((counted & ~loss_counts).sum()), int((loss_counts & ~counted).sum())
    if left_out or added:
        return (
            f"a loss mask that leaves out {left_out} and adds {added} of the "
            f"{int(counted.sum())} tokens the estimator was given"
        )
    expected = row_advantages.cpu().double().unsqueeze(-1).expand(mask.shape)
    if changes["low"] is not None or changes["high"] is not None:
        expected = expected.clamp(min=changes["low"], max=changes["high"])
    values = received.detach().cpu().double()
    different = counted & ~torch.isclose(values, expected, rtol=1e-5, atol=1e-7)
    for penalty in changes["penalties"]:
        different &= values != penalty
    if not different.any():
        return None
    first = different.nonzero()[0].tolist()
    allowed = f" ({', '.join(changes['settings'])} allowed for)" if changes["settings"] else ""
    return (
        f"{int(different.sum())} of {int(counted.sum())} loss tokens differ (e.g. "
        f"{values[tuple(first)].item():.6g} where the estimator gave "
        f"{row_advantages[first[0]].item():.6g}){allowed}"
    )


class FirstStepPolicy:
    """NeMo-RL's ``policy``, passed through; the advantages of its first training call checked
    against the estimator's last output (module doc). ``estimator()`` returns the estimator the
    factory hook built last."""

    #: the calls that hand the policy its training batch's advantages
    TRAINING_CALLS = ("train", "write_to_dataplane")

    def __init__(
        self, policy: Any, trainer: str, estimator: Callable[[], Any], changes: dict[str, Any]
    ) -> None:
        self._policy = policy
        self._trainer = trainer
        self._estimator = estimator
        self._changes = changes
        #: whether a training call brought advantages (checked) yet
        self.seen = False
        #: the error the check raised (as :attr:`FirstStepLogger.error`)
        self.error: MMPOInputError | None = None

    def __getattr__(self, name: str) -> Any:
        if name == "_policy" or name.startswith("__"):  # copied or unpickled before __init__
            raise AttributeError(name)
        attribute = getattr(self._policy, name)
        if self.seen or name not in self.TRAINING_CALLS or not callable(attribute):
            return attribute

        def checked(*args: Any, **kwargs: Any) -> Any:
            if not self.seen:
                self._check_call(name, args, kwargs)
            return attribute(*args, **kwargs)

        return checked

    def _check_call(self, name: str, args: tuple, kwargs: dict) -> None:
        if name == "train":  # Policy.train(data, loss_fn, ...)
            batch = args[0] if args else kwargs.get("data")
        else:  # Policy.write_to_dataplane(meta, fields)
            batch = args[1] if len(args) > 1 else kwargs.get("fields")
        if not hasattr(batch, "get") or batch.get("advantages") is None:
            return
        self.seen = True
        estimator = self._estimator()
        output = getattr(estimator, "last_output", None)
        if output is None:
            difference = "advantages nemo-mmpo's estimator never computed"
        else:
            row_advantages, mask = output
            sample_mask = batch.get("sample_mask")
            token_mask = batch.get("token_mask", mask)
            loss_mask = token_mask if sample_mask is None else token_mask * sample_mask[:, None]
            difference = advantage_difference(
                batch["advantages"], loss_mask, row_advantages, mask, self._changes
            )
        if difference is not None:
            self.error = MMPOInputError(
                f"{where(self._trainer)} trains its first step ({name}) on {difference}: "
                "something between nemo-mmpo's estimator and NeMo-RL's loss changed them, so "
                "the run stops before training on them; please report the NeMo-RL version"
            )
            raise self.error
