"""The first-step checks of NeMo-RL's single controller, inside its ``SingleControllerActor``
(the other trainers': :mod:`nemo_mmpo.nemo_rl.outcomes`), through the names
:mod:`~nemo_mmpo.nemo_rl.actor_hooks` wraps there: :func:`checked_logger` (the first step's
``train`` log must hold ``mmpo/``) and :func:`check_put` (each first-step chunk's advantages put
for the loss must be the estimator's last output on its mask; the controller applies no clip or
penalty, a stage in its own module only those its GRPO config asks for). Otherwise the actor
stops in one line, which the driver prints from Ray's ``RayTaskError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.nemo_rl.outcomes import FirstStepLogger, advantage_difference, allowed_changes

TRAINER = "single controller (run_grpo_single_controller.py)"
#: the data-plane fields ``_advantage_stage`` puts (named in NeMo-RL's ``AdvantageConfig``)
ADVANTAGES_FIELD = "advantages"
SAMPLE_MASK_FIELD = "sample_mask"


def checked_logger(logger: Any, estimator: Any) -> Any:
    """The actor's ``logger``, checked at the end of its first step for ``estimator``'s
    ``mmpo/`` metrics (the controller refuses DMPO and validation, so nothing else is due)."""
    config = {"grpo": {"adv_estimator": {"name": estimator.settings.name}}}
    checked = FirstStepLogger(logger, TRAINER, config)
    return checked if checked.checks_anything else logger


def put_difference(
    fields: Mapping[str, Any], output: tuple[Any, Any], clip_config: Any = None
) -> str | None:
    """How the ``fields`` the controller puts for the loss differ from ``output``, the
    estimator's ``(row advantages, mask)`` for the same chunk; None where they do not. The loss
    counts ``token_mask * sample_mask``: the estimator's mask, where the controller puts no
    ``sample_mask``; else the estimator's mask on the rows that put ``sample_mask`` keeps.
    ``clip_config``: the GRPO config the stage clipped by (its clip bounds and penalty values
    allowed); None: no change allowed."""
    row_advantages, mask = output
    advantages = fields.get(ADVANTAGES_FIELD)
    if advantages is None:
        return f"no {ADVANTAGES_FIELD!r} field (it puts {', '.join(map(repr, fields))})"
    sample_mask = fields.get(SAMPLE_MASK_FIELD)
    loss_mask = mask if sample_mask is None else mask * (sample_mask.reshape(-1, 1) != 0)
    if clip_config is None:  # main's controller: no clip, no penalty
        changes = allowed_changes({"grpo": {}})
    else:  # the stage's clip (keys read from the config's own model) and penalties
        model = type(clip_config) if hasattr(type(clip_config), "model_fields") else None
        changes = allowed_changes({"grpo": clip_config}, model)
    return advantage_difference(advantages, loss_mask, row_advantages, mask, changes)


def check_put(
    fields: Mapping[str, Any], output: tuple[Any, Any], where: str, clip_config: Any = None
) -> None:
    """Raise where the first step's ``fields`` for the loss are not the estimator's
    ``output`` (:func:`put_difference`, allowing what ``clip_config`` asks for); ``where``: the
    put's ``module.function``."""
    difference = put_difference(fields, output, clip_config)
    if difference is None:
        return
    from nemo_mmpo.nemo_rl.contract import nemo_rl_version

    raise MMPOInputError(
        f"NeMo-RL {nemo_rl_version()}'s {TRAINER} puts its first step's advantages for the "
        f"loss ({where}) not as nemo-mmpo's estimator gave them: {difference}; something "
        "between the estimator and the data plane changed them (a clip or another mask), so "
        "the run stops before training on them; please report the NeMo-RL version"
    )
