"""The output contract of a registered loss or class estimator, checked where it runs.

A built loss travels to NeMo-RL's policy workers by pickle (and a class estimator to the single
controller's actor), so the check travels with the instance: :func:`checked` gives it a subclass
of its own class (same name, ``isinstance`` of everything it was) whose call is checked at its
first call in each process, and which pickles as "this class, checked, with this state".
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.estimators import advantage_problem

_SUBCLASSES: dict[tuple[type, str, str], type] = {}
#: the instances whose first call passed in this process (weakly: an id can be reused)
_PASSED: weakref.WeakSet[Any] = weakref.WeakSet()


def checked(instance: Any, kind: str, name: str) -> Any:
    """``instance`` as an instance of its class's checked subclass (``kind``: ``"loss"`` or
    ``"estimator"``; ``name``: its registered name, for the refusal)."""
    return _rebuild(type(instance), kind, name, instance.__dict__)


def _rebuild(cls: type, kind: str, name: str, state: dict[str, Any]) -> Any:
    subclass = _checked_subclass(cls, kind, name)
    instance = subclass.__new__(subclass)
    instance.__dict__.update(state)
    return instance


def _checked_subclass(cls: type, kind: str, name: str) -> type:
    key = (cls, kind, name)
    if key not in _SUBCLASSES:
        method = "__call__" if kind == "loss" else "compute_advantage"
        check = _loss_problem if kind == "loss" else _estimator_problem
        original = getattr(cls, method)

        @functools.wraps(original)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(self, *args, **kwargs)
            if self not in _PASSED:
                problem = check(result, args, kwargs)
                if problem is not None:
                    raise MMPOInputError(
                        f"{kind} {name!r} ({cls.__module__}.{cls.__qualname__}) {problem}"
                    )
                _PASSED.add(self)
            return result

        def reduce(self: Any, protocol: int = 2) -> tuple:
            return (_rebuild, (cls, kind, name, dict(self.__dict__)))

        _SUBCLASSES[key] = type(
            cls.__name__,
            (cls,),
            {
                method: call,
                "__reduce_ex__": reduce,
                "__module__": cls.__module__,
                "__qualname__": cls.__qualname__,
            },
        )
    return _SUBCLASSES[key]


def _tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    return [value for value in (*args, *kwargs.values()) if isinstance(value, torch.Tensor)]


def _loss_problem(result: Any, args: tuple, kwargs: dict) -> str | None:
    """A loss returns ``(loss, metrics)``: a finite scalar (with a gradient when its inputs
    have one) and a dict."""
    if not (isinstance(result, tuple) and len(result) == 2):
        return f"returned {type(result).__name__}; a loss returns (loss, metrics)"
    loss, metrics = result
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or loss.dim() > 1:
        shape = list(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        return f"returned a loss of shape {shape}; a loss is a scalar tensor (reduce it)"
    if not bool(torch.isfinite(loss.detach()).all()):
        return f"returned a loss of {loss.item()}; a loss is finite"
    with_grad = torch.is_grad_enabled() and any(t.requires_grad for t in _tensors(args, kwargs))
    if with_grad and not loss.requires_grad:
        return "returned a loss without a gradient (detached?); the policy could not train"
    if not isinstance(metrics, dict):
        return f"returned metrics of type {type(metrics).__name__}; metrics are a dict"
    return None


def _estimator_problem(result: Any, args: tuple, kwargs: dict) -> str | None:
    """``compute_advantage`` returns ``[batch, seq_len]`` advantages, the mask's shape (or an
    ``AdvantageResult`` holding them)."""
    advantages = getattr(result, "advantages", result)
    mask = kwargs.get("mask", args[2] if len(args) > 2 else None)
    shape = mask.shape if isinstance(mask, torch.Tensor) else getattr(advantages, "shape", ())
    problem = advantage_problem(advantages, shape)
    if problem is None:
        return None
    return (
        f"{problem}; compute_advantage returns [batch, seq_len] floating advantages (the "
        "mask's shape), finite everywhere (masked rows too), without a gradient"
    )
