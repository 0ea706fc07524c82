"""What ``--dry-run`` checks before anything is queued: rules that each return errors and warnings.

One module per topic, run in the order of :data:`TOPICS` (docs/recipes.md's table): the
objective, an asynchronous run, sequence packing, our config sections, NeMo-RL's
``MasterConfig``. Each rule takes the resolved config (:class:`~nemo_mmpo.recipes.LoadedConfig`'s
plain dicts) and adds to :class:`Findings`; :func:`check` runs every rule in :data:`RULES` and
collects all findings, so a recipe with three mistakes is told about all three. Settings
sections are read by their typed models (:mod:`nemo_mmpo.settings`), so a bad value is named
the same way everywhere. A new rule is one function decorated with :func:`rule` in its topic's
module.
"""

from __future__ import annotations

from typing import Any

from nemo_mmpo.launch.rules import asynchronous, master_config, objective, packing, sections
from nemo_mmpo.launch.rules.registry import REGISTERED, Findings, Rule, rule

__all__ = ["RULES", "TOPICS", "Findings", "Rule", "check", "rule"]
#: the rules' modules, in the order --dry-run runs and prints them (docs/recipes.md's table)
TOPICS = (objective, asynchronous, packing, sections, master_config)
RULES: list[Rule] = [
    run for topic in TOPICS for run in REGISTERED if run.__module__ == topic.__name__
]


def check(config: dict[str, Any]) -> Findings:
    """Every rule's findings on ``config``."""
    findings = Findings()
    for run in RULES:
        findings.extend(run(config))
    return findings
