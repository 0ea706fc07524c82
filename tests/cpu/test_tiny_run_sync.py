"""The TransferQueue tiny recipe (``mmpo_tiny_cpu_sync.yaml``): NeMo-RL main's
``grpo_train_sync`` (``data_plane.enabled: true``, the trainer ``run_grpo.py`` picks then) with
NeMo-RL's own ``TQPolicy`` over its ``MegatronPolicyWorker`` (TP2) and the colocated
``VllmGeneration`` on vLLM's CPU build; rollouts, log-probs and training batches travel through
TransferQueue (PyPI's transferqueue 0.1.11, backend ``simple``).

What holds by construction, checked on one run killed with SIGKILL after step 2's checkpoint
and resumed: the trainer is ``grpo_train_sync`` (NeMo-RL's ``grpo_train`` is never called;
each resumed step registers its TransferQueue partition); every step NeMo-RL logs carries our
estimator's ``mmpo/`` metrics (``install()``'s hook of
``grpo_sync``'s factory and metrics function: an unhooked step would have none); the paper's
evaluation ran inside the loop at its period, through the hooked ``validate_sync`` (its
``step_N.jsonl`` written at steps 2 and 4, once per held-out problem and sample); the resumed
run starts at the saved step and runs each later step once; every step is on-policy (vLLM
samples from the weights the worker exports, both float32). NeMo-RL main only: the data plane
NeMo-RL v0.7.0 ships pins another TransferQueue (b266d39, numpy < 2).

The recipe is a researcher's, in a folder of its own beside their plug-in module
(``nemo_mmpo.plugins``, docs/own-objective.md): its estimator is MMPO's plug-in formula
registered under the researcher's name, its loss NeMo-RL's surrogate plus a logged term of
weight 0, so the run trains what ``name: mmpo`` trains while the plug-in goes everywhere a
plug-in must: the driver, ``grpo_train_sync``'s hooks, and the Megatron workers, which import
the module to unpickle the loss (its metric logged at every step proves the loss they ran).
"""

from __future__ import annotations

import functools
import json
import sys

import pytest
from in_loop_evaluation import HELD_OUT_PROBLEMS
from killed_runs import (
    check_on_policy,
    check_resumed,
    check_terminal_shows_our_lines_only,
    run_until_step_then_kill,
)
from learning_check import fifty_step_overrides
from nemo_rl_support import Console, import_nemo_rl, nemo_rl_checkout

pytestmark = [pytest.mark.nemo_rl, pytest.mark.main_snapshot, pytest.mark.long_run]
import_nemo_rl("vllm")
import_nemo_rl("megatron.core")
import_nemo_rl("transfer_queue")

from nemo_mmpo.cpu.rig import driver
from nemo_mmpo.cpu.spread.curves import reward_curve
from nemo_mmpo.nemo_rl import install
from nemo_mmpo.plugins import load_plugins, recipe_plugins
from nemo_mmpo.recipes import load

RECIPE = "mmpo_tiny_cpu_sync.yaml"
#: the researcher's plug-in (beside their recipe) and the metric its loss logs every step
PLUGIN = """
from nemo_rl.algorithms.loss import ClippedPGLossFn

from nemo_mmpo import register_estimator
from nemo_mmpo.estimators import get_estimator
from nemo_mmpo.losses import register_loss


@register_estimator("plugin_of_a_researcher")
def plugin_of_a_researcher(groups, objective):
    return get_estimator("plugin")(groups, objective)


@register_loss("surrogate_of_a_researcher")
class SurrogateOfAResearcher(ClippedPGLossFn):
    def __call__(self, next_token_logprobs, data, *args, **kwargs):
        loss, metrics = super().__call__(next_token_logprobs, data, *args, **kwargs)
        term = next_token_logprobs.mean()
        metrics["researcher/logged_term"] = term.item()
        return loss + 0.0 * term, metrics  # logged, not trained: the run stays MMPO's
"""
RESEARCHERS_RECIPE = f"""defaults: nemo_mmpo/{RECIPE}
nemo_mmpo:
  plugins: [objectives_of_a_researcher]
grpo:
  adv_estimator:
    name: plugin_of_a_researcher
loss_fn:
  name: surrogate_of_a_researcher
"""
LOSS_METRIC = "train/researcher/logged_term"
STEPS = 4
#: the paper's evaluation inside the loop every 2 steps (2 and 4: one before the kill, one
#: after the resume), 2 samples per held-out problem
EVALUATION_SAMPLES = 2
IN_LOOP_EVERY_2 = [
    "evaluation.enabled=true",
    "grpo.val_period=2",
    f"evaluation.samples={EVALUATION_SAMPLES}",
]
#: one of the step metrics our estimator reports every step (``mmpo/``, in NeMo-RL's logger)
MMPO_METRIC = "train/mmpo/success_rate"


def report(request, line: str) -> None:
    """``line`` in the CI log (scripts/test_nemo_rl.sh prints lines starting ``megatron-``)."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        sys.stdout.write(f"\n{line}\n")


def logged_steps(logs, tag: str) -> set[int]:
    return {step for step, _ in reward_curve(logs, tag)}


def check_evaluated(logs, step: int) -> None:
    """The in-loop evaluation of ``step``: every held-out problem, each sample once."""
    rollouts = logs / "evaluation" / f"step_{step}.jsonl"
    keys = [
        (record["problem_id"], record["sample"])
        for record in map(json.loads, rollouts.read_text().splitlines())
    ]
    assert len(keys) == len(set(keys)) == HELD_OUT_PROBLEMS * EVALUATION_SAMPLES
    assert (logs / "evaluation" / f"step_{step}.json").is_file()


def test_sync_recipe_trains_mmpo_evaluates_and_resumes_after_kill_9(
    request, tmp_path, tiny_warm_starts, monkeypatch
):
    grpo = import_nemo_rl("nemo_rl.algorithms.grpo")

    overrides = [
        *fifty_step_overrides(tmp_path, tiny_warm_starts),
        f"grpo.max_num_steps={STEPS}",
        *IN_LOOP_EVERY_2,
    ]
    folder = tmp_path / "my_project"  # the researcher's recipe beside their plug-in
    folder.mkdir()
    (folder / "objectives_of_a_researcher.py").write_text(PLUGIN)
    recipe = folder / "my_recipe.yaml"
    recipe.write_text(RESEARCHERS_RECIPE)
    # the killed run: a subprocess, as a person runs the recipe
    killed = run_until_step_then_kill(
        str(recipe), [*overrides, "checkpointing.save_period=2"], tmp_path, STEPS, kill_after=3
    )
    assert f"step    2/{STEPS}" in killed
    assert (tmp_path / "checkpoints" / "step_2" / "policy" / "weights").is_dir()
    # NeMo-RL main's resume finds Adam's state in the workers' own checkpoint (v0.7.0 does
    # not: docs/cpu-answers.md); the resumed run below is started from these paths
    checkpoint = import_nemo_rl("nemo_rl.utils.checkpoint")
    weights, optimizer = checkpoint.CheckpointManager.get_resume_paths(
        tmp_path / "checkpoints" / "step_2"
    )
    assert weights is not None and optimizer is not None, "a fresh Adam on resume"
    check_terminal_shows_our_lines_only(killed, tmp_path / "logs", printed_steps=3)
    check_evaluated(tmp_path / "logs", 2)

    # the resumed run, in this process: NeMo-RL's grpo_train never runs, and every step
    # registers its TransferQueue partition (TQPolicy.prepare_step, called by grpo_train_sync)
    tq_policy = import_nemo_rl("nemo_rl.models.policy.tq_policy").TQPolicy
    partitions = []
    prepare_step = tq_policy.prepare_step

    def counted_prepare_step(self, *args, **kwargs):
        partitions.append(kwargs.get("num_samples"))
        return prepare_step(self, *args, **kwargs)

    # the plug-in, as `nemo-mmpo train` imports it (before install(), which fixes the registry)
    loaded = load(recipe, overrides)
    load_plugins(recipe_plugins(loaded.config), folder)
    # a stand-in that keeps the hooked grpo_train's name, signature and hook marks, so the
    # driver's install() finds its hook in place (install() refuses a grpo_train of another
    # name or signature: an alias off the trainer's path)
    install()

    @functools.wraps(grpo.grpo_train)
    def no_legacy(*args, **kwargs):
        raise AssertionError("data_plane.enabled=true ran NeMo-RL's grpo_train")

    monkeypatch.setattr(tq_policy, "prepare_step", counted_prepare_step)
    monkeypatch.setattr(grpo, "grpo_train", no_legacy)
    console = Console()
    summary = driver.run(loaded.config, console=console)
    start = check_resumed(console.lines, summary, STEPS)
    assert partitions == [64] * (STEPS - start)  # 8 prompts x 8 rollouts a step
    logs = tmp_path / "logs"
    check_on_policy(logs, start + 1, STEPS)
    check_evaluated(logs, STEPS)
    # every step NeMo-RL logged (the killed run's last ones may be lost unflushed) was trained
    # with our estimator: its mmpo/ metrics are there, the resumed run's steps among them
    trained = logged_steps(logs, "train/reward")
    assert set(range(start + 1, STEPS + 1)) <= trained
    assert logged_steps(logs, MMPO_METRIC) == trained
    assert logged_steps(logs, LOSS_METRIC) == trained  # the workers ran the plug-in's loss
    assert {step for step, _ in reward_curve(logs, "validation/paper/average")} >= {STEPS}
    report(
        request,
        f"megatron-worker {nemo_rl_checkout().name}: NeMo-RL's grpo_train_sync (TransferQueue, "
        f"TQPolicy over MegatronPolicyWorker TP2) trained {RECIPE} with a researcher's plug-in "
        f"estimator and loss (MMPO's formula, NeMo-RL's surrogate) for {STEPS} steps, "
        f"mmpo/ metrics logged at steps {sorted(trained)}, the paper's evaluation in the loop "
        f"(validate_sync) at steps 2 and {STEPS}, killed with SIGKILL and resumed from its "
        f"Megatron checkpoint of step {start} (Adam's state found there by NeMo-RL's "
        "get_resume_paths), on-policy at every step",
    )
