"""Typed settings: one way to check a config section (pydantic, strict, unknown keys refused).

Every settings section nemo-mmpo reads (``grpo.adv_estimator``, DMPO's ``loss_fn`` keys,
``cpu_backend``, the study's) is a :class:`Settings` model: types are strict (an integer is
not a float, ``"3"`` is not a number, ``true`` is not 1), bounds are ``Field`` constraints, and
an unknown key is an error. :func:`parse` turns pydantic's errors into one line that names the
key, the value and what is accepted, e.g. ``grpo.adv_estimator.truncation_order=0: give a value
>= 1``.

Needs pydantic (in NeMo-RL's environment, and in the ``test`` and ``launch`` extras); the core
estimator library does not import this module.

A setting that validates but that nothing reads in the chosen configuration (``k`` under
``name: maxrl``, DMPO's keys under another loss, a disabled section's keys) is reported, not
refused (:func:`changed_settings`, :func:`report_unread`): a sweep or a shared recipe that
carries it stays runnable, and the dry run, the constructors and the run's log name it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from nemo_mmpo.errors import MMPOInputError

SettingsType = TypeVar("SettingsType", bound="Settings")


class Settings(BaseModel):
    """A config section: strict types, ``Field`` bounds, no unknown keys, immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


_HINTS = {
    "int_type": "give an integer",
    "float_type": "give a number",
    "bool_type": "give true or false",
    "string_type": "give a string",
    "dict_type": "give a mapping",
    "model_type": "give a mapping of settings",
    "greater_than_equal": "give a value >= {ge}",
    "greater_than": "give a value > {gt}",
    "less_than_equal": "give a value <= {le}",
    "less_than": "give a value < {lt}",
}


def _describe(error: dict[str, Any], where: str, model: type[BaseModel]) -> str:
    location = [str(part) for part in error["loc"] if not str(part).startswith("function-")]
    key = ".".join([where, *location]) if where else ".".join(location)
    if error["type"] == "extra_forbidden":
        owner: Any = model
        for part in location[:-1]:
            field = owner.model_fields.get(part)
            owner = getattr(field, "annotation", None) if field else None
        known = sorted(getattr(owner, "model_fields", {}) or {})
        given = f"{key}={error['input']!r}"
        return f"{given} is not a setting" + (f"; known: {', '.join(known)}" if known else "")
    hint = _HINTS.get(error["type"])
    if hint is not None:
        hint = hint.format(**(error.get("ctx") or {}))
    else:
        hint = error["msg"][0].lower() + error["msg"][1:]
        hint = hint.removeprefix("value error, ")
    return f"{key}={error['input']!r}: {hint}"


def parse(model: type[SettingsType], values: Any, where: str = "") -> SettingsType:
    """``model`` from ``values`` (a mapping, None for the defaults, or a model already);
    raises :class:`~nemo_mmpo.errors.MMPOInputError` naming the first bad key."""
    if isinstance(values, model):
        return values
    try:
        return model.model_validate({} if values is None else values)
    except ValidationError as error:
        raise MMPOInputError(_describe(error.errors()[0], where, model)) from None


def _comparable(item: Any) -> Any:
    """``item`` with models dumped and tuples as lists, so a YAML value equals its default."""
    if isinstance(item, BaseModel):
        item = item.model_dump()
    if isinstance(item, dict):
        return {key: _comparable(inner) for key, inner in item.items()}
    if isinstance(item, list | tuple):
        return [_comparable(inner) for inner in item]
    return item


def changed_settings(model: type[Settings], values: Any, keys: Iterable[str]) -> dict[str, Any]:
    """``{key: value}`` for each of ``keys`` that ``values`` (a mapping) holds with a value other
    than ``model``'s default for it: what a user set and would expect to matter."""
    values = values or {}
    changed = {}
    for key in keys:
        if key not in values:
            continue
        field = model.model_fields.get(key)
        default = None if field is None else field.get_default(call_default_factory=True)
        if _comparable(values[key]) != _comparable(default):
            changed[key] = values[key]
    return changed


def assignments(section: str, values: dict[str, Any]) -> str:
    """``section.key=value, ...`` of ``values``, as a user writes them in an override."""
    return ", ".join(f"{section}.{key}={value!r}" for key, value in values.items())


def unread_when_disabled(model: type[Settings], values: Any, where: str, effect: str) -> list[str]:
    """With ``where.enabled: false``, one message naming the section's other keys that are set
    to a non-default value (nothing reads them; ``effect`` says what runs instead); else none."""
    keys = [key for key in model.model_fields if key != "enabled"]
    changed = changed_settings(model, values, keys)
    if not changed:
        return []
    verb = "is" if len(changed) == 1 else "are"
    return [f"{where}.enabled=false, so {assignments(where, changed)} {verb} not read; {effect}"]


_REPORTED: set[str] = set()


def report_unread(messages: Iterable[str]) -> None:
    """Print each message about a setting that nothing reads, once per process.

    The estimator and the losses call it at construction; the entry point prints the same
    messages in the run plan first and marks them (:func:`mark_reported`), so a run's log holds
    each once.
    """
    for message in messages:
        if message not in _REPORTED:
            _REPORTED.add(message)
            print(f"[nemo-mmpo] WARNING: {message}", flush=True)


def mark_reported(messages: Iterable[str]) -> None:
    """Record ``messages`` as printed already (see :func:`report_unread`)."""
    _REPORTED.update(messages)
