"""What nemo-mmpo reads of NeMo-RL shapes newer than its v0.7.0 snapshot, in one place.

- Estimator names as a ``Literal`` in NeMo-RL's estimator config: there ``MasterConfig(**config)``
  would refuse ``name: mmpo`` before our factory hook is called. :func:`accept_our_estimator_names`
  adds our names to the ``Literal`` once and rebuilds, innermost first, every model of the chain
  not rebuilt since (estimator config, ``GRPOConfig``, each ``MasterConfig`` holding it: grpo's
  and the single controller's); every other name stays refused, and PPO's own ``Literal`` is left
  alone. :func:`unreachable_literal` names a ``Literal`` the chain cannot reach (a union of models
  on the way), which ``install()`` refuses. Where ``name`` is a plain ``str`` nothing changes.
- ``AdvantageResult`` (:func:`advantage_result_type`): estimators return advantages and metrics.
- Row validity passed to ``compute_advantage`` under NeMo-RL's keyword (:func:`row_mask_keywords`).

The hooks for the newer single controller (a factory imported inside ``_build_advantage_estimator``,
the pool of advantage actors, the advantage stage's own module) are entries of the hook table
(:data:`~nemo_mmpo.nemo_rl.hooks.HOOKS`, marked ``required=False`` or ``follow``) and of
:mod:`~nemo_mmpo.nemo_rl.actor_hooks`; their history is in docs/integration-history.md. No
``nemo_rl`` import at import time here.
"""

from __future__ import annotations

import types
import typing
import weakref
from typing import Any, Literal

from nemo_mmpo.nemo_rl.estimator_settings import estimator_names


def _model_in(annotation: Any) -> type | None:
    """The pydantic model ``annotation`` names (itself, or the one model in a union)."""
    if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [_model_in(argument) for argument in typing.get_args(annotation)]
        models = [model for model in models if model is not None]
        return models[0] if len(models) == 1 else None
    return None


def estimator_config_models(master_config: type) -> list[type]:
    """``[estimator config, GRPOConfig, MasterConfig]`` where each is a pydantic model (the
    estimator config inside ``grpo``, inside ``master_config``), innermost first; shorter where
    a section is a ``TypedDict``."""
    chain = [master_config]
    for key in ("grpo", "adv_estimator"):
        fields = getattr(chain[-1], "model_fields", None) or {}
        inner = _model_in(fields[key].annotation) if key in fields else None
        if inner is None:
            return []
        chain.append(inner)
    return chain[::-1]


#: model -> the ``Literal`` of estimator names it was last rebuilt with (by us)
_built_with: weakref.WeakKeyDictionary[type, Any] = weakref.WeakKeyDictionary()


def _models_in(annotation: Any) -> list[type]:
    """Every pydantic model ``annotation`` names (itself, or the models of a union)."""
    if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
        return [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [model for argument in typing.get_args(annotation) for model in _models_in(argument)]
    return []


def accept_our_estimator_names(master_config: type) -> list[str]:
    """Add our names to a ``Literal`` ``grpo.adv_estimator.name`` of ``master_config`` (a
    pydantic ``MasterConfig``) and rebuild the models holding it that are not yet rebuilt with
    it (also when another ``MasterConfig`` holding the same ``GRPOConfig`` added them first);
    returns the models rebuilt (none when ``name`` is not a ``Literal`` or all are current).
    Idempotent."""
    chain = estimator_config_models(master_config)
    if not chain or "name" not in chain[0].model_fields:
        return []
    field = chain[0].model_fields["name"]
    if typing.get_origin(field.annotation) is not Literal:
        return []
    allowed = typing.get_args(field.annotation)
    missing = tuple(name for name in estimator_names() if name not in allowed)
    if missing:
        field.annotation = Literal[(*allowed, *missing)]
    rebuilt = []
    for model in chain:  # innermost first: each rebuild embeds the rebuilt schema inside it
        if rebuilt or missing or _built_with.get(model) != field.annotation:
            model.model_rebuild(force=True)
            _built_with[model] = field.annotation
            rebuilt.append(model.__qualname__)
    return rebuilt


def unreachable_literal(master_config: type) -> str | None:
    """Why our names cannot be valid in ``master_config``: an estimator config under ``grpo``
    whose ``name`` is a ``Literal`` without them (after :func:`accept_our_estimator_names`),
    which only a shape it does not know leaves so; None when there is none."""
    fields = getattr(master_config, "model_fields", None) or {}
    if "grpo" not in fields:
        return None
    for grpo in _models_in(fields["grpo"].annotation):
        estimator = grpo.model_fields.get("adv_estimator")
        for model in _models_in(estimator.annotation) if estimator is not None else []:
            name = model.model_fields.get("name")
            if name is None or typing.get_origin(name.annotation) is not Literal:
                continue
            missing = [n for n in estimator_names() if n not in typing.get_args(name.annotation)]
            if missing:
                return (
                    f"grpo.adv_estimator.name is a Literal of NeMo-RL's names "
                    f"({', '.join(map(repr, typing.get_args(name.annotation)))}) in "
                    f"{model.__qualname__}, which nemo-mmpo cannot reach to add "
                    f"{', '.join(missing)} (grpo or adv_estimator is a union of several "
                    "models): MasterConfig(**config) would refuse our estimator names"
                )
    return None


def advantage_result_type() -> type | None:
    """NeMo-RL's ``AdvantageResult`` when the installed NeMo-RL has one (else None)."""
    try:
        from nemo_rl.algorithms import advantage_estimator
    except ImportError:
        return None
    return getattr(advantage_estimator, "AdvantageResult", None)


#: our own keyword for row validity (``[batch]``, 0: the row takes no part in its group)
VALID_MASK = "valid_mask"


def row_mask_keywords() -> tuple[str, ...]:
    """The keywords NeMo-RL passes row validity under: ``valid_mask``, and every
    ``*_mask`` parameter but the token ``mask`` that NeMo-RL's own GRPO estimator declares in
    ``compute_advantage`` (read from its signature, so a NeMo-RL that passes it as, say,
    ``sample_mask=`` has our estimator read it too, not swallow it in ``**kwargs``)."""
    import inspect

    try:
        from nemo_rl.algorithms.advantage_estimator import GRPOAdvantageEstimator

        parameters = inspect.signature(GRPOAdvantageEstimator.compute_advantage).parameters
    except (ImportError, AttributeError, TypeError, ValueError):
        return (VALID_MASK,)
    theirs = [name for name in parameters if name.endswith("_mask") and name != VALID_MASK]
    return (VALID_MASK, *theirs)
