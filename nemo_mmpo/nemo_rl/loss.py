"""MMPO's loss for NeMo-RL: NeMo-RL's clipped surrogate, exactly as configured.

``loss_fn.name: mmpo`` computes what NeMo-RL's ``ClippedPGLossFn`` computes for the same
``loss_fn`` (the trainer reads that config too, e.g. to skip ``prev_logprobs`` or the reference
model, so a private rewrite would mis-train) and reports, once, the settings that differ from
the paper's (:data:`nemo_mmpo.nemo_rl.paper_settings.PAPER_LOSS_SETTINGS`). The ``mmpo/``
metrics are computed once per step by the estimator, not in every micro-batch here, so this loss
costs what NeMo-RL's does. ``loss_fn.name: dmpo`` is :class:`DMPOLossFn`. This module imports
``nemo_rl``: it is loaded by ``install()`` on the driver and by unpickling in the policy workers.
"""

from __future__ import annotations

from typing import Any

from nemo_rl.algorithms.loss import ClippedPGLossFn

from nemo_mmpo import sections
from nemo_mmpo.contracts import checked
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.losses import loss_entry, loss_names
from nemo_mmpo.nemo_rl import dmpo_batch_terms as dmpo
from nemo_mmpo.nemo_rl.names import DMPO_METRICS, NEMO_RL_LOSSES, near_miss
from nemo_mmpo.nemo_rl.paper_settings import paper_setting_deviations
from nemo_mmpo.settings import report_unread


class MMPOClippedPGLossFn(ClippedPGLossFn):
    """NeMo-RL's clipped policy-gradient loss, unchanged; reports non-paper settings once, and
    DMPO keys it does not read."""

    def __init__(self, cfg: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(cfg, *args, **kwargs)
        deviations = paper_setting_deviations(cfg)
        if deviations:
            name = sections.value(cfg, "name")
            print(
                f"[nemo-mmpo] loss_fn.name={name} with non-paper settings: {', '.join(deviations)}"
            )


class DMPOLossFn(ClippedPGLossFn):
    """DMPO (Li et al. 2026): NeMo-RL's clipped surrogate ``+ dmpo_weight * penalty``.

    The penalty is :func:`nemo_mmpo.dmpo.distribution_matching_penalty` over the whole batch,
    in the per-response linearised form of :mod:`nemo_mmpo.nemo_rl.dmpo_batch_terms` (exact in
    value and gradient at the first optimizer step of each batch; the same on every split of the
    batch).
    Adds the loss metric ``dmpo/penalty_term`` (summed over micro-batches: the penalty).
    Refuses ``force_on_policy_ratio`` (:func:`~nemo_mmpo.nemo_rl.dmpo_batch_terms.
    forced_ratio_problem`), as the dry run does, for drivers that build it themselves.
    """

    def __init__(self, cfg: Any, *args: Any, **kwargs: Any) -> None:
        problem = dmpo.forced_ratio_problem(cfg)
        if problem is not None:
            raise MMPOInputError(problem)
        super().__init__(cfg, *args, **kwargs)
        self.dmpo = dmpo.read_dmpo_settings(cfg)
        deviations = paper_setting_deviations(cfg) + self.dmpo.deviations()
        if deviations:
            name = sections.value(cfg, "name")
            print(
                f"[nemo-mmpo] loss_fn.name={name} with non-paper settings: {', '.join(deviations)}"
            )

    def __call__(
        self,
        next_token_logprobs: Any,
        data: Any,
        global_valid_seqs: Any,
        global_valid_toks: Any,
        *args: Any,
        **kwargs: Any,
    ) -> tuple[Any, dict]:
        loss, metrics = super().__call__(
            next_token_logprobs, data, global_valid_seqs, global_valid_toks, *args, **kwargs
        )
        term = dmpo.penalty_term(next_token_logprobs, data)
        loss = loss + self.dmpo.weight * term
        metrics["loss"] = loss.item()
        metrics[f"{DMPO_METRICS}penalty_term"] = term.item()
        return loss, metrics


def build_loss(original_class: type, cfg: Any, *args: Any, **kwargs: Any) -> Any:
    """The registered loss ``loss_fn.name`` (:mod:`nemo_mmpo.losses`), its output checked at its
    first call in each worker (:mod:`~nemo_mmpo.contracts`); NeMo-RL's ``original_class``
    for any other name. A name that misspells one of ours (``DMPO``, ``"dmpo "``) is refused,
    not trained as NeMo-RL's loss."""
    name = sections.value(cfg, "name")
    entry = loss_entry(name)
    if entry is None:
        spelling = near_miss(name, loss_names())
        if spelling is not None:
            raise MMPOInputError(
                f"loss_fn.name={name!r} is not nemo-mmpo's: names are matched exactly, and "
                f"NeMo-RL's ClippedPGLossFn would train under it without a word; did you mean "
                f"{spelling!r}? ({', '.join(NEMO_RL_LOSSES)} for NeMo-RL's loss)"
            )
        report_unread(dmpo.unread_dmpo_settings(cfg))  # e.g. loss_fn.dmpo_weight: clipped_pg
        report_unread(unread_loss_options(cfg))
        return original_class(cfg, *args, **kwargs)
    loss_class = entry.resolve_class()
    if not (isinstance(loss_class, type) and issubclass(loss_class, original_class)):
        raise MMPOInputError(
            f"loss {name!r} (registered by {entry.registered_by}): {loss_class!r} is not a "
            f"subclass of NeMo-RL's {original_class.__module__}.{original_class.__qualname__}, "
            "whose workers call it with that class's arguments; subclass it"
        )
    report_unread(dmpo.unread_dmpo_settings(cfg))
    report_unread(unread_loss_options(cfg))
    return checked(loss_class(cfg, *args, **kwargs), "loss", name)


def unread_loss_options(cfg: Any) -> list[str]:
    """``loss_fn`` keys of a registered loss other than the chosen one, set in ``cfg``."""
    name = sections.value(cfg, "name")
    present = set(sections.present_keys(cfg))
    return [
        f"loss_fn.{key}={sections.value(cfg, key)!r} is read only with loss_fn.name="
        f"{other}; this run ignores it"
        for other in loss_names()
        if other != name and isinstance(loss_entry(other).options, dict)
        for key, default in loss_entry(other).options.items()
        if key in present and sections.value(cfg, key) != default
    ]
