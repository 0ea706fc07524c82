"""MMPO (or any estimator) in NeMo-RL's own GRPO loop on a laptop: a tiny model learning sums.

``examples/run_mmpo_math.py --config nemo_mmpo/mmpo_tiny_cpu.yaml`` lands in :func:`run`
when the recipe has ``cpu_backend.enabled: true``. What is ours and what is NeMo-RL's:

- ours: the CPU policy and generation engines (:mod:`nemo_mmpo.cpu.engines.policy`,
  :mod:`nemo_mmpo.cpu.engines.generation`), the task (:mod:`nemo_mmpo.cpu.rig.task`), the tiny
  Llama and
  its tokenizer, the measured warm start (:mod:`nemo_mmpo.cpu.rig.warm_start`), and this driver,
  which stands where NeMo-RL's ``setup()`` would build GPU workers;
- NeMo-RL's: ``grpo_train`` (``async_grpo_train`` with its trajectory collector and replay
  buffer for ``mmpo_tiny_cpu_async.yaml``), batch collation, the Math-Verify
  ``MathEnvironment`` (a Ray actor), the ``Logger`` (TensorBoard), the ``CheckpointManager``
  and its resume state, and, through ``install()``, our estimator and loss as on a cluster.

The terminal shows one line per step; NeMo-RL's own output goes to ``<logger.log_dir>/
nemo_rl.log``. A second run resumes from the newest checkpoint in
``checkpointing.checkpoint_dir``.
"""

from __future__ import annotations

import json
import random
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from nemo_mmpo.cpu.engines.ray_cluster import (
    collector_on_this_interpreter,
    ray_session,
    worker_interpreters,
)
from nemo_mmpo.cpu.rig import data_plane
from nemo_mmpo.cpu.rig.console import ProgressLogger, output_to_file
from nemo_mmpo.cpu.rig.node_watch import watch_nodes
from nemo_mmpo.cpu.rig.policy_start import (
    megatron_start,
    named_model,
    noter,
    policy_model,
    recipe_task_start,
    run_summary,
    task_start,
)
from nemo_mmpo.cpu.rig.rig_settings import TinySettings, vllm_engine_problem
from nemo_mmpo.errors import MMPOInputError, NodeDiedError, TrainingStalledError
from nemo_mmpo.nemo_rl import install, versions
from nemo_mmpo.sections import is_single_controller, plain

#: NeMo-RL's full output, in the run's log directory.
NEMO_RL_LOG = "nemo_rl.log"


def _save_state(grpo: Any, loaded: dict[str, Any] | None) -> Any:
    """The trainer's resume state, as NeMo-RL's ``setup()`` builds it (v0.7.0: the loaded
    dict or the default; main: ``_get_grpo_save_state``, a model with defaults filled in)."""
    if hasattr(grpo, "_get_grpo_save_state"):  # main
        return grpo._get_grpo_save_state(loaded)
    return loaded if loaded is not None else grpo._default_grpo_save_state()


def epochs_in_one_pass(records: list, grpo_config: dict[str, Any], seed: int) -> list:
    """The training records for NeMo-RL's async trainer, whose collector iterates the
    dataloader once and needs one batch beyond the last step (at the dataloader's end it stops
    and drops the generation in flight): as many epochs as ``grpo.max_num_steps + 1`` batches
    need (at most ``grpo.max_num_epochs``), each a seeded permutation, so that no batch
    straddles two epochs (a prompt twice in one batch would make one group of two groups'
    rollouts)."""
    prompts = grpo_config["num_prompts_per_step"]
    steps_per_epoch = len(records) // prompts
    if steps_per_epoch == 0:
        raise MMPOInputError(
            f"{len(records)} training problems make no batch of grpo.num_prompts_per_step="
            f"{prompts}: lower it or raise cpu_backend.task.train_size"
        )
    needed = -(-versions.async_batches_needed(grpo_config["max_num_steps"]) // steps_per_epoch)
    if needed > grpo_config["max_num_epochs"]:
        raise MMPOInputError(
            f"grpo.max_num_steps={grpo_config['max_num_steps']} needs {needed} epochs of "
            f"{steps_per_epoch} batches (one batch more than the steps for NeMo-RL's async "
            f"collector); set grpo.max_num_epochs={needed} or more"
        )
    passes = []
    for epoch in range(needed):
        order = list(range(len(records)))
        random.Random(seed * 100_003 + epoch).shuffle(order)
        passes.extend(records[index] for index in order[: steps_per_epoch * prompts])
    return passes


def _check_async_run_finished(checkpointer: Any, max_num_steps: int) -> None:
    """NeMo-RL's ``async_grpo_train`` prints an exception in its loop and returns; it always
    saves its last step, so a run that stopped early has no checkpoint of ``max_num_steps``."""
    latest = checkpointer.get_latest_checkpoint_path()
    info = checkpointer.load_training_info(latest) if latest is not None else None
    step = int((info or {}).get("current_step", 0))
    if step < max_num_steps:
        raise RuntimeError(
            f"NeMo-RL's async_grpo_train stopped at step {step} of grpo.max_num_steps="
            f"{max_num_steps} (its error and traceback are in {NEMO_RL_LOG}); the same command "
            "resumes from the newest checkpoint once the cause is fixed"
        )


def _root_without_async_fix(grpo: Any) -> Path | None:
    """The running NeMo-RL's checkout when its async trainer lacks
    :data:`~nemo_mmpo.nemo_rl.versions.ASYNC_RESUME_FIX` (v0.7.0), else None."""
    root = Path(grpo.__file__).resolve().parents[2]
    return root if versions.async_resume_can_stall(root) else None


def _warn_if_async_resume_can_stall(grpo: Any, note: Any) -> None:
    """NeMo-RL v0.7.0's async trainer can skip the step after the one it resumes at and wait
    forever (:func:`~nemo_mmpo.nemo_rl.versions.async_resume_can_stall`): say so up front."""
    root = _root_without_async_fix(grpo)
    if root is not None:
        note(
            f"warning: the NeMo-RL at {root} lacks {versions.ASYNC_RESUME_FIX}: a resumed async "
            "run can wait forever for the step after the one it resumes at; if no step follows, "
            "stop it and resume with a NeMo-RL that has the fix (main does)"
        )


def _validate_before_async_loop(grpo: Any, arguments: dict[str, Any]) -> None:
    """The step-0 evaluation of an async run, done here, before ``async_grpo_train`` starts
    (which then gets ``grpo.val_at_start=false``), as NeMo-RL does it: the same ``validate``
    (ours, through ``install()``), logged the same way.

    Inside the loop, NeMo-RL pauses its trajectory collector for the evaluation while step 0's
    trajectories finish, and resumes it just as the trainer takes them. The collector then
    reads which steps were consumed (none yet), the trainer removes step 0's batch, and the
    collector, finding step 0 short, generates it again instead of step 1: the trainer waits
    for step 1 forever with a full replay buffer (seen in CI on v0.7.0; main's wait for step
    1 before training, NVIDIA-NeMo/RL#3066, makes it much rarer). Evaluated before the loop,
    the collector claims step 1 while step 0 is still being generated. NeMo-RL main's
    ``stop_at_validation_threshold`` is not applied to this evaluation. As in NeMo-RL's loop,
    a failed evaluation is printed (traceback in the log) and training goes on.
    """
    logger = arguments["logger"]
    try:
        metrics, timings = grpo.validate(
            arguments["policy_generation"],
            arguments["val_dataloader"],
            arguments["tokenizer"],
            arguments["val_task_to_env"],
            step=0,
            master_config=arguments["master_config"],
            logger=logger,
        )
    except Exception as error:
        traceback.print_exc()
        logger.note(f"the evaluation at step 0 failed ({error}); training goes on without it")
        return
    logger.log_metrics(metrics, 0, prefix="validation")
    logger.log_metrics(timings, 0, prefix="timing/validation")


def _stall_check(progress: ProgressLogger, timeout_s: float, grpo: Any):
    """``stalled()`` for :func:`watch_nodes`: a message once nothing (a step, an evaluation)
    has been logged for ``timeout_s`` seconds (``cpu_backend.stall_timeout_s``)."""
    root = _root_without_async_fix(grpo)
    known = (
        f"; this NeMo-RL ({root}) lacks {versions.ASYNC_RESUME_FIX}, without which its async "
        "trainer can wait forever for the step after the one it starts or resumes at"
        if root is not None
        else ""
    )

    def stalled() -> str | None:
        quiet = time.monotonic() - progress.last_logged
        if quiet < timeout_s:
            return None
        return (
            f"NeMo-RL's async trainer logged nothing for {quiet:.0f} s after step "
            f"{progress.last_step} (cpu_backend.stall_timeout_s={timeout_s:g}): it is waiting "
            "for trajectories its collector is not generating (the collector's output is in "
            f"Ray's worker logs, /tmp/ray/session_latest/logs/worker-*.out by default){known}"
        )

    return stalled


def _resume_note(checkpointer: Any) -> str:
    """Where the same command resumes from (for an error that ends a run early)."""
    latest = checkpointer.get_latest_checkpoint_path()
    if latest is None:
        return "no checkpoint was written yet: the same command starts the run again"
    return f"the same command resumes from {latest} once the cluster is whole again"


def run(raw_config: dict[str, Any], console: Any = None) -> dict[str, Any]:
    """Train with NeMo-RL's ``grpo_train`` (``async_grpo_train`` when ``grpo.async_grpo.enabled``,
    ``grpo_train_sync`` with its ``TQPolicy`` when ``data_plane.enabled``:
    :mod:`nemo_mmpo.cpu.rig.data_plane`) on CPU; returns where things were written.

    Args:
        raw_config: the resolved recipe (NeMo-RL's ``MasterConfig`` plus ``cpu_backend``).
        console: where progress lines go (default: the terminal, with NeMo-RL's output in
            ``<logger.log_dir>/nemo_rl.log``).
    """
    raw_config = dict(raw_config)
    settings = TinySettings.from_config(raw_config.pop("cpu_backend"))
    log_dir = Path(plain(raw_config["logger"])["log_dir"])
    if console is not None:
        return _run(settings, raw_config, console)
    with output_to_file(log_dir / NEMO_RL_LOG) as terminal:
        terminal.write(f"[nemo-mmpo] NeMo-RL's output: {log_dir / NEMO_RL_LOG}\n")
        return _run(settings, raw_config, terminal)


def _run(settings: TinySettings, raw_config: dict[str, Any], console: Any) -> dict[str, Any]:
    if is_single_controller(raw_config):  # NeMo-RL main's single controller
        from nemo_mmpo.cpu.rig import single_controller

        return single_controller.run(settings, raw_config, console)
    install()  # before Ray starts: the estimator and loss hooks, the workers' path
    from nemo_rl.algorithms import grpo
    from nemo_rl.data.utils import load_dataloader_state
    from nemo_rl.utils.checkpoint import CheckpointManager
    from nemo_rl.utils.logger import Logger

    # imports nemo_rl and ray: not on a login node
    from nemo_mmpo.cpu.answers import megatron_shims, vllm_shims

    master_config = grpo.MasterConfig(**raw_config)  # NeMo-RL validates it (v0.7.0 and main)
    master = {name: plain(getattr(master_config, name)) for name in raw_config}
    grpo_config = master["grpo"]

    note = noter(console)
    checkpointer = CheckpointManager(master_config.checkpointing)
    checkpoint_dir = Path(master["checkpointing"]["checkpoint_dir"])
    sums = None  # the rig's sums as the recipe's data is formatted (its warm start's prompts)
    if settings.problems == "recipe":  # the recipe's own data section, through NeMo-RL's setup
        tokenizer, records, sums = recipe_task_start(settings, master["data"])
        held_out_file = None
    else:
        tokenizer, records, held_out_file = task_start(settings, checkpoint_dir)
    task_names = sorted({record["task_name"] for record in records})
    megatron = settings.policy == "megatron"
    if megatron:
        start = megatron_start(settings, tokenizer, master, checkpointer, note, sums)
        model, optimizer_path, loaded_info, last = start, None, start[3], start[4]
        # the model the workers import, in the config NeMo-RL saves with every checkpoint (as
        # its setup() hands them policy.model_name): NeMo-RL's converter reads it from there
        raw_config = named_model(raw_config, start[0])
        master_config = grpo.MasterConfig(**raw_config)
        master = {name: plain(getattr(master_config, name)) for name in raw_config}
    else:
        model, optimizer_path, loaded_info, last = policy_model(
            settings, tokenizer, master, checkpointer, note, sums
        )
    # The RL run's randomness starts here, the same whether the warm start was trained now or
    # read from the cache (it draws from the global RNG).
    random.seed(settings.seed)
    torch.manual_seed(settings.seed)
    asynchronous = bool((grpo_config.get("async_grpo") or {}).get("enabled"))
    problem = data_plane.data_plane_problem(master, settings.policy, asynchronous)
    if problem:
        raise MMPOInputError(problem)
    dataloader = _dataloader(records, grpo_config, settings.seed, asynchronous)
    if last is not None:  # resume as NeMo-RL's setup() does, with its own helper
        load_dataloader_state(dataloader, last, master["data"])
        if asynchronous:
            _warn_if_async_resume_can_stall(grpo, note)
    save_state = _save_state(grpo, loaded_info)
    hook = vllm_shims.SETUP_HOOK if settings.engine == "vllm" else None
    synchronous_data_plane = data_plane.data_plane_section(master) is not None
    ray_cpus = settings.ray_cpus() + (data_plane.DATA_PLANE_CPUS if synchronous_data_plane else 0)
    with (
        ray_session(megatron_shims.SETUP_HOOK if megatron else hook, ray_cpus),
        cpu_policy(model, tokenizer, settings, master, len(records)) as policy,
        cpu_engines(policy, settings, master) as (generation, environment),
    ):
        if optimizer_path is not None:
            policy.load_optimizer(optimizer_path)
        # asked before training: a trainer may shut its engines down when it ends (the sync one)
        interpreters = worker_interpreters(policy, generation)
        arguments = {
            "policy": policy,
            "policy_generation": generation,
            "val_dataloader": None,
            "tokenizer": tokenizer,
            "loss_fn": grpo.ClippedPGLossFn(master_config.loss_fn),
            "task_to_env": {name: environment for name in task_names},
            "val_task_to_env": None,
            "logger": ProgressLogger(
                Logger(master_config.logger), grpo_config["max_num_steps"], console
            ),
            "checkpointer": checkpointer,
            "grpo_save_state": save_state,
            "master_config": master_config,
        }
        if asynchronous:
            resumed = last is not None
            _train_async(grpo, dataloader, arguments, raw_config, master, settings, resumed)
        elif synchronous_data_plane:  # NeMo-RL's run_grpo.py with data_plane.enabled: true
            data_plane.train_sync(arguments, dataloader)
        else:
            grpo.grpo_train(wrapped_dataloader=dataloader, **arguments)
        if interpreters:  # NeMo-RL's workers: each in the environment its registry names
            note(f"workers' interpreters: {json.dumps(interpreters)}")
    return run_summary(checkpointer, held_out_file, master["logger"]["log_dir"], note)


def _dataloader(
    records: list[Any], grpo_config: dict[str, Any], seed: int, asynchronous: bool
) -> Any:
    """The training dataloader as NeMo-RL's setup() builds it (batches of
    ``num_prompts_per_step`` prompts)."""
    from nemo_rl.data.collate_fn import rl_collate_fn
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader(
        epochs_in_one_pass(records, grpo_config, seed) if asynchronous else records,
        batch_size=grpo_config["num_prompts_per_step"],
        # sync: shuffled from the seeded global RNG, as NeMo-RL's setup() (an explicit
        # generator is not restored by StatefulDataLoader at an epoch's end); async: the
        # epochs are already shuffled into the one pass
        shuffle=not asynchronous,
        collate_fn=rl_collate_fn,
        drop_last=True,
    )


def _train_async(
    grpo: Any,
    dataloader: Any,
    arguments: dict[str, Any],
    raw_config: dict[str, Any],
    master: dict[str, Any],
    settings: TinySettings,
    resumed: bool,
) -> None:
    """NeMo-RL's ``async_grpo_train``: the step-0 evaluation first (a fresh run), the collector
    on this interpreter, the node and stall watch; a lost node or a stall is an error naming
    where to resume, and a finished run must have its last checkpoint."""
    from nemo_rl.distributed.virtual_cluster import PY_EXECUTABLES

    grpo_config = master["grpo"]
    checkpointer = arguments["checkpointer"]
    if settings.engine == "vllm":
        # vLLM starts from dummy weights, as on a GPU node; NeMo-RL's loop starts its collector
        # before its first refit: refit first (NeMo-RL's non-colocated refit), so the step-0
        # evaluation and the first rollouts see the policy's weights
        grpo.refit_policy_generation(
            arguments["policy"], arguments["policy_generation"], colocated_inference=False
        )
    if grpo_config["val_at_start"] and not resumed:
        _validate_before_async_loop(grpo, arguments)
        arguments["master_config"] = grpo.MasterConfig(
            **dict(raw_config, grpo=dict(grpo_config, val_at_start=False))
        )
    age = grpo_config["async_grpo"]["max_trajectory_age_steps"]
    stalled = _stall_check(arguments["logger"], settings.stall_timeout_s, grpo)
    try:  # a Ray node lost, or a step never generated: an error, not an endless wait
        with (
            collector_on_this_interpreter(PY_EXECUTABLES.SYSTEM),
            watch_nodes(stalled=stalled),
        ):
            grpo.async_grpo_train(dataloader=dataloader, max_trajectory_age_steps=age, **arguments)
    except (NodeDiedError, TrainingStalledError) as error:
        raise type(error)(f"{error}; {_resume_note(checkpointer)}") from None
    if master["checkpointing"].get("enabled", True):
        _check_async_run_finished(checkpointer, grpo_config["max_num_steps"])


@contextmanager
def cpu_policy(
    model: Any, tokenizer: Any, settings: TinySettings, master: dict, train_size: int
) -> Iterator[Any]:
    """The run's policy (``cpu_backend.policy``) in the Ray session, stopped afterwards: ours
    on ``transformers`` in this process (``model``: the Hugging Face model), or NeMo-RL's
    ``Policy`` with its ``MegatronPolicyWorker`` actors (``model``: what
    :func:`~nemo_mmpo.cpu.rig.policy_start.megatron_start` returns) on
    ``cpu_backend.megatron_ranks`` CPU workers."""
    # import ray and NeMo-RL where a run starts, as cpu.policy
    from nemo_mmpo.cpu.engines import megatron_policy
    from nemo_mmpo.cpu.engines.policy import CPUPolicy

    if settings.policy == "megatron":
        start_folder, weights_path, optimizer_path, _, _ = model
        config = megatron_policy.megatron_policy_config(
            _vllm_policy_section(master, start_folder, tokenizer),
            master["grpo"],
            train_size,
            start_folder,
        )
        dp_cfg = data_plane.data_plane_section(master)
        if dp_cfg is not None:  # run_grpo.py's TQPolicy (data_plane.enabled: true)
            policy = data_plane.start_tq_megatron_policy(
                config, tokenizer, settings.megatron_ranks, dp_cfg, weights_path, optimizer_path
            )
        else:
            policy = megatron_policy.start_megatron_policy(
                config, tokenizer, settings.megatron_ranks, weights_path, optimizer_path
            )
        policy.start_folder = start_folder
        stop = megatron_policy.shutdown_megatron_policy
    else:
        policy_config = dict(master["policy"], optimizer={"kwargs": {"lr": settings.learning_rate}})
        policy = CPUPolicy(model, tokenizer, policy_config)
        stop = CPUPolicy.shutdown
    try:
        yield policy
    finally:
        stop(policy)


def _vllm_policy_section(master: dict, model_dir: Path, tokenizer: Any) -> dict[str, Any]:
    """NeMo-RL's ``policy`` section with ``generation`` as the vLLM engine gets it
    (:func:`~nemo_mmpo.cpu.engines.vllm_generation.cpu_generation_config`): NeMo-RL's workers read
    it (the refit's export checks the KV cache's dtype, ``megatron_policy_worker.py:1352``)."""
    from nemo_mmpo.cpu.engines import vllm_generation

    generation = vllm_generation.cpu_generation_config(
        master["policy"]["generation"],
        model_dir,
        int(master["policy"]["max_total_sequence_length"]),
        tokenizer,
    )
    return dict(master["policy"], generation=generation)


@contextmanager
def cpu_engines(policy: Any, settings: TinySettings, master: dict) -> Iterator[tuple[Any, Any]]:
    """``(generation engine, NeMo-RL's math environment)`` in the running Ray session (placed
    where ``cpu_backend.placement`` says), both stopped afterwards."""
    import ray
    from nemo_rl.distributed.virtual_cluster import PY_EXECUTABLES
    from nemo_rl.environments.math_environment import MathEnvironment

    # import ray (and vLLM's NeMo-RL classes) at import time, as cpu.policy does: imported
    # only where a run starts
    from nemo_mmpo.cpu.engines import vllm_generation
    from nemo_mmpo.cpu.engines.generation import CPUGeneration, SeparateCPUGeneration

    asynchronous = bool((master["grpo"].get("async_grpo") or {}).get("enabled"))
    placement = settings.placement
    generation_config = master["policy"]["generation"]
    vllm = settings.engine == "vllm"
    if vllm:  # NeMo-RL's own VllmGeneration, on vLLM's CPU build
        generation = _vllm_engine(policy, master, settings.rollout_seed())
    elif asynchronous:  # NeMo-RL's async layout: generation in its own process
        generation = SeparateCPUGeneration(
            policy, generation_config, settings.seed, placement.generation
        )
    else:
        generation = CPUGeneration(policy, generation_config)
    environment = MathEnvironment.options(
        runtime_env={"py_executable": PY_EXECUTABLES.SYSTEM}, **placement.environment
    ).remote(master["env"]["math"])
    try:
        yield generation, environment
    finally:
        if vllm:
            vllm_generation.shutdown_generation(generation)
        else:
            generation.shutdown()
        ray.kill(environment)


def _vllm_engine(policy: Any, master: dict, rollout_seed: int | None = None) -> Any:
    """NeMo-RL's ``VllmGeneration`` on a CPU Ray bundle, started from the policy's weights
    saved in ``<logger.log_dir>/vllm_model`` (vLLM reads the config and tokenizer there; its
    weights arrive by NeMo-RL's refit, through Ray's object store); ``rollout_seed``
    (``cpu_backend.seeded_rollouts``): each rollout its own vLLM seed derived from it."""
    from nemo_mmpo.cpu.answers import vllm_refit
    from nemo_mmpo.cpu.engines import vllm_generation

    problem = vllm_engine_problem(master)
    if problem:
        raise MMPOInputError(problem)
    model_dir = getattr(policy, "start_folder", None)  # NeMo-RL's Megatron policy
    if model_dir is None:
        model_dir = vllm_generation.save_for_vllm(
            policy.model, policy.tokenizer, Path(master["logger"]["log_dir"]) / "vllm_model"
        )
    config = vllm_generation.cpu_generation_config(
        master["policy"]["generation"],
        model_dir,
        int(master["policy"]["max_total_sequence_length"]),
        policy.tokenizer,
        rollout_seed,
    )
    policy.weight_mailbox = vllm_refit.start_mailbox()
    return vllm_generation.cpu_vllm_generation(policy, config)
