"""The confirmatory study's registered plan, read from the plan itself.

``docs/results/confirmatory/plan.md`` holds, beside its text, one fenced block
```` ```json confirmatory-plan ```` with what the analysis needs: the two methods, the seeds,
the steps, the family-wise error rate, the primary claims (metric, the paper's sign, the
checkpoint) and the exploratory ones, and the arguments its power table was made with. The
analysis (:mod:`nemo_mmpo.study.confirm`) reads that block and nothing else, so the registered
text and the code that applies it cannot disagree: a change to what is tested is a change to
the committed plan, which shows in its history (and, by the plan's rule, as a dated amendment).
The block is in the plan rather than in a Python constant because the plan is the document that
is frozen before the runs; code may be refactored after them, the plan may not.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.study.methods import ALL_METHODS
from nemo_mmpo.study.power import CHECKPOINTS

#: The committed plan, relative to the repository root.
PLAN = Path("docs/results/confirmatory/plan.md")
#: The plan's machine-readable block.
BLOCK = re.compile(r"^```json confirmatory-plan[ \t]*\n(?P<json>.*?)^```[ \t]*$", re.S | re.M)
#: A dated amendment (the only way the plan changes after it is committed): ``date``, ``why``
#: and ``replace_seeds`` (``{"<planned seed>": <reserve seed>}``: a seed that could not be run
#: for a reason that is not its result, replaced by a reserve seed).
AMENDMENT = re.compile(
    r"^```json confirmatory-amendment[ \t]*\n(?P<json>.*?)^```[ \t]*$", re.S | re.M
)
#: A metric the paired tables give, or a contrast ``"a - b"`` of two.
METRIC = re.compile(r"^(average|never_solved|pass@\d+|gini@[0-9.]+)( - (pass@\d+|average))?$")
#: The most claims the primary family may hold (issue 48).
MOST_PRIMARY = 4


@dataclass(frozen=True)
class PlannedClaim:
    """``method`` minus ``other`` on ``metric`` at ``checkpoint`` (``final``: step ``steps``;
    ``selected``: the paper's rule), with the sign the paper predicts (+1 above zero)."""

    text: str
    metric: str
    sign: int
    checkpoint: str


@dataclass(frozen=True)
class Plan:
    """The registered plan (see the module docstring); ``sha256`` is the plan file's."""

    registered: str
    method: str
    other: str
    seeds: tuple[int, ...]
    reserve_seeds: tuple[int, ...]
    steps: int
    alpha: float
    primary: tuple[PlannedClaim, ...]
    secondary: tuple[PlannedClaim, ...]
    power: dict[str, Any]
    sha256: str
    amendments: tuple[dict[str, Any], ...] = ()


def _claims(entries: list[dict[str, Any]], where: str) -> tuple[PlannedClaim, ...]:
    claims = []
    for entry in entries:
        claim = PlannedClaim(entry["text"], entry["metric"], entry["sign"], entry["checkpoint"])
        if not METRIC.match(claim.metric):
            raise MMPOInputError(f"{where}: metric {claim.metric!r} is not a paired-table metric")
        if claim.sign not in (-1, 1) or claim.checkpoint not in CHECKPOINTS:
            raise MMPOInputError(f"{where}: {claim.text!r}: sign ±1 and checkpoint {CHECKPOINTS}")
        claims.append(claim)
    return tuple(claims)


def parse_plan(text: str, where: str = "the plan") -> Plan:
    """The plan from its Markdown ``text`` (exactly one ``json confirmatory-plan`` block),
    checked: known methods, distinct seeds, one to four primary claims, all at the final step."""
    blocks = BLOCK.findall(text)
    if len(blocks) != 1:
        raise MMPOInputError(f"{where}: {len(blocks)} ```json confirmatory-plan blocks, not 1")
    data = json.loads(blocks[0])
    plan = Plan(
        registered=data["registered"],
        method=data["method"],
        other=data["other"],
        seeds=tuple(data["seeds"]),
        reserve_seeds=tuple(data["reserve_seeds"]),
        steps=data["steps"],
        alpha=data["alpha"],
        primary=_claims(data["primary"], where),
        secondary=_claims(data["secondary"], where),
        power=data["power"],
        sha256=hashlib.sha256(text.encode()).hexdigest(),
    )
    unknown = [name for name in (plan.method, plan.other) if name not in ALL_METHODS]
    if unknown:
        raise MMPOInputError(f"{where}: method {unknown[0]!r} is not a study method")
    every_seed = plan.seeds + plan.reserve_seeds
    if len(set(every_seed)) != len(every_seed) or len(plan.seeds) < 2:
        raise MMPOInputError(f"{where}: two seeds or more, each named once")
    if not 1 <= len(plan.primary) <= MOST_PRIMARY:
        raise MMPOInputError(f"{where}: 1 to {MOST_PRIMARY} primary claims")
    if any(claim.checkpoint != "final" for claim in plan.primary):
        raise MMPOInputError(f"{where}: a primary claim is read at the final step")
    for block in AMENDMENT.findall(text):
        plan = _amend(plan, json.loads(block), where)
    return plan


def _amend(plan: Plan, amendment: dict[str, Any], where: str) -> Plan:
    """``plan`` with ``amendment``'s seed replacements applied (each planned seed by an unused
    reserve seed, in place, so the seeds keep their order)."""
    if not amendment.get("date") or not amendment.get("why"):
        raise MMPOInputError(f"{where}: an amendment gives its date and why")
    seeds = list(plan.seeds)
    for old, new in amendment.get("replace_seeds", {}).items():
        if int(old) not in seeds or new not in plan.reserve_seeds or new in seeds:
            raise MMPOInputError(
                f"{where}: amendment of {amendment['date']}: seed {old} -> {new} must replace "
                "a planned seed by an unused reserve seed"
            )
        seeds[seeds.index(int(old))] = new
    return replace(plan, seeds=tuple(seeds), amendments=(*plan.amendments, amendment))


def read_plan(path: str | Path = PLAN) -> Plan:
    """:func:`parse_plan` of the file at ``path``."""
    path = Path(path)
    if not path.is_file():
        raise MMPOInputError(f"{path}: no such plan")
    return parse_plan(path.read_text(), str(path))
