"""The paper's evaluation inside NeMo-RL's loop, at ``grpo.val_period``.

With ``evaluation.enabled`` and ``evaluation.in_loop``, the hooked ``validate`` runs
:func:`validate_in_loop` instead of NeMo-RL's validation (docs/evaluation.md) and returns what
NeMo-RL's ``validate`` returns, so NeMo-RL logs the metrics (under ``validation/paper/``) and its
checkpoint manager can select by them. The engine must sample with settings of its own
(``sample_texts(prompts, samples, seed, temperature=, top_p=, max_new_tokens=)``: the CPU
engines); NeMo-RL's vLLM engines on a GPU sample with the training settings fixed at start-up, so
GPU recipes evaluate their checkpoints with ``nemo-mmpo eval watch`` instead.
"""

from __future__ import annotations

from typing import Any

from nemo_mmpo import sections
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.eval.prompts import prompt_format
from nemo_mmpo.eval.protocol import (
    EvaluationSettings,
    evaluate_step,
    evaluation_seed,
    flat_metrics,
    load_problems,
    read_settings,
)
from nemo_mmpo.eval.verify import VerifierPool


def in_loop_settings(master_config: Any) -> EvaluationSettings | None:
    """The recipe's evaluation settings when it evaluates inside the loop, else None."""
    section = sections.value(master_config, "evaluation")
    if section is None:
        return None
    settings = read_settings(sections.plain(section))
    return settings if settings.enabled and settings.in_loop else None


class EngineSampler:
    """``generate(prompts, n)`` on a generation engine, at the protocol's settings and a seed
    of the step's own (the evaluation leaves the training run's random state alone)."""

    def __init__(self, engine: Any, settings: EvaluationSettings, step: int) -> None:
        if not hasattr(engine, "sample_texts"):
            raise MMPOInputError(
                f"evaluation.in_loop=true needs a generation engine that samples with its own "
                f"settings ({type(engine).__name__} does not): set evaluation.in_loop=false and "
                "evaluate the checkpoints with `nemo-mmpo eval watch`"
            )
        self.engine = engine
        self.settings = settings
        self.seed = evaluation_seed(step)

    def generate(self, prompts: list[str], samples: int) -> list[list[str]]:
        return self.engine.sample_texts(
            prompts,
            samples,
            self.seed,
            temperature=self.settings.temperature,
            top_p=self.settings.top_p,
            max_new_tokens=self.settings.max_new_tokens,
        )


def validate_in_loop(
    policy_generation: Any,
    step: int,
    settings: EvaluationSettings,
    master_config: Any = None,
    tokenizer: Any = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What NeMo-RL's ``validate`` returns: ``(metrics, timings)``. With
    ``evaluation.template: null`` each problem is sampled with the prompt training gives it
    (:mod:`nemo_mmpo.eval.prompts`: ``master_config``'s data section, ``tokenizer`` the one
    NeMo-RL's ``validate`` was given); otherwise with the template around it, as it is."""
    sampler = EngineSampler(policy_generation, settings, step)
    problems = load_problems(settings)
    texts = None
    if settings.template is None:
        recipe = sections.plain(master_config or {})
        texts = prompt_format(recipe, None).texts(problems, tokenizer)
    with VerifierPool(num_workers=1) as pool:
        numbers = evaluate_step(sampler, pool.verify, problems, settings, step, prompts=texts)
    metrics = {"accuracy": numbers["accuracy"], **flat_metrics(numbers)}
    print(
        f"[nemo-mmpo] evaluation at step {step}: average {numbers['average']:.3f}, "
        f"never solved {numbers['never_solved']:.3f} ({len(problems)} problems x "
        f"{settings.samples} samples)",
        flush=True,
    )
    return metrics, {"total_validation_time": numbers["seconds"]}
