"""``grpo.adv_estimator`` when one of ours is selected: typed, with options from the registry.

Each estimator has one spelling (``name: mmpo`` with ``estimator:``, or a baseline's own
``name:``), reachable without an edit here once registered. The keys (docs/keys.md) include each
registered estimator's options, typed from its signature, and NeMo-RL's own estimator keys;
anything else is refused by name. The model is built when first used, so it does not depend on
what the process imported before. :func:`unread_estimator_settings` reports a key the chosen
estimator does not read; :func:`group_size_problem` the group size an estimator declared.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import Field, create_model

from nemo_mmpo import sections
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.estimators import (
    available_estimators,
    estimator_class,
    estimator_families,
    estimator_family,
    estimator_objective_kind,
    estimator_options,
    group_size_need,
    registration_order,
)
from nemo_mmpo.nemo_rl.names import NEMO_RL_ESTIMATOR_KEYS, NEMO_RL_ESTIMATORS, near_miss
from nemo_mmpo.objectives import (
    TRANSFORM_KIND,
    TRANSFORM_PARAMETERS,
    TRANSFORMS,
    MomentObjective,
    moment_objective,
)
from nemo_mmpo.settings import Settings, changed_settings, parse

ESTIMATOR_SECTION = "grpo.adv_estimator"


def default_family() -> str:
    """The ``grpo.adv_estimator.name`` a section without one selects: the first family
    registered (the built-in moment estimators')."""
    return estimator_families()[0]


def family_members(family: str | None = None) -> tuple[str, ...]:
    """Registered estimators chosen with ``name: <family>, estimator: <this>`` (the default
    family's when ``family`` is None), the family's default first."""
    family = default_family() if family is None else family
    return tuple(name for name in registration_order() if estimator_family(name) == family)


def mmpo_formulas() -> tuple[str, ...]:
    """Every registered estimator selected through a family's ``estimator`` key."""
    return tuple(name for name in available_estimators() if estimator_family(name) is not None)


def estimator_names() -> tuple[str, ...]:
    """``grpo.adv_estimator.name`` values nemo-mmpo serves: the families, then the estimators
    selected by their own name."""
    formulas = set(mmpo_formulas())
    return (
        *estimator_families(),
        *(name for name in available_estimators() if name not in formulas),
    )


def is_our_estimator(name: Any) -> bool:
    """Whether ``grpo.adv_estimator.name`` selects a nemo-mmpo estimator."""
    return name in estimator_names()


def is_function_estimator(master_config: Any) -> bool:
    """Whether the master config selects one of our estimators registered as a function of
    reward groups (in ``MMPOAdvantageEstimator``, with its ``mmpo/`` metrics and first-step
    checks), not a class."""
    section = sections.value(master_config, ESTIMATOR_SECTION)
    if not is_our_estimator(sections.value(section, "name")):
        return False
    return estimator_class(read_estimator_settings(section).estimator) is None


def _option_field(annotation: Any, default: Any) -> tuple[Any, Any]:
    if annotation is int or annotation == int | None:
        return Annotated[annotation, Field(ge=1)], default  # orders and k are >= 1
    return annotation, default


@functools.cache
def _section_model(registered: tuple[str, ...]) -> type[Settings]:
    """The ``grpo.adv_estimator`` model for the estimators registered now (cached by them)."""
    options: dict[str, tuple[Any, Any]] = {}
    for name in registered:
        for key, option in estimator_options(name).items():
            options.setdefault(key, _option_field(option.annotation, option.default))
    return create_model(
        "AdvantageEstimatorSection",
        __base__=Settings,
        name=(str, default_family()),
        estimator=(str | None, family_members()[0]),  # the default family's default
        truncation_order=(Annotated[int, Field(ge=1)], 4),
        moment_transform=(Literal[TRANSFORMS], "none"),  # type: ignore[valid-type]
        transform_constant=(float | None, None),
        transform_alpha=(float | None, None),
        transform_beta=(float | None, None),
        reward_threshold=(float | None, None),
        **options,
        **dict.fromkeys(NEMO_RL_ESTIMATOR_KEYS, (Any, None)),
    )


def section_model() -> type[Settings]:
    return _section_model(tuple(available_estimators()))


@dataclass(frozen=True)
class EstimatorSettings:
    """The validated ``grpo.adv_estimator`` of one of our estimators.

    ``estimator`` is the core registry name, ``objective`` the moment objective whose gradient
    it estimates, ``options`` its keyword options and ``truncation_order`` the number of
    failure moments reported in the metrics.
    """

    name: str
    estimator: str
    objective: MomentObjective
    options: dict[str, Any] = field(default_factory=dict)
    truncation_order: int = 4
    reward_threshold: float | None = None

    def describe(self) -> str:
        options = ", ".join(f"{key}={value!r}" for key, value in self.options.items())
        return (
            f"{self.name} -> estimator {self.estimator}({options}), objective "
            f"{self.objective.name}, a_k = {list(self.objective.coefficients)}"
        )


def _objective(kind: str, section: Any, options: dict[str, Any]) -> MomentObjective:
    order = section.truncation_order
    if kind == TRANSFORM_KIND:
        return moment_objective(
            kind,
            order,
            transform=section.moment_transform,
            constant=section.transform_constant,
            alpha=section.transform_alpha,
            beta=section.transform_beta,
        )
    if kind == "pass_at_k":
        return moment_objective("pass_at_k", k=options["k"])
    if kind == "maxrl":
        return moment_objective("maxrl", options.get("maclaurin_order") or order)
    return moment_objective(kind, order)


def read_estimator_settings(config: Any) -> EstimatorSettings:
    """Validate ``grpo.adv_estimator`` (a mapping or a pydantic model) into settings.

    Raises:
        MMPOInputError: naming the offending key, its value and what is accepted.
    """
    values = {key: sections.value(config, key) for key in sections.present_keys(config)}
    name = values.get("name", default_family())
    names = estimator_names()
    if name not in names:
        hint = ""
        spelling = near_miss(name, names)
        if spelling is not None:
            hint = f" (names are matched exactly: did you mean {spelling!r}?)"
        elif name in mmpo_formulas():
            family = estimator_family(name)
            hint = f" ({name!r} is a formula of {family}: name={family}, estimator={name})"
        ours = [
            f"{family} (estimator: {', '.join(family_members(family))})"
            for family in estimator_families()
        ] + [name for name in names if name not in estimator_families()]
        raise MMPOInputError(
            f"{ESTIMATOR_SECTION}.name={name!r} is not valid: nemo-mmpo provides "
            f"{', '.join(ours)}; NeMo-RL provides {', '.join(NEMO_RL_ESTIMATORS)}{hint}"
        )
    section = parse(section_model(), values, ESTIMATOR_SECTION)
    if name in estimator_families():
        members = family_members(name)
        estimator = members[0] if section.estimator is None else section.estimator
        if estimator not in members:
            others = [other for other in names if other not in estimator_families()]
            raise MMPOInputError(
                f"{ESTIMATOR_SECTION}.estimator={estimator!r} is not valid: with name={name} "
                f"choose one of {', '.join(members)} (estimators with their own name: "
                f"{', '.join(others)})"
            )
    else:
        estimator = name
    options = {key: getattr(section, key) for key in estimator_options(estimator)}
    try:
        objective = _objective(estimator_objective_kind(estimator), section, options)
    except MMPOInputError as error:
        raise MMPOInputError(f"{ESTIMATOR_SECTION}: {error}") from None
    return EstimatorSettings(
        name=name,
        estimator=estimator,
        objective=objective,
        options=options,
        truncation_order=section.truncation_order,
        reward_threshold=section.reward_threshold,
    )


def _chosen(settings: EstimatorSettings) -> str:
    if settings.name in estimator_families():
        return f"{ESTIMATOR_SECTION}.estimator={settings.estimator}"
    return f"{ESTIMATOR_SECTION}.name={settings.name}"


def _keys_read(settings: EstimatorSettings, transform: str) -> set[str]:
    """The section's keys the chosen estimator and its objective read (``truncation_order``
    always: the step metrics report that many failure moments)."""
    keys = {"name", "truncation_order", "reward_threshold", *estimator_options(settings.estimator)}
    if settings.name in estimator_families():
        keys.add("estimator")
    if _reads_transform(settings.estimator):
        keys.add("moment_transform")
        keys.update(f"transform_{parameter}" for parameter in TRANSFORM_PARAMETERS[transform])
    return keys


def _reads_transform(name: str) -> bool:
    """Whether estimator ``name`` targets the moment objective, whose U transform it reads."""
    return estimator_objective_kind(name) == TRANSFORM_KIND


def _selected(name: str) -> str:
    family = estimator_family(name)
    return name if family is None else f"{family}/{name}"


def _readers(key: str) -> str:
    """Who reads ``key``, as the user selects them."""
    if key == "estimator":
        return f"read only with name={' or '.join(estimator_families())}"
    moment_formulas = [_selected(name) for name in available_estimators() if _reads_transform(name)]
    if key == "moment_transform":
        return f"read by {', '.join(moment_formulas)}"
    if key.startswith("transform_"):
        transforms = [
            transform
            for transform, parameters in TRANSFORM_PARAMETERS.items()
            if key.removeprefix("transform_") in parameters
        ]
        return (
            f"read with moment_transform={' or '.join(transforms)}, by {', '.join(moment_formulas)}"
        )
    readers = [_selected(name) for name in available_estimators() if key in estimator_options(name)]
    return f"read by {', '.join(readers)}"


def unread_estimator_settings(config: Any) -> list[str]:
    """One message for each key of ``grpo.adv_estimator`` set to a value other than its default
    that the chosen estimator does not read, naming the key, the value and who reads it.

    NeMo-RL's own keys (:data:`NEMO_RL_ESTIMATOR_KEYS`) are left out: NeMo-RL's base recipes
    carry them for its estimators. Raises like :func:`read_estimator_settings` on a bad section.
    """
    settings = read_estimator_settings(config)
    values = {key: sections.value(config, key) for key in sections.present_keys(config)}
    transform = values.get("moment_transform", "none")
    read = _keys_read(settings, transform) | set(NEMO_RL_ESTIMATOR_KEYS)
    unread = changed_settings(section_model(), values, [key for key in values if key not in read])
    return [
        f"{ESTIMATOR_SECTION}.{key}={value!r} is not read with {_chosen(settings)}"
        f"{f' and moment_transform={transform}' if key.startswith('transform_') else ''}: "
        f"it is {_readers(key)}; this run ignores it"
        for key, value in unread.items()
    ]


def group_size_problem(settings: EstimatorSettings, group_size: int) -> str | None:
    """Why ``grpo.num_generations_per_prompt=group_size`` is too small for the chosen estimator
    (the need it declared with its registration), or None."""
    need = group_size_need(settings.estimator, settings.objective, settings.options)
    if need is None or group_size >= need.minimum:
        return None
    return (
        f"{_chosen(settings)} with grpo.num_generations_per_prompt={group_size}: it needs "
        f"{need.requirement}; {need.remedy}"
    )


#: NeMo-RL's settings that clamp every estimator's advantages after it (``_clip_grpo_advantages``
#: in ``grpo_train``, ``async_grpo_train`` and ``grpo_train_sync``; the single controller's stage)
ADVANTAGE_CLIP_KEYS = ("advantage_clip_low", "advantage_clip_high")


def advantage_clip_keys(grpo_config_model: Any) -> tuple[str, ...]:
    """The keys of NeMo-RL's GRPO config model (``GRPOConfig``: a ``TypedDict`` on v0.7.0, a
    pydantic model on main) that clip advantages: each key naming both ``adv`` and ``clip``
    (``advantage_clip_low``/``_high`` today), read from the model, so renamed keys are still
    warned about; :data:`ADVANTAGE_CLIP_KEYS` where the model is unreadable."""
    fields = getattr(grpo_config_model, "model_fields", None)
    if not isinstance(fields, dict):
        fields = getattr(grpo_config_model, "__annotations__", None)
    if not isinstance(fields, dict):
        return ADVANTAGE_CLIP_KEYS
    return tuple(key for key in fields if "adv" in key and "clip" in key)


def advantage_clip_warning(
    settings: EstimatorSettings, grpo_config: Any, keys: tuple[str, ...] = ADVANTAGE_CLIP_KEYS
) -> str | None:
    """One line when an advantage clip of NeMo-RL's (``keys``: :func:`advantage_clip_keys`,
    ``grpo.advantage_clip_low``/``_high`` today) is set: NeMo-RL clamps the advantages our
    estimator computed, so the run does not train the chosen objective's gradient; None when
    none is set."""
    clips = {key: clip for key in keys if (clip := sections.value(grpo_config, key)) is not None}
    if not clips:
        return None
    weight = ""
    if _reads_transform(settings.estimator):
        weight_max = sum(settings.objective.weight_coefficients())
        weight = f" (MMPO's weight reaches {weight_max:g} at f = 1)"
    return (
        f"{', '.join(f'grpo.{key}={clip}' for key, clip in clips.items())}: NeMo-RL clamps the "
        f"advantages after nemo-mmpo's estimator ({_chosen(settings)}), so the run does not "
        f"train the {settings.objective.name} objective's gradient{weight}; set them to null "
        "to train it unclipped"
    )
