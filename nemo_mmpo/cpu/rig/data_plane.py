"""NeMo-RL's TransferQueue trainer on the CPU rig (``data_plane.enabled: true``, recipe
``mmpo_tiny_cpu_sync.yaml``): ``grpo_train_sync`` with NeMo-RL's own ``TQPolicy`` over its
``MegatronPolicyWorker`` actors, the path a GPU run of ``examples/run_grpo.py`` takes
(``run_grpo.py:41-53, 137-146``, main 7ea279ab).

What this module builds is what ``run_grpo.py`` and NeMo-RL's ``setup()`` build for that path,
nothing of ours in the loop: the ``TQPolicy`` (which bootstraps TransferQueue's controller and
storage units on the driver and attaches every worker as a client), and the Ray actors the
trainer starts itself (its ``SyncRolloutActor``, on the driver's interpreter, as the rig's
other NeMo-RL actors). The CPU answers TransferQueue's adapter needs are in
:mod:`nemo_mmpo.cpu.answers.transfer_queue`; the workers' are the Megatron worker's
(:mod:`nemo_mmpo.cpu.answers.megatron_shims`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from nemo_mmpo.errors import MMPOInputError

#: Ray logical CPUs the data plane adds to a run: TransferQueue's controller and its one storage
#: unit (``num_cpus=1`` each, ``controller.py:943``, ``simple_storage.py:722`` of transferqueue
#: 0.1.11) and NeMo-RL's ``SyncRolloutActor`` (Ray's default actor, one CPU to be placed).
DATA_PLANE_CPUS = 3
#: The actor ``grpo_train_sync`` starts with NeMo-RL's vLLM environment
#: (``ray_actor_environment_registry.py``; ``grpo_sync.py:489``).
ROLLOUT_ACTOR = "nemo_rl.experience.sync_rollout_actor.SyncRolloutActor"


def data_plane_section(master: dict[str, Any]) -> dict[str, Any] | None:
    """The recipe's ``data_plane`` section when it is enabled (NeMo-RL then runs
    ``grpo_train_sync``), else None."""
    section = master.get("data_plane") or {}
    return dict(section) if section.get("enabled") else None


def data_plane_problem(master: dict[str, Any], policy: str, asynchronous: bool) -> str | None:
    """Why the CPU rig cannot run this recipe's data plane, or None."""
    if data_plane_section(master) is None:
        return None
    if asynchronous:
        return (
            "data_plane.enabled=true with grpo.async_grpo.enabled=true: NeMo-RL's run_grpo.py "
            "runs its data plane with the synchronous trainer (grpo_train_sync) only"
        )
    if policy != "megatron":
        return (
            "data_plane.enabled=true trains with NeMo-RL's TQPolicy, which the CPU rig builds "
            "over NeMo-RL's MegatronPolicyWorker: set cpu_backend.policy=megatron (and "
            "cpu_backend.engine=vllm), as nemo_mmpo/mmpo_tiny_cpu_sync.yaml does"
        )
    return None


def start_tq_megatron_policy(
    config: dict[str, Any],
    tokenizer: Any,
    workers: int,
    dp_cfg: dict[str, Any],
    weights_path: str | None = None,
    optimizer_path: str | None = None,
) -> Any:
    """NeMo-RL's ``TQPolicy`` (``run_grpo.py:137-146``) on ``workers`` CPU bundles, started as
    :func:`~nemo_mmpo.cpu.engines.megatron_policy.start_megatron_policy` starts its ``Policy``:
    the same workers, plus TransferQueue's controller and storage bootstrapped on this driver
    and every worker attached to it (``tq_policy.py``, ``setup_data_plane``)."""
    from nemo_rl.models.policy.tq_policy import TQPolicy

    from nemo_mmpo.cpu.answers import transfer_queue
    from nemo_mmpo.cpu.engines.megatron_policy import start_megatron_policy

    transfer_queue.install()
    return start_megatron_policy(
        config,
        tokenizer,
        workers,
        weights_path,
        optimizer_path,
        policy_class=TQPolicy,
        dp_cfg=dp_cfg,
    )


@contextmanager
def rollout_actor_on_this_interpreter(executable: str) -> Iterator[None]:
    """Start ``grpo_train_sync``'s ``SyncRolloutActor`` on the driver's interpreter while the
    block runs: NeMo-RL's registry starts it in its uv-built vLLM environment
    (``make_actor_runtime_env``, ``venvs.py:196``), which a CPU machine does not have (the
    vLLM overlay the rig runs in is the driver's own)."""
    from nemo_rl.distributed.ray_actor_environment_registry import ACTOR_ENVIRONMENT_REGISTRY

    previous = ACTOR_ENVIRONMENT_REGISTRY.get(ROLLOUT_ACTOR)
    ACTOR_ENVIRONMENT_REGISTRY[ROLLOUT_ACTOR] = executable
    try:
        yield
    finally:
        if previous is None:
            ACTOR_ENVIRONMENT_REGISTRY.pop(ROLLOUT_ACTOR, None)
        else:
            ACTOR_ENVIRONMENT_REGISTRY[ROLLOUT_ACTOR] = previous


def train_sync(arguments: dict[str, Any], dataloader: Any) -> None:
    """NeMo-RL's ``grpo_train_sync`` (``grpo_sync.py:380``) with the rig's arguments, the
    trainer's own actor on this interpreter."""
    from nemo_rl.algorithms import grpo_sync
    from nemo_rl.distributed.virtual_cluster import PY_EXECUTABLES

    if not hasattr(arguments["policy"], "dp_cfg"):
        raise MMPOInputError("grpo_train_sync needs NeMo-RL's TQPolicy (data_plane.enabled=true)")
    with rollout_actor_on_this_interpreter(PY_EXECUTABLES.SYSTEM):
        grpo_sync.grpo_train_sync(wrapped_dataloader=dataloader, **arguments)
