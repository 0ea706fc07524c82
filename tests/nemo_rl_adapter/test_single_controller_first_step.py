"""The first step of NeMo-RL main's single controller, checked inside its actor (issue 69).

The controller's ``_train_pump`` and ``_advantage_stage`` (single_controller.py:843-1210,
:1684-1808) run here as NeMo-RL wrote them, on the actor's module as a fresh actor process
imports it (without Ray's decorator: no Ray here), with fakes for what they call out to (the
sampler, the data plane, the trainer, the weight sync): one step of three streaming chunks.
The estimator is built by the hooked factory and pickled and unpickled as Ray hands it to the
actor, which hooks the actor's module (:mod:`nemo_mmpo.nemo_rl.actor_hooks`). Mutated as a
NeMo-RL could change it (the step's ``mmpo/`` metrics merged into another dict; the advantages
clipped, or masked, before they are put for the loss), the controller stops at step 1 in one
line naming the trainer and NeMo-RL's version; unmutated, it trains the step. The driver gets
the actor's error in Ray's ``RayTaskError``: ``handle`` prints its one line.
"""

from __future__ import annotations

import asyncio
import importlib.util
import pickle
from types import SimpleNamespace

import pytest
import torch
from nemo_rl_copies import append, edit, load_changed, nemo_rl_copy, run_in
from nemo_rl_support import import_nemo_rl, master_config_from_recipe

pytestmark = [pytest.mark.nemo_rl, pytest.mark.main_snapshot]
import_nemo_rl("nemo_rl.algorithms.grpo")
if importlib.util.find_spec("nemo_rl.algorithms.single_controller") is None:
    pytest.skip("this NeMo-RL has no single controller (v0.7.0)", allow_module_level=True)
controller = import_nemo_rl("nemo_rl.algorithms.single_controller")
sc_setup = import_nemo_rl("nemo_rl.algorithms.single_controller_utils.setup")
from nemo_rl.data_plane import KVBatchMeta
from test_chunk_metrics import chunks_of, step_batch

from nemo_mmpo.errors import MMPOInputError, handle
from nemo_mmpo.nemo_rl import actor_outcomes, install, run_state
from nemo_mmpo.nemo_rl.contract import nemo_rl_version

DECORATOR = "@ray.remote(num_cpus=1, num_gpus=0)  # pragma: no cover\n"
REDUCED = (
    "step_metrics.update(\n"
    "                    reduce_advantage_pump_metrics(**self._step_log_dict)\n"
    "                )"
)
PUT = "fields_to_put = {adv_cfg.output_field: advantages}"
#: what NeMo-RL could change, and what the error then says
MUTATIONS = {
    "metrics_elsewhere": (
        REDUCED,
        "self._pump_metrics = reduce_advantage_pump_metrics(**self._step_log_dict)",
        "logged step 1's metrics with no mmpo/ metrics (grpo.adv_estimator.name=mmpo)",
    ),
    "clipped": (
        PUT,
        "fields_to_put = {adv_cfg.output_field: advantages.clamp(-0.2, 0.2)}",
        "loss tokens differ",
    ),
    "masked": (
        PUT,
        "fields_to_put = {adv_cfg.output_field: advantages, "
        "adv_cfg.sample_mask_field: sample_mask * (rewards > 0)}",
        "a loss mask that leaves out",
    ),
}


class RecordingLogger:
    """NeMo-RL's ``Logger`` in the actor (single_controller.py:164), recording each log."""

    def __init__(self, config):
        self.logged = []

    def log_metrics(self, metrics, step, prefix=""):
        self.logged.append((prefix, step, dict(metrics)))


class Step:
    """What the controller's step calls out to: the sampler hands one chunk per ``select``, the
    data plane serves its fields and records what is put, the trainer trains nothing."""

    def __init__(self, chunks):
        self.chunks = list(chunks)
        self.data, self.put = {}, []

    async def evict(self, **_):
        return 0

    async def select(self, **_):
        prompt_ids, rewards, mask = self.chunks.pop(0)
        ids = [f"{len(self.data)}-{row}" for row in range(len(rewards))]
        meta = KVBatchMeta("p", None, ids, tags=[{"weight_version": 0}] * len(ids))
        self.data[tuple(ids)] = {
            "prompt_ids_for_adv": prompt_ids,
            "total_reward": rewards,
            "token_mask": mask,
            "sample_mask": torch.ones(len(rewards)),
        }
        return meta, len(rewards) // 4

    async def call_dp(self, method, sample_ids, partition_id, **kwargs):
        if method == "get_samples":
            return self.data[tuple(sample_ids)]
        if method == "put_samples":
            self.put.append(kwargs["fields"])

    @staticmethod
    def finish_train_step():
        return {"loss": torch.tensor([0.5]), "all_mb_metrics": {"global_valid_seqs": [28]}}


def actor_for(module, estimator, step):
    """The controller's actor with what its ``__init__`` sets for the step (no Ray)."""
    actor = object.__new__(module.SingleControllerActor)
    noop = SimpleNamespace(release=lambda: None, mark_iteration=lambda: None)

    async def synced(**_):
        return 0

    vars(actor).update(
        _advantage_cfg=module.AdvantageConfig(),
        _advantage_estimator=estimator,
        _master_config=SimpleNamespace(
            grpo=SimpleNamespace(
                max_num_steps=1, num_prompts_per_step=7, seq_logprob_error_threshold=None
            ),
            checkpointing={"enabled": False, "save_period": 10},
        ),
        _async_cfg=SimpleNamespace(
            min_groups_for_streaming_train=1,
            rollout_failure=SimpleNamespace(min_step_batch_fraction=1.0),
        ),
        _policy_logprobs_required=False,
        _reference_logprobs_required=False,
        _partition_id="p",
        _logger=module.Logger({}),  # as __init__ builds it (:164)
        _timer=module.Timer(),
        _timeout=SimpleNamespace(mark_iteration=lambda: None, check_save=lambda: False),
        _sampler=step,
        _call_dp=step.call_dp,
        _trainer=SimpleNamespace(
            prepare_for_training=lambda: None,
            begin_train_step=lambda loss: None,
            train_microbatches_from_meta=lambda meta: None,
            finish_train_step=step.finish_train_step,
        ),
        _loss_fn=None,
        _gen=object(),
        _buffer=[],
        _buffer_capacity=noop,
        _rollout_exhausted=asyncio.Event(),
        _sync_weights=synced,
        _train_steps=0,
        _trainer_version=0,
        _consumed_samples=0,
        _total_valid_tokens=0,
        _batch_shortfall={},
        _batch_replacements={},
        _batch_promotions={},
        _step_log_dict={
            "rewards": [],
            "masked_advantages": [],
            "sequence_lengths": [],
            "seq_logprob_error_metrics": [],
        },
    )
    return actor


def train_one_step(monkeypatch, old: str = "", new: str = "", overrides=(), in_the_actor=None):
    """One step of the actor's module, changed ``old`` -> ``new``; returns the actor and the
    step's fakes. ``overrides``: the recipe's; ``in_the_actor()``: run before the estimator is
    unpickled (what a fresh actor process lacks)."""
    import ray

    install()  # the driver
    config = master_config_from_recipe("mmpo_math_qwen3_1.7b.yaml", list(overrides))
    built = sc_setup._create_advantage_estimator(config)
    if in_the_actor is not None:
        in_the_actor()

    def changed(source):
        assert source.count(DECORATOR) == 1 and source.count(old or DECORATOR) == 1
        return source.replace(DECORATOR, "").replace(old or DECORATOR, new or "")

    module = load_changed(controller, changed, monkeypatch)  # a fresh actor process's module
    monkeypatch.setattr(module, "Logger", RecordingLogger)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {})
    monkeypatch.setattr(run_state, "RUN", run_state.RunState())  # a fresh actor process
    estimator = pickle.loads(pickle.dumps(built))  # as Ray hands it to the actor: hooks module
    step = Step(chunks_of(step_batch(5), 4, [2, 4, 1]))
    actor = actor_for(module, estimator, step)
    asyncio.run(actor._train_pump())
    return actor, step


def test_the_unchanged_controller_trains_its_first_step_checked(monkeypatch):
    actor, step = train_one_step(monkeypatch)
    assert actor._train_steps == 1 and len(step.put) == 3
    logged = actor._logger._logger.logged  # the FirstStepLogger around NeMo-RL's
    train = next(metrics for prefix, _, metrics in logged if prefix == "train")
    assert any(key.startswith("mmpo/") for key in train)
    assert not run_state.RUN.first_step["checking"]  # the first step is over: puts unchecked


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_a_changed_controller_stops_at_step_one_in_one_line(monkeypatch, mutation):
    old, new, says = MUTATIONS[mutation]
    with pytest.raises(MMPOInputError) as error:
        train_one_step(monkeypatch, old, new)
    message = str(error.value)
    assert "\n" not in message and says in message, message
    assert f"NeMo-RL {nemo_rl_version()}'s single controller (run_grpo_single_controller.py)" in (
        message
    )


def test_install_refuses_a_controller_that_puts_past_the_check(tmp_path):
    """The checks are wrapped in the actor's process only: ``install()`` checks on the driver
    that the actor calls them by name (here ``fields_for_put`` through an alias)."""
    module = nemo_rl_copy(tmp_path) / "single_controller.py"
    edit(module, "fields=fields_for_put(meta, ", "fields=_pack(meta, ")
    append(module, "_pack = fields_for_put")
    result = run_in(tmp_path)
    assert "REFUSED:" in result.stdout, result.stdout + result.stderr
    assert (
        "nemo_rl.algorithms.single_controller.SingleControllerActor._advantage_stage no longer "
        "calls fields_for_put by that name"
    ) in result.stdout, result.stdout


def test_the_driver_prints_the_actors_error_in_one_line(capsys):
    """Ray hands the driver the actor's error as a ``RayTaskError`` whose text is the actor's
    traceback; ``handle`` (``nemo-mmpo train``, ``run_mmpo_math.py``) prints its cause."""
    from ray.exceptions import RayTaskError

    cause = MMPOInputError("NeMo-RL x's single controller (run_grpo_single_controller.py) ...")
    wrapped = RayTaskError("SingleControllerActor.run", "Traceback\n  line\n", cause)

    def main(argv, prog):
        raise wrapped.as_instanceof_cause()

    assert handle(main, [], "nemo-mmpo train") == 2
    assert capsys.readouterr().err == f"error: {cause}\n"


def test_a_put_is_compared_with_the_estimators_output_on_its_mask():
    """:func:`~nemo_mmpo.nemo_rl.actor_outcomes.put_difference`, directly."""
    rows = torch.tensor([0.5, -0.5, 1.0])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    advantages = rows.unsqueeze(-1).expand(mask.shape)
    same = {"advantages": advantages.clone()}
    assert actor_outcomes.put_difference(same, (rows, mask)) is None
    kept = {"advantages": advantages, "sample_mask": torch.tensor([1.0, 1.0, 0.0])}
    assert actor_outcomes.put_difference(kept, (rows, mask)) is None  # a row already out
    dropped = {"advantages": advantages, "sample_mask": torch.tensor([1.0, 0.0, 1.0])}
    assert "leaves out 1" in actor_outcomes.put_difference(dropped, (rows, mask))
    clipped = {"advantages": advantages.clamp(-0.4, 0.4)}
    assert "3 of 3 loss tokens differ" in actor_outcomes.put_difference(clipped, (rows, mask))
    renamed = {"adv": advantages}
    assert actor_outcomes.put_difference(renamed, (rows, mask)) == (
        "no 'advantages' field (it puts 'adv')"
    )


def test_in_loop_evaluation_is_refused_for_the_single_controller():
    from nemo_mmpo.nemo_rl.refusals import single_controller_problem

    problem = single_controller_problem("single controller (run_grpo_single_controller.py)")
    evaluation = {"enabled": True, "in_loop": True, "benchmarks": {"aime24": None}}
    message = problem({"evaluation": evaluation, "loss_fn": {"name": "mmpo"}})
    assert "\n" not in message and message.startswith("evaluation.in_loop=true: NeMo-RL ")
    assert "set evaluation.in_loop=false" in message
    assert problem({"evaluation": {**evaluation, "in_loop": False}}) is None
    assert "dmpo cannot train" in problem({"loss_fn": {"name": "dmpo"}})


def test_the_hooked_single_controller_factory_refuses_in_loop_evaluation():
    """install()'s path: the single controller's factory hook refuses it before the actor."""
    install()
    overrides = ["evaluation.enabled=true", "evaluation.in_loop=true"]
    config = master_config_from_recipe("mmpo_math_qwen3_1.7b.yaml", overrides)
    with pytest.raises(MMPOInputError, match=r"^evaluation.in_loop=true: NeMo-RL "):
        sc_setup._create_advantage_estimator(config)
