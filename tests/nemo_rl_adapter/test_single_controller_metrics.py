"""The ``mmpo/`` metrics of NeMo-RL main's single controller, from inside its actor.

The controller builds the estimator on the driver (single_controller_utils/setup.py:784, where
``install()`` hooks the factory), Ray pickles it into the ``SingleControllerActor``, whose
process ``install()`` never ran, and calls it once per streaming chunk (single_controller.py
:1778); each step's scalars come from NeMo-RL's ``aggregate_step_metrics`` and
``reduce_advantage_pump_metrics`` (:1072-1074). Here the factory builds the estimator, it is
pickled and unpickled as Ray does, into a process whose ``reduce_advantage_pump_metrics`` is
NeMo-RL's own again (as in a fresh actor), and the step's chunks run through it: the step
metrics hold NeMo-RL's keys and ours, which equal one call on the whole step. No Ray.
"""

from __future__ import annotations

import importlib.util
import pickle

import pytest
import torch
from nemo_rl_support import import_nemo_rl, master_config_from_recipe

pytestmark = [pytest.mark.nemo_rl, pytest.mark.main_snapshot]
grpo = import_nemo_rl("nemo_rl.algorithms.grpo")
if importlib.util.find_spec("nemo_rl.algorithms.single_controller") is None:
    pytest.skip("this NeMo-RL has no single controller (v0.7.0)", allow_module_level=True)
controller = import_nemo_rl("nemo_rl.algorithms.single_controller")
sc_setup = import_nemo_rl("nemo_rl.algorithms.single_controller_utils.setup")
sc_utils = import_nemo_rl("nemo_rl.algorithms.single_controller_utils.utils")
from test_chunk_metrics import assert_same, chunks_of, step_batch

from nemo_mmpo.nemo_rl import MMPOAdvantageEstimator, actor_hooks, hooks, install, run_state


def as_a_fresh_actor_process(monkeypatch):
    """The module as a new actor process imports it: NeMo-RL's reduction (and the names of the
    first-step checks), unhooked, and no estimator built in this process."""
    for name in actor_hooks.ACTOR_WRAPPERS:
        original = getattr(controller, name)
        monkeypatch.setattr(controller, name, getattr(original, hooks.MARK, original))
    monkeypatch.setattr(run_state, "RUN", run_state.RunState())  # a fresh actor process


def run_step(estimator, chunks, log_dict):
    """What the train pump does per chunk (the estimator call and its accumulators,
    single_controller.py:1778-1789) and at the step's end (:1072-1075)."""
    for prompt_ids, rewards, mask in chunks:
        advantages = estimator.compute_advantage(
            prompt_ids=prompt_ids, rewards=rewards, mask=mask, repeated_batch={}
        )
        log_dict["rewards"].append(rewards)
        log_dict["masked_advantages"].append(torch.masked_select(advantages, mask.bool()))
    step_metrics = sc_utils.aggregate_step_metrics(
        {"loss": torch.tensor([0.5]), "all_mb_metrics": {"lr": [1e-6], "global_valid_seqs": [8]}}
    )
    step_metrics.update(controller.reduce_advantage_pump_metrics(**log_dict))
    return step_metrics


def test_the_actor_logs_the_step_metrics_combined_over_its_chunks(monkeypatch):
    install()  # the driver
    master_config = master_config_from_recipe("mmpo_math_qwen3_1.7b.yaml")
    built = sc_setup._create_advantage_estimator(master_config)
    assert isinstance(built, MMPOAdvantageEstimator) and built.streaming_chunks
    as_a_fresh_actor_process(monkeypatch)
    unhooked = controller.reduce_advantage_pump_metrics
    actor_estimator = pickle.loads(pickle.dumps(built))  # as Ray hands it to the actor
    assert controller.reduce_advantage_pump_metrics is not unhooked  # hooked by unpickling
    assert actor_hooks.actor_estimator() is actor_estimator

    whole = MMPOAdvantageEstimator(master_config.grpo.adv_estimator)
    for seed in (1, 2):  # two steps: each takes its own chunks only
        batch = step_batch(seed)
        whole.compute_advantage(*batch)
        log_dict = {"rewards": [], "masked_advantages": [], "sequence_lengths": [3, 4]}
        metrics = run_step(actor_estimator, chunks_of(batch, 4, [2, 4, 1]), log_dict)
        ours = {key: value for key, value in metrics.items() if key.startswith("mmpo/")}
        assert_same(ours, whole.last_metrics)
        assert metrics["reward"] == pytest.approx(float(batch[1].mean()))  # NeMo-RL's keys stay
        assert {"loss", "lr", "advantages/mean", "total_num_tokens"} <= metrics.keys()


def test_unpickled_before_the_controllers_module_is_imported_the_hook_waits_for_it(
    monkeypatch,
):
    """Ray unpickles an actor's arguments before it imports the actor's module (the CPU rig's
    single-controller run lost every ``mmpo/`` metric while the hook applied at unpickling
    only): unpickled first, nothing is hooked yet; the module's import then hooks its
    reduction, reading the unpickled estimator."""
    import importlib
    import sys

    install()
    master_config = master_config_from_recipe("mmpo_math_qwen3_1.7b.yaml")
    built = sc_setup._create_advantage_estimator(master_config)
    monkeypatch.setattr(run_state, "RUN", run_state.RunState())  # a fresh actor process
    monkeypatch.delitem(sys.modules, hooks.SINGLE_CONTROLLER_ACTOR)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # the finder, this test's only
    unpickled = pickle.loads(pickle.dumps(built))
    assert actor_hooks.actor_estimator() is unpickled
    module = importlib.import_module(hooks.SINGLE_CONTROLLER_ACTOR)  # a fresh copy, as an actor
    assert module is not controller
    reducer = module.reduce_advantage_pump_metrics
    for name in actor_hooks.ACTOR_WRAPPERS:  # the reduction and the first-step checks
        hooked_in = getattr(getattr(module, name), actor_hooks.HOOKED_IN, None)
        assert hooked_in == hooks.SINGLE_CONTROLLER_ACTOR, name
    batch = step_batch(3)
    unpickled.compute_advantage(*batch)
    metrics = reducer(rewards=[batch[1]], masked_advantages=[], sequence_lengths=[3])
    assert metrics["mmpo/success_rate"] == pytest.approx(float(batch[1].mean()))


def test_on_a_ray_cluster_without_gpus_the_single_controller_is_refused_in_one_line(monkeypatch):
    """Outside the CPU rig its needs on a CPU are unanswered (docs/integration.md):
    ``setup_single_controller`` (as ``run_grpo_single_controller.py`` imports it) says so,
    naming the trainer and why."""
    import ray

    from nemo_mmpo import MMPOInputError

    install()
    package = import_nemo_rl("nemo_rl.algorithms.single_controller_utils")
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    with pytest.raises(MMPOInputError) as error:
        package.setup_single_controller(None, None)
    message = str(error.value)
    assert "\n" not in message and "NeMo-RL's single controller" in message
    assert "use_gpus=True (single_controller_utils/setup.py:147, 184, 193)" in message
    # with the CPU rig's answers in place (nemo_mmpo.cpu.answers.single_controller), NeMo-RL's
    # own setup runs: here it meets the missing config

    monkeypatch.setattr(run_state.RUN, "cpu_rig_answers_single_controller", True)
    with pytest.raises(AttributeError):
        package.setup_single_controller(None, None)
