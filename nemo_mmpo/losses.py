"""The loss registry: ``loss_fn.name`` values nemo-mmpo builds, and what each one needs.

A loss is a subclass of NeMo-RL's ``ClippedPGLossFn`` (checked when the NeMo-RL adapter builds
it, this module imports no NeMo-RL), registered as a class or as ``"module:Class"`` (resolved
when first built, so the dry run knows the name without NeMo-RL). Optional ``batch_terms``
(``fn(train_data, loss_config) -> metrics``, or ``"module:function"``) runs once per batch on
the driver after the advantages (DMPO's linearised penalty): only NeMo-RL's ``grpo_train`` and
``async_grpo_train`` call that hook, so the other trainers refuse such a loss. ``options`` are
the ``loss_fn`` keys it reads beyond NeMo-RL's, with their defaults, or a
:class:`~nemo_mmpo.settings.Settings` model (``"module:Model"``) that validates them.

The NeMo-RL adapter checks a built loss's output at its first call in each worker: a finite
scalar with a gradient, and a dict of metrics.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.plugins import load_from_environment
from nemo_mmpo.registry import (
    NEMO_RL_LOSSES,
    caller_module,
    check_name,
    refuse_if_frozen,
    registered_by,
)


@dataclass(frozen=True)
class RegisteredLoss:
    """One ``loss_fn.name``: its class (or ``"module:Class"``), per-batch terms, options."""

    name: str
    loss_class: type | str
    batch_terms: Callable[[Any, Any], dict[str, float]] | str | None
    options: dict[str, Any] | str
    needs_prev_logprobs: bool
    registered_by: str

    def resolve_class(self) -> type:
        return resolve(self.loss_class, f"loss {self.name!r}")

    def resolve_batch_terms(self) -> Callable[[Any, Any], dict[str, float]] | None:
        if self.batch_terms is None:
            return None
        return resolve(self.batch_terms, f"loss {self.name!r}'s batch_terms")

    def option_keys(self) -> tuple[str, ...]:
        if isinstance(self.options, dict):
            return tuple(self.options)
        return tuple(resolve(self.options, f"loss {self.name!r}'s options").model_fields)


_LOSSES: dict[str, RegisteredLoss] = {}


def resolve(target: Any, what: str) -> Any:
    """``target``, or the object a ``"module:qualname"`` string names."""
    if not isinstance(target, str):
        return target
    module, _, qualname = target.partition(":")
    try:
        value: Any = importlib.import_module(module)
        for part in qualname.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError) as error:
        raise MMPOInputError(f"{what}: cannot import {target!r}: {error}") from None
    return value


def register_loss(
    name: str,
    loss_class: type | str | None = None,
    *,
    batch_terms: Callable[[Any, Any], dict[str, float]] | str | None = None,
    options: dict[str, Any] | str | None = None,
    needs_prev_logprobs: bool = False,
) -> Any:
    """Make ``loss_fn.name: <name>`` build ``loss_class`` (a ``ClippedPGLossFn`` subclass built
    as NeMo-RL builds its own, ``loss_class(loss_config)``); a class decorator when
    ``loss_class`` is omitted.

    ``batch_terms``: a function run once per training batch in ``grpo_train`` and
    ``async_grpo_train`` (after the advantages and ``prev_logprobs``), which may add keys to
    NeMo-RL's ``train_data`` and returns metrics for the step. ``options``: the ``loss_fn`` keys
    it reads, ``{key: default}`` or a Settings model. ``needs_prev_logprobs``: it reads
    ``prev_logprobs`` (``loss_fn.force_on_policy_ratio`` is refused).

    Refused in one line: NeMo-RL's own name (``clipped_pg``), a name taken or a near miss of one,
    an option key another loss declares, or a registration after ``install()``.
    """
    if loss_class is None:
        return lambda cls: register_loss(
            name,
            cls,
            batch_terms=batch_terms,
            options=options,
            needs_prev_logprobs=needs_prev_logprobs,
        )
    origin = caller_module()
    existing = _LOSSES.get(name)
    if existing is not None and registered_by(existing.loss_class) == registered_by(loss_class):
        return loss_class  # the same module imported again (a worker, a re-import)
    refuse_if_frozen("loss", name)
    if existing is not None:
        raise MMPOInputError(
            f"register_loss({name!r}) from {origin}: {name!r} is already registered by "
            f"{existing.registered_by}; choose another name"
        )
    check_name("loss", name, {key: e.registered_by for key, e in _LOSSES.items()}, NEMO_RL_LOSSES)
    if not (isinstance(loss_class, type | str)):
        raise MMPOInputError(
            f"register_loss({name!r}) from {origin}: give a ClippedPGLossFn subclass or "
            f"'module:Class', not {loss_class!r}"
        )
    entry = RegisteredLoss(
        name, loss_class, batch_terms, options or {}, needs_prev_logprobs, origin
    )
    if isinstance(entry.options, dict):
        for other in _LOSSES.values():
            shared = set(entry.option_keys()) & set(other.option_keys())
            if shared:
                raise MMPOInputError(
                    f"register_loss({name!r}) from {origin}: loss_fn key(s) {sorted(shared)} "
                    f"are read by loss {other.name!r} already ({other.registered_by}); name "
                    "yours differently"
                )
    _LOSSES[name] = entry
    return loss_class


def loss_entry(name: Any) -> RegisteredLoss | None:
    """The registered loss ``name`` (None: not ours, e.g. NeMo-RL's ``clipped_pg``)."""
    if name not in _LOSSES:
        load_from_environment()
    return _LOSSES.get(name) if isinstance(name, str) else None


def loss_names() -> tuple[str, ...]:
    """The ``loss_fn.name`` values nemo-mmpo builds, in registration order."""
    load_from_environment()
    return tuple(_LOSSES)


def all_loss_names() -> tuple[str, ...]:
    """Ours and NeMo-RL's own (``clipped_pg``)."""
    return (*loss_names(), *NEMO_RL_LOSSES)


# --- the built-ins: MMPO's (NeMo-RL's surrogate as configured) and DMPO's -----------------------
register_loss("mmpo", "nemo_mmpo.nemo_rl.loss:MMPOClippedPGLossFn")
register_loss(
    "dmpo",
    "nemo_mmpo.nemo_rl.loss:DMPOLossFn",
    batch_terms="nemo_mmpo.nemo_rl.dmpo_batch_terms:batch_terms",
    options="nemo_mmpo.nemo_rl.dmpo_batch_terms:DMPOSettings",
    needs_prev_logprobs=True,
)
