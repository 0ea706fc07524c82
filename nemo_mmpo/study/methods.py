"""The methods a study compares: each is a set of overrides of the tiny CPU recipe.

The paper's comparison (:data:`METHODS`): GRPO (NeMo-RL's own estimator), pass@K training
(``passk_chen``, K = 3), MaxRL, DMPO (lambda 2, alpha 1/15, on GRPO's advantages) and MMPO
(T = 4, plug-in). Its ablations (:data:`ABLATIONS`): T in {2, 3, 8}, U = 0.8, U ~ Beta(1, 2)
and the unbiased estimator. Every method trains the same task, model, warm start (per seed),
data order and steps; only the advantage (and for DMPO the loss) differs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Method:
    """A named set of recipe overrides."""

    name: str
    label: str
    overrides: tuple[str, ...]


GRPO_ESTIMATOR = ("grpo.adv_estimator.name=grpo", "grpo.normalize_rewards=true")

METHODS = {
    method.name: method
    for method in (
        Method("grpo", "GRPO", GRPO_ESTIMATOR),
        Method(
            "passk",
            "pass@K (K=3)",
            ("grpo.adv_estimator.name=passk_chen", "grpo.adv_estimator.k=3"),
        ),
        Method("maxrl", "MaxRL", ("grpo.adv_estimator.name=maxrl",)),
        Method("dmpo", "DMPO", (*GRPO_ESTIMATOR, "loss_fn.name=dmpo")),
        Method("mmpo", "MMPO (T=4)", ("grpo.adv_estimator.truncation_order=4",)),
    )
}

ABLATIONS = {
    method.name: method
    for method in (
        Method("mmpo_t2", "MMPO (T=2)", ("grpo.adv_estimator.truncation_order=2",)),
        Method("mmpo_t3", "MMPO (T=3)", ("grpo.adv_estimator.truncation_order=3",)),
        Method("mmpo_t8", "MMPO (T=8)", ("grpo.adv_estimator.truncation_order=8",)),
        Method(
            "mmpo_u08",
            "MMPO (U=0.8)",
            (
                "grpo.adv_estimator.moment_transform=constant",
                "grpo.adv_estimator.transform_constant=0.8",
            ),
        ),
        Method(
            "mmpo_beta12",
            "MMPO (U~Beta(1,2))",
            (
                "grpo.adv_estimator.moment_transform=beta",
                "grpo.adv_estimator.transform_alpha=1.0",
                "grpo.adv_estimator.transform_beta=2.0",
            ),
        ),
        Method("mmpo_unbiased", "MMPO (T=4, unbiased)", ("grpo.adv_estimator.estimator=unbiased",)),
    )
}

ALL_METHODS = {**METHODS, **ABLATIONS}
#: The method every other is compared with (paired by seed).
REFERENCE = "grpo"
#: The paper's method: the report also gives its paired difference from every other method.
PROPOSED = "mmpo"
