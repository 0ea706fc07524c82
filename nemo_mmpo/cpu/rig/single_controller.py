"""NeMo-RL main's single controller on the CPU rig (a recipe with ``async_rl``, e.g.
``mmpo_tiny_cpu_single_controller.yaml``): what ``examples/run_grpo_single_controller.py`` does
(main 7ea279ab, ``:84-165``), with the rig's warm start, task and engines.

NeMo-RL's: its ``MasterConfig`` (validated), ``setup_single_controller`` (the resume, the
dataloader, the data-plane client, the weight synchronizer, the estimator and loss through
``install()``, the replay buffer, the rollout manager), the ``SingleControllerActor`` that runs
the whole loop (rollouts, advantages per streaming chunk, the Megatron split training API,
weight syncs, checkpoints, its own ``Logger``) and the shutdown order of its script. The rig's:
the warm start, the task's records and held-out file, the Ray session, NeMo-RL's
``MathEnvironment`` actor, and the four answers of
:mod:`nemo_mmpo.cpu.answers.single_controller` (CPU clusters, the vLLM and Megatron engines on
them, the task as the dataset).

The terminal shows the plan, a line per checkpoint NeMo-RL writes and the summary; the driver's
NeMo-RL output goes to ``<logger.log_dir>/nemo_rl.log``, the controller's step lines to its Ray
worker log (``/tmp/ray/session_latest/logs/worker-*.out`` by default: the rig's Ray does not
forward workers' output), its metrics to TensorBoard under ``logger.log_dir``.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nemo_mmpo.cpu.engines.ray_cluster import ray_session
from nemo_mmpo.cpu.rig import data_plane
from nemo_mmpo.cpu.rig.policy_start import (
    megatron_start,
    named_model,
    noter,
    run_summary,
    task_start,
)
from nemo_mmpo.cpu.rig.rig_settings import TinySettings
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.nemo_rl import install
from nemo_mmpo.sections import plain

#: Ray logical CPUs the single controller adds to the sync recipe's: its actor
#: (``single_controller.py:91``, ``num_cpus=1``).
CONTROLLER_CPUS = 1


def problem(policy: str, engine: str) -> str | None:
    """Why the CPU rig cannot run a single-controller recipe with ``cpu_backend.policy`` and
    ``cpu_backend.engine`` set so, or None (also the launcher's dry run)."""
    if policy != "megatron" or engine != "vllm":
        return (
            "async_rl: NeMo-RL's single controller trains through MegatronPolicyWorker's split "
            "training API and generates with vLLM's async engine only: set "
            "cpu_backend.policy=megatron and cpu_backend.engine=vllm, as "
            "nemo_mmpo/mmpo_tiny_cpu_single_controller.yaml does"
        )
    return None


def run(settings: TinySettings, raw_config: dict[str, Any], console: Any) -> dict[str, Any]:
    """Train ``raw_config`` (without ``cpu_backend``) with NeMo-RL's single controller on CPU;
    returns where things were written (as the rig's :mod:`~nemo_mmpo.cpu.rig.driver`)."""
    found = problem(settings.policy, settings.engine)
    if found:
        raise MMPOInputError(found)
    install()  # before Ray starts: the estimator and loss hooks, the workers' path
    from nemo_rl.algorithms.single_controller_utils.config import MasterConfig
    from nemo_rl.utils.checkpoint import CheckpointManager

    note = noter(console)
    master_config = MasterConfig(**raw_config)  # NeMo-RL validates it
    master = {name: plain(getattr(master_config, name)) for name in raw_config}
    checkpointer = CheckpointManager(master_config.checkpointing)
    checkpoint_dir = Path(master["checkpointing"]["checkpoint_dir"])
    tokenizer, records, held_out_file = task_start(settings, checkpoint_dir)
    start_folder = megatron_start(settings, tokenizer, master, checkpointer, note)[0]
    raw_config = named_model(raw_config, start_folder)
    master_config = MasterConfig(**raw_config)
    cpus = settings.ray_cpus() + data_plane.DATA_PLANE_CPUS + CONTROLLER_CPUS
    from nemo_mmpo.cpu.answers import megatron_shims

    with (
        ray_session(megatron_shims.SETUP_HOOK, cpus),
        _math_environment(master, settings) as environment,
        checkpoints_noted(checkpoint_dir, note),
    ):
        _train(master_config, tokenizer, records, environment, start_folder, settings)
    return run_summary(checkpointer, held_out_file, master["logger"]["log_dir"], note)


def _train(
    master_config: Any,
    tokenizer: Any,
    records: list[Any],
    environment: Any,
    start_folder: Path,
    settings: TinySettings,
) -> None:
    """``run_grpo_single_controller.py:138-165``: setup, the controller's run, the shutdown."""
    import ray
    from nemo_rl.algorithms.single_controller import SingleControllerActor
    from nemo_rl.algorithms.single_controller_utils import setup

    from nemo_mmpo.cpu.answers import single_controller, vllm_refit

    box = vllm_refit.start_mailbox()  # the weight synchronizer's CPU transport
    with single_controller.answered(
        megatron_ranks=settings.megatron_ranks,
        start_generation=functools.partial(_start_generation, start_folder, tokenizer),
        start_trainer=functools.partial(
            _start_trainer, start_folder, tokenizer, len(records), settings.megatron_ranks
        ),
        records=records,
        environment=environment,
    ) as built:
        try:
            actor_args, timings = setup.setup_single_controller(master_config, tokenizer)
        except BaseException:
            _shut_down(built)
            raise
    try:
        controller = SingleControllerActor.remote(
            master_config=master_config, actor_args=actor_args, setup_timing_metrics=timings
        )
        ray.get(controller.run.remote())
    finally:
        _shut_down(built)
        ray.kill(box)


def _cpu_generation_config(master_config: Any, start_folder: Path, tokenizer: Any) -> dict:
    """The recipe's ``policy.generation`` for vLLM's CPU build, started from ``start_folder``."""
    from nemo_mmpo.cpu.engines import vllm_generation

    policy = master_config.policy
    return vllm_generation.cpu_generation_config(
        policy["generation"], start_folder, int(policy["max_total_sequence_length"]), tokenizer
    )


def _start_generation(
    start_folder: Path, tokenizer: Any, inference_cluster: Any, master_config: Any
) -> Any:
    """NeMo-RL's ``VllmGeneration`` (the rig's subclass) on the inference cluster, loaded, as
    ``setup.py:_build_generation`` builds it on GPUs."""
    from nemo_mmpo.cpu.engines import vllm_generation

    config = _cpu_generation_config(master_config, start_folder, tokenizer)
    generation = vllm_generation.CPUVllmGeneration(
        cluster=inference_cluster, config=config, name_prefix="vllm_policy"
    )
    generation.tokenizer = tokenizer
    generation.finish_generation()
    return generation


def _start_trainer(
    start_folder: Path,
    tokenizer: Any,
    train_size: int,
    megatron_ranks: int,
    train_cluster: Any,
    master_config: Any,
    weights_path: Any,
    optimizer_path: Any,
) -> Any:
    """NeMo-RL's ``TQPolicy`` over its Megatron workers on the train cluster, from the newest
    checkpoint NeMo-RL's setup found (``weights_path``, ``optimizer_path``), as
    ``setup.py:_build_trainer`` builds it on GPUs."""
    from nemo_rl.models.policy.tq_policy import TQPolicy

    from nemo_mmpo.cpu.engines import megatron_policy

    generation = _cpu_generation_config(master_config, start_folder, tokenizer)
    grpo = master_config.grpo
    config = megatron_policy.megatron_policy_config(
        dict(master_config.policy, generation=generation),
        {"max_num_steps": grpo.max_num_steps, "max_num_epochs": grpo.max_num_epochs},
        train_size,
        start_folder,
    )
    return megatron_policy.start_megatron_policy(
        config,
        tokenizer,
        megatron_ranks,
        weights_path,
        optimizer_path,
        policy_class=TQPolicy,
        cluster=train_cluster,
        dp_cfg=master_config.data_plane,
    )


def _shut_down(built: dict[str, Any]) -> None:
    """Generation before the trainer, as ``run_grpo_single_controller.py:150-165``; then the
    clusters the answers built."""
    for name in ("generation", "trainer"):
        resource = built.get(name)
        if resource is not None:
            try:
                resource.shutdown()
            except Exception as error:  # as NeMo-RL's script: report, go on shutting down
                print(f"{name} shutdown failed: {error}")
    for cluster in built.get("clusters", []):
        cluster.shutdown()


@contextmanager
def _math_environment(master: dict[str, Any], settings: TinySettings) -> Iterator[Any]:
    """NeMo-RL's ``MathEnvironment`` actor (what ``setup_response_data`` starts from
    ``env.math``), on the driver's interpreter, where ``cpu_backend.placement`` says."""
    import ray
    from nemo_rl.distributed.virtual_cluster import PY_EXECUTABLES
    from nemo_rl.environments.math_environment import MathEnvironment

    environment = MathEnvironment.options(
        runtime_env={"py_executable": PY_EXECUTABLES.SYSTEM}, **settings.placement.environment
    ).remote(master["env"]["math"])
    try:
        yield environment
    finally:
        ray.kill(environment)


@contextmanager
def checkpoints_noted(checkpoint_dir: Path, note: Any, every_s: float = 2.0) -> Iterator[None]:
    """A terminal line for every ``step_N`` checkpoint NeMo-RL writes while the block runs
    (the controller's own step lines are in its actor's output)."""
    seen = {path.name for path in checkpoint_dir.glob("step_*")}
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(every_s):
            for path in sorted(checkpoint_dir.glob("step_*"), key=_step_number):
                if path.name not in seen and (path / "training_info.json").is_file():
                    seen.add(path.name)
                    note(f"checkpoint {path}")

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _step_number(path: Path) -> int:
    suffix = path.name.removeprefix("step_")
    return int(suffix) if suffix.isdigit() else -1
