"""Our estimator names inside a NeMo-RL whose estimator config lists its own as a ``Literal``.

NeMo-RL pull request #3773 (merged after our main snapshot of 2026-08-22) types the estimator
config and narrows ``grpo.adv_estimator.name`` to a ``Literal`` of NeMo-RL's own names, so its
``MasterConfig(**config)`` in ``run_grpo.py`` would refuse ``name: mmpo`` before our factory
hook is ever called. :func:`accept_our_estimator_names` adds our names
(:func:`~nemo_mmpo.nemo_rl.estimator_settings.estimator_names`) to that ``Literal`` and rebuilds
the models that hold it (the estimator config, ``GRPOConfig``, ``MasterConfig``): every other
name stays refused as before. :func:`~nemo_mmpo.nemo_rl.install` applies it to the imported
NeMo-RL; the dry run to the ``MasterConfig`` it reads from the checkout's source
(:mod:`nemo_mmpo.launch.declared_types`). Where ``name`` is a plain ``str`` (v0.7.0's
``TypedDict``, main of 2026-08-22) nothing changes. No ``nemo_rl`` import here.
"""

from __future__ import annotations

import types
import typing
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


def accept_our_estimator_names(master_config: type) -> list[str]:
    """Add our names to a ``Literal`` ``grpo.adv_estimator.name`` of ``master_config`` (a
    pydantic ``MasterConfig``); returns the models rebuilt (none when ``name`` is not a
    ``Literal`` or already lists our names). Idempotent."""
    chain = estimator_config_models(master_config)
    if not chain or "name" not in chain[0].model_fields:
        return []
    field = chain[0].model_fields["name"]
    if typing.get_origin(field.annotation) is not Literal:
        return []
    allowed = typing.get_args(field.annotation)
    missing = tuple(name for name in estimator_names() if name not in allowed)
    if not missing:
        return []
    field.annotation = Literal[(*allowed, *missing)]
    for model in chain:  # innermost first: each rebuild embeds the rebuilt schema inside it
        model.model_rebuild(force=True)
    return [model.__qualname__ for model in chain]
