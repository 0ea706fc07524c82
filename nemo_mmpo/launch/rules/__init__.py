"""What ``--dry-run`` checks before anything is queued: rules that each return errors and warnings.

First every key is checked against NeMo-RL's own declared types
(:mod:`nemo_mmpo.launch.declared_types`): a value NeMo-RL refuses stops the check there, with
one error naming it, and the rules see the config as NeMo-RL reads it. Then one module per
topic, run in the order of :data:`TOPICS` (docs/recipes.md's table): the parallel layout, the
objective, an asynchronous run, sequence packing, our config sections, the files the run reads
in the user's folder. Each rule takes the resolved config
(:class:`~nemo_mmpo.recipes.LoadedConfig`'s plain dicts) and adds to :class:`Findings`;
:func:`check` runs every rule in :data:`RULES` and collects all findings, so a recipe with
three mistakes is told about all three. Settings sections are read by their typed models
(:mod:`nemo_mmpo.settings`), so a bad value is named the same way everywhere. A new rule is
one function decorated with :func:`rule` in its topic's module.
"""

from __future__ import annotations

from typing import Any

from nemo_mmpo.launch import declared_types
from nemo_mmpo.launch.rules import asynchronous, files, objective, packing, parallel, sections
from nemo_mmpo.launch.rules.registry import REGISTERED, Findings, Rule, rule

__all__ = ["RULES", "TOPICS", "Findings", "Rule", "check", "rule"]
#: the rules' modules, in the order --dry-run runs and prints them (docs/recipes.md's table)
TOPICS = (parallel, objective, asynchronous, packing, sections, files)
RULES: list[Rule] = [
    run for topic in TOPICS for run in REGISTERED if run.__module__ == topic.__name__
]


def check(config: dict[str, Any]) -> Findings:
    """Every rule's findings on ``config``, and in ``findings.config`` the config as NeMo-RL
    reads it (its type conversions applied: what the plan describes)."""
    typed = declared_types.check(config)
    findings = Findings(warnings=list(typed.warnings), config=typed.config)
    if typed.error is not None:
        findings.errors.append(typed.error)
        return findings
    for run in RULES:
        findings.extend(run(typed.config))
    return findings
