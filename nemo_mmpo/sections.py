"""One way to read a config section, whatever NeMo-RL hands over: plain mappings (v0.7.0's
``TypedDict``) or pydantic models with extra fields (main). :func:`value` reads a dotted path
through both, :func:`present_keys` the keys a section holds, :func:`plain` the section as plain
dicts and lists.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_MISSING = object()


def _child(node: Any, key: str) -> Any:
    if isinstance(node, Mapping):
        return node.get(key, _MISSING)
    fields = getattr(type(node), "model_fields", None)
    if fields is not None:
        if key in fields:  # a model built without validation may lack a declared field
            return getattr(node, key, _MISSING)
        return (getattr(node, "model_extra", None) or {}).get(key, _MISSING)
    return _MISSING


def value(config: Any, path: str, default: Any = None) -> Any:
    """The value at dotted ``path`` in ``config`` (mapping or pydantic model), else ``default``."""
    node = config
    for key in path.split("."):
        if node is None:
            return default
        node = _child(node, key)
        if node is _MISSING:
            return default
    return node


def present_keys(config: Any) -> list[str]:
    """The keys ``config`` holds: a mapping's keys, or a model's set fields and extras."""
    if config is None:
        return []
    if isinstance(config, Mapping):
        return list(config)
    fields = list(getattr(config, "model_fields_set", None) or [])
    return fields + [
        key for key in (getattr(config, "model_extra", None) or {}) if key not in fields
    ]


def plain(config: Any) -> Any:
    """``config`` as plain dicts and lists (pydantic models dumped, mappings copied)."""
    if hasattr(config, "model_dump"):
        return config.model_dump()
    if isinstance(config, Mapping):
        return {key: plain(item) for key, item in config.items()}
    if isinstance(config, list | tuple):
        return [plain(item) for item in config]
    return config


def is_single_controller(config: Mapping[str, Any]) -> bool:
    """Whether ``config`` is for NeMo-RL's single controller: it has an ``async_rl`` section
    (its ``MasterConfig`` requires it, ``single_controller_utils/config.py``; ``run_grpo.py``'s
    keeps it as an unread extra): ``nemo_mmpo.launch.trainers`` says why that decides."""
    return isinstance(config.get("async_rl"), Mapping)
