"""NeMo-RL's advantage stage in its own module (after our snapshot; issue 74 item 5), simulated on
main: the single controller trains MMPO through ``install()`` with ``mmpo/`` metrics in every
step's log, its first-step checks passing, with ``async_rl.num_advantage_workers: 0`` (NeMo-RL's
default: the stage in the controller's process).

What NeMo-RL changed, read in its stored files with the search tools (none of its code is
committed here; a test fetches nothing):

- ``nemo_rl/algorithms/single_controller_utils/advantage_stage.py`` at 7b235d3e:
  ``AdvantageComputer(dp_client, *, config, advantage_estimator)``, whose ``async run(request:
  AdvantageRequest) -> AdvantageOutcome`` is the body of main's
  ``SingleControllerActor._advantage_stage`` moved there: it fetches the chunk, calls
  ``compute_advantage(..., valid_mask=final_sample_mask)``, clips with
  ``_clip_grpo_advantages(advantages, cfg.algo)`` (#3927), puts ``fields_for_put(meta,
  fields_to_put)`` from that module, and returns only reduced ``RewardPartial`` /
  ``AdvantagePartial`` (no estimator metrics);
- ``nemo_rl/algorithms/single_controller_utils/utils.py`` (the stored version with those
  classes): ``reduce_advantage_pump_metrics(reward_partials, advantage_partials,
  sequence_lengths, *, seq_logprob_error_metrics=None, ...)``;
- ``nemo_rl/algorithms/single_controller.py`` at 00420a15: no ``fields_for_put`` import; its
  ``__init__`` builds ``AdvantageComputer(self._dp_client, config=..., advantage_estimator=
  self._advantage_estimator)``; ``_advantage_stage`` runs ``_run_advantage_stage(
  AdvantageRequest(meta=...))`` (``self._advantage_computer.run(request)`` without a pool of
  advantage actors) and ``_absorb_advantage_outcome`` appends the partials to
  ``_step_log_dict["reward_partials"]`` / ``["advantage_partials"]``, which the step's
  ``reduce_advantage_pump_metrics(**self._step_log_dict)`` reads.

Simulated here, on main's own files in a temporary folder (:func:`stage_files`): the stage's
module is main's ``_advantage_stage`` body moved into ``AdvantageComputer.run`` by text
replacements (``self._call_dp`` becomes a ``call_data_plane(dp_client, ...)`` stand-in: main
has no ``nemo_rl.data_plane.async_utils``; the controller's flags read from a reduced
``AdvantageStageConfig``; ``valid_mask=sample_mask`` and the clip added as the stored file has
them; the partials returned), with stand-ins of our own for the partials and the reducer's new
signature in ``utils.py``; the controller's ``_advantage_stage`` replaced by the in-process path
above. Not simulated: the stage's later additions (group ids from ``row_group_ids(meta)``,
mask_sample/overlong folding, OPD, PPO's values, the training dump, message-level penalties)
and the pool of ``AdvantageActor``s (``num_advantage_workers > 0``), refused for our estimators
in ``test_refused_before_step_one.py``. The changed files are imported in this process under
NeMo-RL's module names (restored after each test), so ``install()`` reads their source; the
controller's step runs with the fakes of ``test_single_controller_first_step.py``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import pickle
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from nemo_rl_support import import_nemo_rl, master_config_from_recipe

pytestmark = [pytest.mark.nemo_rl, pytest.mark.main_snapshot]
import_nemo_rl("nemo_rl.algorithms.grpo")
if importlib.util.find_spec("nemo_rl.algorithms.single_controller") is None:
    pytest.skip("this NeMo-RL has no single controller (v0.7.0)", allow_module_level=True)
controller = import_nemo_rl("nemo_rl.algorithms.single_controller")
sc_utils = import_nemo_rl("nemo_rl.algorithms.single_controller_utils.utils")
sc_setup = import_nemo_rl("nemo_rl.algorithms.single_controller_utils.setup")
from test_chunk_metrics import chunks_of, step_batch
from test_single_controller_first_step import DECORATOR, RecordingLogger, Step, actor_for

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.nemo_rl import actor_hooks, actor_outcomes, install, run_state
from nemo_mmpo.nemo_rl.contract import nemo_rl_version

STAGE = actor_hooks.ADVANTAGE_STAGE
UTILS = "nemo_rl.algorithms.single_controller_utils.utils"
RECIPE = "mmpo_math_qwen3_1.7b.yaml"

#: the partials and the reducer's new signature (stand-ins of ours for the stored utils.py's)
PARTIALS = """
from dataclasses import dataclass as _dataclass


@_dataclass(frozen=True)
class RewardPartial:
    weighted_total: float
    weight: float

    @classmethod
    def from_rows(cls, rewards, sample_mask=None):
        flat = rewards.flatten()
        weights = torch.ones_like(flat) if sample_mask is None else sample_mask.flatten()
        weights = weights.to(flat.dtype)
        return cls(float((flat * weights).sum()), float(weights.sum()))


@_dataclass(frozen=True)
class AdvantagePartial:
    count: int
    total: float
    minimum: float
    maximum: float

    @classmethod
    def from_values(cls, values):
        if values.numel() == 0:
            return cls(0, 0.0, 0.0, 0.0)
        return cls(values.numel(), float(values.sum()), float(values.min()), float(values.max()))


def reduce_advantage_pump_metrics(
    reward_partials, advantage_partials, sequence_lengths, *, seq_logprob_error_metrics=None
):
    out = {}
    if reward_partials:
        weight = sum(partial.weight for partial in reward_partials)
        total = sum(partial.weighted_total for partial in reward_partials)
        out["reward"] = total / weight if weight > 0 else 0.0
    if advantage_partials:
        populated = [partial for partial in advantage_partials if partial.count]
        count = sum(partial.count for partial in populated)
        out["advantages/mean"] = sum(p.total for p in populated) / count if count else 0.0
        out["advantages/max"] = max((p.maximum for p in populated), default=0.0)
        out["advantages/min"] = min((p.minimum for p in populated), default=0.0)
    if sequence_lengths:
        out["total_num_tokens"] = float(sum(sequence_lengths))
    if seq_logprob_error_metrics:
        out.update(_reduce_seq_logprob_error_metrics(seq_logprob_error_metrics))
    return out
"""

#: the stage's module around main's moved body (names as in the stored advantage_stage.py)
STAGE_HEAD = '''"""The advantage stage in its own module (simulated: main's body, moved)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Optional

import torch

from nemo_rl.algorithms.grpo import (
    _clip_grpo_advantages,
    compute_and_apply_seq_logprob_error_masking,
)
from nemo_rl.algorithms.single_controller_utils.config import AdvantageConfig
from nemo_rl.algorithms.single_controller_utils.utils import (
    AdvantagePartial,
    RewardPartial,
    fields_for_put,
    squeeze_trailing_unit_dim,
    tensor_field,
)
from nemo_rl.data_plane import KVBatchMeta
from nemo_rl.distributed.batched_data_dict import BatchedDataDict


async def call_data_plane(dp_client, method_name, **kwargs):
    """Stand-in for nemo_rl.data_plane.async_utils.call_data_plane (not in main)."""
    result = getattr(dp_client, method_name)(**kwargs)
    return await result if asyncio.iscoroutine(result) else result


@dataclass(frozen=True)
class AdvantageStageConfig:
    advantage: AdvantageConfig
    algo: Any
    policy_logprobs_required: bool
    reference_logprobs_required: bool

INPUT_FIELDS

@dataclass(frozen=True)
class AdvantageRequest:
    meta: KVBatchMeta
    train_step: Optional[int] = None


@dataclass(frozen=True)
class AdvantageOutcome:
    meta: KVBatchMeta
    has_valid_training_tokens: bool
    reward_partial: Any
    advantage_partial: Any
    seq_logprob_error_metrics: Optional[dict[str, float]] = None


class AdvantageComputer:
    def __init__(self, dp_client, *, config, advantage_estimator, shard_id="0"):
        self._dp_client = dp_client
        self._config = config
        self._advantage_estimator = advantage_estimator

'''
#: main's ``_advantage_stage`` (its def line to the next section) -> ``AdvantageComputer.run``
STAGE_DEF = "    async def _advantage_stage(self, meta: KVBatchMeta) -> tuple[KVBatchMeta, bool]:\n"
STAGE_END = "    # ── utility helpers"
MOVED = [  # (main's text, the stage's, how many times)
    (
        STAGE_DEF,
        "    async def run(self, request: AdvantageRequest) -> AdvantageOutcome:\n",
        1,
    ),
    (
        "        if self._advantage_estimator is None:\n            return meta, True\n"
        "        adv_cfg = self._advantage_cfg\n",
        "        meta = request.meta\n        cfg = self._config\n        adv_cfg = cfg.advantage\n"
        "        seq_error_metrics = None\n",
        1,
    ),
    ("self._call_dp(\n", "call_data_plane(\n            self._dp_client,\n", 2),
    ("self._advantage_input_fields()", "cfg.input_fields()", 1),
    ("self._master_config.grpo.", "cfg.algo.", 1),
    ("self._policy_logprobs_required", "cfg.policy_logprobs_required", 2),
    ("self._reference_logprobs_required", "cfg.reference_logprobs_required", 1),
    (
        '            self._step_log_dict["seq_logprob_error_metrics"].append(seq_error_metrics)\n',
        "",
        1,
    ),
    (
        "                repeated_batch=repeated_batch,\n                **kwargs,\n",
        "                repeated_batch=repeated_batch,\n                valid_mask=sample_mask,\n"
        "                **kwargs,\n",
        1,
    ),
    (
        "            advantages = torch.zeros_like(mask)\n",
        "            advantages = torch.zeros_like(mask)\n"
        "        advantages = _clip_grpo_advantages(advantages, cfg.algo)\n",
        1,
    ),
    (
        '        self._step_log_dict["rewards"].append(rewards.detach().cpu())\n'
        '        self._step_log_dict["masked_advantages"].append(\n'
        "            response_advantages.detach().cpu()\n        )\n",
        "        reward_partial = RewardPartial.from_rows(rewards, sample_mask)\n"
        "        advantage_partial = AdvantagePartial.from_values(response_advantages)\n",
        1,
    ),
    (
        "        return (\n            meta.with_fields([adv_cfg.output_field]),\n"
        "            has_valid_training_tokens,\n        )\n",
        "        return AdvantageOutcome(\n"
        "            meta=meta.with_fields([adv_cfg.output_field]),\n"
        "            has_valid_training_tokens=has_valid_training_tokens,\n"
        "            reward_partial=reward_partial,\n"
        "            advantage_partial=advantage_partial,\n"
        "            seq_logprob_error_metrics=seq_error_metrics,\n        )\n",
        1,
    ),
]
#: main's ``_advantage_input_fields`` -> ``AdvantageStageConfig.input_fields`` (the stored name)
FIELDS_DEF = "    def _advantage_input_fields(self) -> list[str]:\n"
FIELDS_END = "        return list(dict.fromkeys(fields))\n"
FIELDS_MOVED = [
    (FIELDS_DEF, "    def input_fields(self) -> list[str]:\n", 1),
    ("self._advantage_cfg", "self.advantage", 1),
    ("self._policy_logprobs_required", "self.policy_logprobs_required", 2),
    ("self._reference_logprobs_required", "self.reference_logprobs_required", 1),
]
#: the controller's in-process path (single_controller.py at 00420a15, the pool left out)
CONTROLLER_STAGE = (
    STAGE_DEF
    + """\
        if self._advantage_estimator is None:
            return meta, True
        outcome = await self._run_advantage_stage(AdvantageRequest(meta=meta))
        self._absorb_advantage_outcome(outcome)
        return outcome.meta, outcome.has_valid_training_tokens

    async def _run_advantage_stage(self, request: AdvantageRequest) -> AdvantageOutcome:
        if not self._advantage_actors:
            return await self._advantage_computer.run(request)
        raise NotImplementedError("the pool of advantage actors is not simulated")

    def _absorb_advantage_outcome(self, outcome: AdvantageOutcome) -> None:
        self._step_log_dict["reward_partials"].append(outcome.reward_partial)
        self._step_log_dict["advantage_partials"].append(outcome.advantage_partial)
        if outcome.seq_logprob_error_metrics is not None:
            self._step_log_dict["seq_logprob_error_metrics"].append(
                outcome.seq_logprob_error_metrics
            )

"""
)
CONTROLLER = [  # (main's text, the changed controller's)
    (DECORATOR, ""),  # no Ray here: the actor's class itself
    ("    fields_for_put,\n", ""),
    (
        "from nemo_rl.algorithms.metric_utils import SetupTimingMetrics\n",
        "from nemo_rl.algorithms.metric_utils import SetupTimingMetrics\n"
        "from nemo_rl.algorithms.single_controller_utils.advantage_stage import (\n"
        "    AdvantageComputer,\n    AdvantageOutcome,\n    AdvantageRequest,\n"
        "    AdvantageStageConfig,\n)\n",
    ),
    (
        "        self._advantage_estimator = actor_args.advantage_estimator\n",
        "        self._advantage_estimator = actor_args.advantage_estimator\n"
        "        self._advantage_actors = []\n"
        "        self._advantage_computer = AdvantageComputer(\n"
        "            self._dp_client,\n            config=AdvantageStageConfig(\n"
        "                advantage=self._advantage_cfg,\n                algo=master_config.grpo,\n"
        "                policy_logprobs_required=self._policy_logprobs_required,\n"
        "                reference_logprobs_required=self._reference_logprobs_required,\n"
        "            ),\n            advantage_estimator=self._advantage_estimator,\n        )\n",
    ),
    (
        '            "rewards": [],\n            "masked_advantages": [],\n',
        '            "reward_partials": [],\n            "advantage_partials": [],\n',
    ),
]


def replaced(text: str, old: str, new: str, times: int = 1) -> str:
    assert text.count(old) == times, (old, text.count(old))
    return text.replace(old, new)


def stage_files(into: Path, stage_change=None) -> dict[str, Path]:
    """Main's ``utils.py`` and ``single_controller.py`` changed, and the stage's module, in
    ``into`` (``{module name: file}``); ``stage_change(text)``: a further change to the stage."""
    source = Path(controller.__file__).read_text()
    start, end = source.index(STAGE_DEF), source.index(STAGE_END)
    body = source[start:end]
    for old, new, times in MOVED:
        body = replaced(body, old, new, times)
    fields_start = source.index(FIELDS_DEF)
    fields = source[fields_start : source.index(FIELDS_END, fields_start) + len(FIELDS_END)]
    for old, new, times in FIELDS_MOVED:
        fields = replaced(fields, old, new, times)
    stage = replaced(STAGE_HEAD, "INPUT_FIELDS\n", fields) + body
    changed = source[:start] + CONTROLLER_STAGE + source[end:]
    for old, new in CONTROLLER:
        changed = replaced(changed, old, new)
    files = {
        UTILS: Path(sc_utils.__file__).read_text() + PARTIALS,
        STAGE: stage_change(stage) if stage_change else stage,
        controller.__name__: changed,
    }
    written = {}
    for name, text in files.items():
        written[name] = into / f"{name.rsplit('.', 1)[1]}.py"
        written[name].write_text(text)
    return written


def import_changed(files: dict[str, Path], monkeypatch) -> dict[str, object]:
    """The changed files imported under NeMo-RL's module names (in order: utils, the stage, the
    controller), in ``sys.modules`` while the test runs; returns the modules."""
    modules = {}
    for name, path in files.items():
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, module)
        spec.loader.exec_module(module)
        modules[name] = module
    return modules


def fresh_actor_process(monkeypatch):
    """This process as a new actor's: no estimator unpickled yet, nothing checked."""
    monkeypatch.setattr(run_state, "RUN", run_state.RunState())  # a fresh actor process


def train(tmp_path, monkeypatch, overrides=(), steps=2, stage_change=None):
    """``install()`` on the changed modules, then ``steps`` steps of the controller's pump, its
    estimator pickled as Ray hands it to the actor. Returns the actor, its fakes and the
    number of puts the first-step check compared."""
    import ray

    modules = import_changed(stage_files(tmp_path, stage_change), monkeypatch)
    module = modules[controller.__name__]
    hooked = install()  # the driver: checks the stage's module too
    assert f"{module.__name__}.reduce_advantage_pump_metrics" in hooked
    config = master_config_from_recipe(RECIPE, list(overrides))
    built = sc_setup._create_advantage_estimator(config)
    monkeypatch.setattr(module, "Logger", RecordingLogger)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {})
    fresh_actor_process(monkeypatch)
    compared = []
    check_put = actor_outcomes.check_put
    monkeypatch.setattr(
        actor_outcomes, "check_put", lambda *args: compared.append(1) or check_put(*args)
    )
    estimator = pickle.loads(pickle.dumps(built))  # hooks this process's modules
    step = Step([chunk for _ in range(steps) for chunk in chunks_of(step_batch(5), 4, [2, 4, 1])])
    actor = actor_for(module, estimator, step)
    stage = modules[STAGE]
    actor._master_config.grpo.max_num_steps = steps
    dp_client = SimpleNamespace(
        get_samples=lambda **kwargs: step.call_dp("get_samples", **kwargs),
        put_samples=lambda **kwargs: step.call_dp("put_samples", **kwargs),
    )
    vars(actor).update(  # as the changed __init__ builds them
        _dp_client=dp_client,
        _advantage_actors=[],
        _advantage_computer=stage.AdvantageComputer(
            dp_client,
            config=stage.AdvantageStageConfig(
                advantage=module.AdvantageConfig(),
                algo=config.grpo,
                policy_logprobs_required=False,
                reference_logprobs_required=False,
            ),
            advantage_estimator=estimator,
        ),
        _step_log_dict={
            "reward_partials": [],
            "advantage_partials": [],
            "sequence_lengths": [],
            "seq_logprob_error_metrics": [],
        },
    )
    asyncio.run(actor._train_pump())
    return actor, step, len(compared)


def train_logs(actor) -> list[dict]:
    logged = actor._logger._logger.logged  # the FirstStepLogger around NeMo-RL's
    return [metrics for prefix, _, metrics in logged if prefix == "train"]


def test_the_stage_in_the_controller_trains_mmpo_with_its_metrics_every_step(tmp_path, monkeypatch):
    actor, step, compared = train(tmp_path, monkeypatch)
    assert actor._train_steps == 2 and len(step.put) == 6
    assert isinstance(actor._logger, actor_outcomes.FirstStepLogger)  # the first step checked
    logs = train_logs(actor)
    assert len(logs) == 2
    for metrics in logs:  # the stage's reduced partials and our estimator's metrics, each step
        assert {"reward", "advantages/mean"} <= set(metrics), sorted(metrics)
        assert any(key.startswith("mmpo/") for key in metrics), sorted(metrics)
    assert compared == 3  # every chunk of step 1 put as the estimator gave it, then no more
    hooked = getattr(sys.modules[STAGE].fields_for_put, actor_hooks.HOOKED_IN, None)
    assert hooked == STAGE  # checked in the stage's module, where AdvantageComputer.run puts
    assert not run_state.RUN.first_step["checking"]


def test_the_recipes_clip_applied_by_the_stage_is_allowed(tmp_path, monkeypatch):
    overrides = ["grpo.advantage_clip_low=-0.1", "grpo.advantage_clip_high=0.1"]
    actor, step, compared = train(tmp_path, monkeypatch, overrides, steps=1)
    assert actor._train_steps == 1 and compared == 3
    advantages = torch.cat([fields["advantages"].flatten() for fields in step.put])
    assert float(advantages.abs().max()) == pytest.approx(0.1)  # the clip did change some


def test_another_change_before_the_put_stops_at_step_one_in_one_line(tmp_path, monkeypatch):
    def clamped(stage):
        return replaced(
            stage,
            "fields_to_put = {adv_cfg.output_field: advantages}",
            "fields_to_put = {adv_cfg.output_field: advantages.clamp(-0.2, 0.2)}",
        )

    with pytest.raises(MMPOInputError) as error:
        train(tmp_path, monkeypatch, steps=1, stage_change=clamped)
    message = str(error.value)
    assert "\n" not in message and "loss tokens differ" in message, message
    assert f"NeMo-RL {nemo_rl_version()}'s single controller (run_grpo_single_controller.py)" in (
        message
    )
    assert f"({STAGE}.fields_for_put)" in message


def test_install_refuses_a_stage_that_puts_past_the_check(tmp_path, monkeypatch):
    """The put check is wrapped in the actor's process only: ``install()`` checks on the driver
    that ``AdvantageComputer.run`` calls ``fields_for_put`` by that name (here an alias)."""

    def aliased(stage):
        stage = replaced(stage, "fields=fields_for_put(meta, ", "fields=_pack(meta, ")
        return stage + "\n\n_pack = fields_for_put\n"

    import_changed(stage_files(tmp_path, aliased), monkeypatch)
    with pytest.raises(RuntimeError) as error:
        install()
    message = str(error.value)
    assert "\n" not in message and message.startswith("nemo-mmpo cannot install into NeMo-RL ")
    assert (
        f"{STAGE}.AdvantageComputer.run no longer calls fields_for_put by that name" in message
    ), message
