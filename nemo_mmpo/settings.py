"""Typed settings: one way to check a config section (pydantic, strict, unknown keys refused).

Every settings section nemo-mmpo reads (``grpo.adv_estimator``, DMPO's ``loss_fn`` keys,
``cpu_backend``, the study's) is a :class:`Settings` model: types are strict (an integer is
not a float, ``"3"`` is not a number, ``true`` is not 1), bounds are ``Field`` constraints, and
an unknown key is an error. :func:`parse` turns pydantic's errors into one line that names the
key, the value and what is accepted, e.g. ``grpo.adv_estimator.truncation_order=0: give a value
>= 1``.

Needs pydantic (in NeMo-RL's environment, and in the ``test`` and ``launch`` extras); the core
estimator library does not import this module.
"""

from __future__ import annotations

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
