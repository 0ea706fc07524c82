"""The keys a recipe takes and the step metrics a run logs: the tables of ``docs/keys.md``.

Each key's default and allowed values are read from the typed settings (the estimator section
built from the registry, :class:`~nemo_mmpo.nemo_rl.dmpo_batch_terms.DMPOSettings`,
:class:`~nemo_mmpo.eval.protocol.EvaluationSettings`) and from
``base/mmpo_common.yaml`` (nemo-mmpo's keys, which a recipe lists; the paper's task settings,
``base/paper_math.yaml``, give the paper loss table's recipe column); the metric names from
running the estimator and DMPO's batch terms on a small batch. What each key does and what
each metric tells is written once, here (:data:`ESTIMATOR_KEYS`, :data:`LOSS_KEYS`,
:data:`EVALUATION_KEYS`, :data:`METRICS`). A key or a metric without a description here, or a
description of one that no longer exists, stops the generation, and
``tests/test_keys_table.py`` fails when ``docs/keys.md`` differs from what this writes::

    python -m nemo_mmpo.launch.keys --write   # rewrite the tables in docs/keys.md
    python -m nemo_mmpo.launch.keys --check   # exit 1 if docs/keys.md is out of date
"""

from __future__ import annotations

import argparse
import re
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import annotated_types
import torch
import yaml

from nemo_mmpo.checkout import CONFIGS_DIR, REPO_ROOT
from nemo_mmpo.estimators import available_estimators, estimator_options
from nemo_mmpo.eval.protocol import EvaluationSettings
from nemo_mmpo.losses import all_loss_names, loss_names
from nemo_mmpo.nemo_rl.advantage_estimator import MMPOAdvantageEstimator
from nemo_mmpo.nemo_rl.dmpo_batch_terms import DMPOSettings, attach_penalty_terms
from nemo_mmpo.nemo_rl.estimator_settings import (
    default_family,
    estimator_names,
    mmpo_formulas,
    section_model,
)
from nemo_mmpo.nemo_rl.names import (
    DMPO_METRICS,
    ESTIMATOR_METRICS,
    NEMO_RL_ESTIMATOR_KEYS,
    NEMO_RL_ESTIMATORS,
)
from nemo_mmpo.nemo_rl.paper_settings import PAPER_LOSS_SETTINGS
from nemo_mmpo.settings import Settings

DOCS_PAGE = REPO_ROOT / "docs" / "keys.md"
COMMON_RECIPE = CONFIGS_DIR / "base" / "mmpo_common.yaml"
#: the paper's task settings, which the paper's recipes list after :data:`COMMON_RECIPE`
PAPER_RECIPE = CONFIGS_DIR / "base" / "paper_math.yaml"

#: ``paper`` of a key whose paper value is its default
AS_DEFAULT = "as default"


@dataclass(frozen=True)
class Key:
    """What a key does (Markdown), the paper's value (:data:`AS_DEFAULT`, a Markdown cell, or
    None: the paper does not set it) and, where a validator says more than the type, the
    allowed values."""

    what: str
    paper: str | None = AS_DEFAULT
    allowed: str | None = None


ESTIMATOR_KEYS: dict[str, Key] = {
    "name": Key(
        "The estimator: `mmpo` (its formula chosen by `estimator`) or one of the paper's "
        "baselines with an objective of its own (`passk_chen`: pass@K training with Chen et "
        "al.'s estimator; `pkpo`; `maxrl`). NeMo-RL's own names run NeMo-RL's estimators, "
        "untouched."
    ),
    "estimator": Key(
        "With `name: mmpo`, the formula: `plugin` (moments of the group's failure rate plugged "
        "in, biased), `unbiased` (needs 2 ≤ G and T ≤ G), `empirical_bayes`, or `grpo` "
        "(NeMo-RL's GRPO formula). See [the estimator library](estimators.md).",
        paper="`plugin` (appendix: `unbiased`)",
    ),
    "truncation_order": Key(
        "T: the objective lowers E[F] + E[F²] + … + E[Fᵀ] of each problem's failure rate F, so "
        "a problem's weight grows from 1 (always solved) to T(T+1)/2 (never solved). Also the "
        "number of `mmpo/failure_moment_k` logged.",
        paper="4 (ablation: 2, 3, 8)",
    ),
    "moment_transform": Key(
        "Moments of U·F instead of F: `none` (U = 1, MMPO), `constant` (U = "
        "`transform_constant`), `beta` (U ~ Beta(`transform_alpha`, `transform_beta`)).",
        paper="`none` (ablation: U = 0.8, U ~ Beta)",
    ),
    "transform_constant": Key("U = c, in (0, 1], for `moment_transform: constant`.", paper=None),
    "transform_alpha": Key("α of U ~ Beta(α, β), for `moment_transform: beta`.", paper=None),
    "transform_beta": Key("β of U ~ Beta(α, β), for `moment_transform: beta`.", paper=None),
    "reward_threshold": Key(
        "`null`: rewards must be 0/1 (anything else is an error); a number t: a reward ≥ t "
        "counts as a success (for scaled or shaped rewards)."
    ),
    "k": Key("K of pass@K training."),
    "maclaurin_order": Key(
        "`null`: MaxRL's authors' estimator; an integer: its Maclaurin expansion to that order."
    ),
    "normalize_std": Key(
        "Divide by the group's standard deviation, as NeMo-RL's GRPO does.", paper=None
    ),
    "leave_one_out": Key("Baseline: the mean of the group's other rollouts.", paper=None),
    "epsilon": Key("Added to the divisor (a standard deviation or a success rate).", paper=None),
}

LOSS_KEYS: dict[str, Key] = {
    "name": Key(
        "`mmpo`: NeMo-RL's clipped surrogate (`ClippedPGLossFn`) computed exactly as `loss_fn` "
        "sets it, departures from the paper's settings reported; `dmpo`: that surrogate plus "
        "`dmpo_weight` × DMPO's penalty ([DMPO](dmpo.md)); `clipped_pg`: NeMo-RL's own.",
        paper="`mmpo` (DMPO baseline: `dmpo`)",
    ),
    "dmpo_weight": Key("λ, the penalty's weight (the DMPO authors' `dmpo_beta`)."),
    "dmpo_temperature": Key(
        "α, the temperature of the target softmax over a group's advantages.", paper="1/15"
    ),
    "dmpo_filter_zero_signal": Key(
        "`true`: groups whose rollouts all pass or all fail are left out of the penalty (the "
        "authors' `grpo_dmpo_zero`); `false`: `grpo_dmpo`."
    ),
}

EVALUATION_KEYS: dict[str, Key] = {
    "enabled": Key("Evaluate with the paper's protocol at all.", paper=None),
    "in_loop": Key(
        "`true`: inside NeMo-RL's loop at `grpo.val_period` (the CPU recipes); `false`: NeMo-RL "
        "validates as usual and `nemo-mmpo eval watch` evaluates the checkpoints alongside (the "
        "GPU recipes).",
        paper=None,
    ),
    "benchmarks": Key(
        "`{name: local JSONL or Parquet file, or null for the hub's copy}`.",
        paper="MATH500, OlymMATH, AMC23, AIME24, AIME25",
    ),
    "samples": Key(
        "Samples per problem: avg@k and pass@1 … pass@k are computed from them.",
        paper="16 (1 on MATH500 and OlymMATH)",
    ),
    "temperature": Key("The evaluation sampler's temperature."),
    "top_p": Key("The evaluation sampler's top-p."),
    "max_new_tokens": Key(
        "The longest response sampled; with `data.max_input_seq_length` (a prompt's room) it "
        "must fit the model length the watcher samples with "
        "(`policy.generation.vllm_cfg.max_model_len`, else `policy.max_total_sequence_length`).",
        paper="`4096`",
    ),
    "template": Key(
        "`null`: each held-out problem gets the prompt training gives it (the training "
        "dataset's `prompt_file` and `system_prompt_file`, the tokenizer's chat template); a "
        "string: this prompt around the problem instead (`{}` is the problem; no system "
        "prompt), in the same chat template.",
        paper=None,
        allowed="`null` or a string with `{}`",
    ),
    "output_dir": Key(
        "Where each evaluated step's rollouts (`step_<N>.jsonl`) and numbers (`step_<N>.json`) go.",
        paper=None,
    ),
    "pass_at": Key(
        "The k of the pass@k each evaluated step reports.",
        paper=None,
        allowed="a list of integers ≥ 1",
    ),
    "gini_alphas": Key(
        "The α of the Gini coefficients of per-problem success each step reports (problems "
        "every run solves less than α or more than 1 − α of the time left out).",
        paper=None,
    ),
}

#: What each step metric tells a user watching a run, by its name after the prefix
#: (``failure_moment_k`` stands for ``failure_moment_1`` ... ``failure_moment_T``).
METRICS: dict[str, str] = {
    "failure_moment_k": "E[Fᵏ] over the step's problems (k = 1 … T; F a problem's failure "
    "rate, estimated from its group). Falling: the policy fails less; the higher moments fall "
    "as the hardest problems start to be solved.",
    "truncated_first_success_time": "1 + E[F] + … + E[Fᵀ]: the expected attempts to a first "
    "success, capped at T + 1; the quantity MMPO lowers.",
    "weight_mean": "Mean weight w(f) = Σₖ k fᵏ⁻¹ of the step's problems: how far MMPO tilts "
    "the step towards hard problems (1 for GRPO's objective).",
    "weight_max": "The largest weight in the step (at most T(T+1)/2).",
    "no_signal_fraction": "Share of groups whose rollouts all pass or all fail: they give no "
    "gradient. High: rollouts are wasted; raise the group size or change the data's "
    "difficulty.",
    "all_pass_fraction": "Share of groups that always succeed: rising, the training set is "
    "being solved.",
    "all_fail_fraction": "Share of groups that never succeed: high, the problems are too hard "
    "for the policy (or the answers are not graded as you expect).",
    "success_rate": "Share of the step's rollouts that succeed (the 0/1 reward's mean).",
    "num_groups": "Prompt groups in the step.",
    "advantage_abs_max": "Largest absolute advantage of the step: compare with "
    "`grpo.advantage_clip_high` (the dry run warns when NeMo-RL clips after our estimator).",
    "advantage_abs_mean": "Mean absolute advantage over the step's rollouts: the size of the "
    "update's "
    "signal.",
    "advantage_token_mean": "Mean advantage over the loss's tokens, what NeMo-RL's token-level "
    "loss sees: far from 0 when long responses share a sign (failures longer than successes).",
    "advantage_abs_token_mean": "Mean absolute advantage over the loss's tokens.",
    "positive_advantage_token_fraction": "Share of the loss's tokens with a positive advantage.",
}

#: DMPO's metrics (``loss_fn.name: dmpo``): the per-batch penalty terms' (driver) and the loss's
DMPO_METRIC_DOCS: dict[str, str] = {
    "penalty": "DMPO's penalty on the batch at the rollout policy, the term `dmpo_weight` "
    "multiplies.",
    "target_policy_kl": "KL(target ‖ policy) between the softmax of a group's advantages and "
    "the policy's softmax over its responses, mean over counted groups: falling, the policy "
    "matches the target.",
    "total_variation": "Half the L1 distance between the same two distributions.",
    "counted_fraction": "Share of valid responses in groups the penalty counts.",
    "counted_groups": "Groups the penalty counts.",
    "penalty_term": "The penalty term the loss adds, summed over the step's micro-batches (at "
    "the first optimizer step of a batch, `dmpo/penalty`); logged by the loss in NeMo-RL's "
    "policy workers.",
}
#: DMPO metrics that the loss logs in the policy workers (not produced on the driver)
LOSS_ONLY_DMPO_METRICS = ("penalty_term",)


# ------------------------------------------------------------------------------- values


def _cell(value: Any) -> str:
    """A value as a YAML user writes it, in a Markdown code span."""
    if isinstance(value, dict):
        return ", ".join(f"`{key}`" for key in value) if value else "`{}`"
    if isinstance(value, str) and ("\n" in value or len(value) > 40):
        return "see `base/mmpo_common.yaml`"
    if isinstance(value, list | tuple):
        return "`[" + ", ".join(_plain(item) for item in value) + "]`"
    return f"`{_plain(value)}`"


def _plain(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _bounds(metadata: list[Any]) -> str:
    parts = []
    for item in metadata:
        for kind, symbol in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            bound = getattr(item, kind, None)
            if isinstance(item, annotated_types.BaseMetadata) and bound is not None:
                parts.append(f"{symbol} {_plain(bound)}")
    return " and ".join(parts)


def _allowed(annotation: Any, metadata: list[Any]) -> str:
    """The values a field accepts, from its type and its ``Field`` bounds."""
    bounds = _bounds(metadata)
    bounded = f" {bounds}" if bounds else ""
    origin = typing.get_origin(annotation)
    arguments = [item for item in typing.get_args(annotation) if item is not type(None)]
    optional = len(arguments) < len(typing.get_args(annotation))
    if origin is typing.Literal:
        return " \\| ".join(f"`{item}`" for item in typing.get_args(annotation))
    if optional and len(arguments) == 1:
        return f"`null` or {_allowed(arguments[0], metadata)}"
    if annotation is bool:
        return "`true` \\| `false`"
    if annotation is int:
        return f"integer{bounded}"
    if annotation is float:
        return f"number{bounded}"
    if annotation is str:
        return "string"
    if origin is dict:
        return "mapping"
    if origin is tuple:
        return f"list of {'integers' if arguments[0] is int else 'numbers'}"
    raise ValueError(f"no wording for the type {annotation!r}: add it to nemo_mmpo.launch.keys")


def _common_section(path: str, recipe: Path = COMMON_RECIPE) -> dict[str, Any]:
    """``path``'s section of ``base/mmpo_common.yaml`` (what a recipe inherits), or of
    another ``recipe``."""
    section = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    for part in path.split("."):
        section = (section or {}).get(part) or {}
    return section


def _rows(
    section: str,
    model: type[Settings],
    documented: dict[str, Key],
    keys: list[str],
    allowed: dict[str, str] | None = None,
    readers: dict[str, str] | None = None,
) -> list[str]:
    missing = [key for key in keys if key not in documented]
    stale = [key for key in documented if key not in keys]
    if missing or stale:
        raise ValueError(
            f"{section}: keys without a description in nemo_mmpo/launch/keys.py: {missing}; "
            f"descriptions of keys that do not exist: {stale}"
        )
    inherited = _common_section(section)
    rows = []
    for key in keys:
        field = model.model_fields[key]
        default = (
            inherited[key] if key in inherited else field.get_default(call_default_factory=True)
        )
        doc = documented[key]
        accepted = (
            (allowed or {}).get(key) or doc.allowed or _allowed(field.annotation, field.metadata)
        )
        what = doc.what + (f" Read by {readers[key]}." if readers and key in readers else "")
        paper = _cell(default) if doc.paper == AS_DEFAULT else doc.paper or "—"
        shown = _cell(default) if key in inherited else f"{_cell(default)} (`++`)"
        rows.append(f"| `{section}.{key}` | {shown} | {accepted} | {what} | {paper} |")
    return rows


def _option_readers() -> dict[str, str]:
    """``key -> who reads it`` for the registered estimators' keyword options."""
    formulas = set(mmpo_formulas())
    readers: dict[str, list[str]] = {}
    for name in available_estimators():
        for key in estimator_options(name):
            label = f"`mmpo`/`{name}`" if name in formulas else f"`{name}`"
            readers.setdefault(key, []).append(label)
    return {key: ", ".join(names) for key, names in readers.items()}


def keys_table() -> str:
    """The Markdown table of every key nemo-mmpo reads in a recipe."""
    model = section_model()
    estimator_keys = [key for key in model.model_fields if key not in NEMO_RL_ESTIMATOR_KEYS]
    ours = ", ".join(f"`{name}`" for name in estimator_names())
    names = {
        "name": f"{ours}; NeMo-RL's: " + ", ".join(f"`{name}`" for name in NEMO_RL_ESTIMATORS),
        "estimator": " \\| ".join(f"`{name}`" for name in mmpo_formulas()),
    }
    lines = [
        "| key | default | allowed | what it does | the paper |",
        "| --- | --- | --- | --- | --- |",
        *_rows(
            "grpo.adv_estimator",
            model,
            ESTIMATOR_KEYS,
            estimator_keys,
            allowed=names,
            readers=_option_readers(),
        ),
        *_rows(
            "loss_fn",
            _LossName,
            {"name": LOSS_KEYS["name"]},
            ["name"],
            allowed={"name": " \\| ".join(f"`{name}`" for name in all_loss_names())},
        ),
    ]
    dmpo_keys = {key: LOSS_KEYS[key] for key in LOSS_KEYS if key != "name"}
    lines += _rows("loss_fn", DMPOSettings, dmpo_keys, list(DMPOSettings.model_fields))
    lines += _rows(
        "evaluation", EvaluationSettings, EVALUATION_KEYS, list(EvaluationSettings.model_fields)
    )
    return "\n".join(lines)


class _LossName(Settings):
    """``loss_fn.name`` (its values: :func:`~nemo_mmpo.losses.all_loss_names`; its default
    the first registered)."""

    name: str = loss_names()[0]


def paper_loss_table() -> str:
    """NeMo-RL's ``loss_fn`` keys the paper fixes, with the value the paper's recipes inherit
    (``base/paper_math.yaml``)."""
    inherited = _common_section("loss_fn", PAPER_RECIPE)
    lines = ["| NeMo-RL key | the paper | the paper's recipes |", "| --- | --- | --- |"]
    for key, paper in PAPER_LOSS_SETTINGS.items():
        ours = _cell(inherited[key]) if key in inherited else "NeMo-RL's default"
        lines.append(f"| `loss_fn.{key}` | {_cell(paper)} | {ours} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ metrics


def _estimator_metrics() -> list[str]:
    """The ``mmpo/`` metric names the estimator logs, from running it on two groups."""
    estimator = MMPOAdvantageEstimator({"name": default_family(), "truncation_order": 2})
    prompts = torch.tensor([[1, 2]] * 4 + [[3, 4]] * 4)
    rewards = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 0])
    estimator.compute_advantage(prompts, rewards, torch.ones(8, 5))
    names = [name.removeprefix(ESTIMATOR_METRICS) for name in estimator.last_metrics]
    moments = [name for name in names if re.fullmatch(r"failure_moment_\d+", name)]
    if moments != ["failure_moment_1", "failure_moment_2"]:
        raise ValueError(f"failure moments logged as {moments}: update nemo_mmpo/launch/keys.py")
    first = names.index(moments[0])
    rest = [name for name in names if name not in moments]
    return [*rest[:first], "failure_moment_k", *rest[first:]]


def _dmpo_metrics() -> list[str]:
    """The ``dmpo/`` metric names DMPO's batch terms log, from running them on one group."""
    train_data = {
        "input_ids": torch.tensor([[1, 2, 3], [1, 2, 4]]),
        "token_mask": torch.tensor([[0, 0, 1], [0, 0, 1]]),
        "sample_mask": torch.ones(2),
        "advantages": torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]]),
        "prev_logprobs": torch.tensor([[0.0, 0.0, -0.5], [0.0, 0.0, -1.0]]),
    }
    metrics = attach_penalty_terms(train_data, DMPOSettings())
    return [name.removeprefix(DMPO_METRICS) for name in metrics]


def _loss_metrics() -> list[str]:
    """DMPO metrics the loss logs (read from its source: it imports NeMo-RL)."""
    source = (REPO_ROOT / "nemo_mmpo" / "nemo_rl" / "loss.py").read_text(encoding="utf-8")
    return re.findall(r'f"\{DMPO_METRICS\}(\w+)"', source)


def _metric_rows(prefix: str, names: list[str], documented: dict[str, str]) -> list[str]:
    missing = [name for name in names if name not in documented]
    stale = [name for name in documented if name not in names]
    if missing or stale:
        raise ValueError(
            f"{prefix} metrics without a description in nemo_mmpo/launch/keys.py: {missing}; "
            f"descriptions of metrics that are not logged: {stale}"
        )
    return [f"| `{prefix}{name}` | {documented[name]} |" for name in names]


def metrics_table() -> str:
    """The Markdown table of the step metrics nemo-mmpo logs."""
    loss_only = _loss_metrics()
    if sorted(loss_only) != sorted(LOSS_ONLY_DMPO_METRICS):
        raise ValueError(
            f"the loss logs dmpo/ metrics {loss_only}: update nemo_mmpo/launch/keys.py"
        )
    return "\n".join(
        [
            "| metric | what it tells you |",
            "| --- | --- |",
            *_metric_rows(ESTIMATOR_METRICS, _estimator_metrics(), METRICS),
            *_metric_rows(DMPO_METRICS, [*_dmpo_metrics(), *loss_only], DMPO_METRIC_DOCS),
        ]
    )


# --------------------------------------------------------------------------------- page

TABLES = {"keys": keys_table, "paper-loss": paper_loss_table, "metrics": metrics_table}


def _markers(name: str) -> tuple[str, str]:
    return (
        f"<!-- generated: {name} (python -m nemo_mmpo.launch.keys --write) -->",
        f"<!-- end generated: {name} -->",
    )


def render(page: str) -> str:
    """``page`` with every generated table replaced by what the settings say now."""
    for name, table in TABLES.items():
        start, end = _markers(name)
        pattern = re.compile(re.escape(start) + r"\n.*?" + re.escape(end), re.S)
        if not pattern.search(page):
            raise ValueError(f"{DOCS_PAGE.name} lacks the markers of the {name} table: {start}")
        replacement = f"{start}\n{table()}\n{end}"
        page = pattern.sub(lambda _match, text=replacement: text, page)
    return page


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nemo_mmpo.launch.keys", description=__doc__)
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help=f"rewrite the tables in {DOCS_PAGE}")
    action.add_argument("--check", action="store_true", help="exit 1 if the page is out of date")
    args = parser.parse_args(argv)
    if not (args.write or args.check):
        print("\n\n".join(table() for table in TABLES.values()))
        return 0
    page = DOCS_PAGE.read_text(encoding="utf-8")
    rendered = render(page)
    if args.write:
        DOCS_PAGE.write_text(rendered, encoding="utf-8")
    elif rendered != page:
        print(f"{DOCS_PAGE} is out of date: python -m nemo_mmpo.launch.keys --write")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
