"""What a rule finds (:class:`Findings`), the registry of rules (:func:`rule`,
:data:`REGISTERED`), and :func:`group_sizes`, which several rules read."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.sections import value


@dataclass
class Findings:
    """What one rule (or all of them) found."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: the config the rules read (:func:`nemo_mmpo.launch.rules.check` fills it)
    config: dict[str, Any] = field(default_factory=dict)

    def extend(self, other: Findings) -> None:
        self.errors.extend(other.errors)
        self.warnings.extend(other.warnings)


Rule = Callable[[dict[str, Any]], Findings]
#: every rule, in the order its module registered it (:data:`nemo_mmpo.launch.rules.RULES`
#: orders them by topic)
REGISTERED: list[Rule] = []


def rule(function: Callable[[dict[str, Any], Findings], None]) -> Rule:
    """Register a check ``(config, findings) -> None``; an ``MMPOInputError`` it raises is an
    error finding."""

    def run(config: dict[str, Any]) -> Findings:
        findings = Findings()
        try:
            function(config, findings)
        except MMPOInputError as error:
            findings.errors.append(str(error))
        return findings

    run.__name__ = run.__qualname__ = function.__name__
    run.__doc__ = function.__doc__
    run.__module__ = function.__module__
    REGISTERED.append(run)
    return run


def group_sizes(config: dict[str, Any]) -> tuple[int, int]:
    """``(grpo.num_prompts_per_step, grpo.num_generations_per_prompt)``, each an integer >= 1."""
    prompts = value(config, "grpo.num_prompts_per_step")
    group_size = value(config, "grpo.num_generations_per_prompt")
    for key, number in (
        ("num_prompts_per_step", prompts),
        ("num_generations_per_prompt", group_size),
    ):
        if isinstance(number, bool) or not isinstance(number, int) or number < 1:
            raise MMPOInputError(f"grpo.{key}={number!r}: give an integer >= 1")
    return prompts, group_size
