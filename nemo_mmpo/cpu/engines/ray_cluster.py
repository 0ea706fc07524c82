"""The Ray cluster the tiny run uses: join the one this process runs in, else start one.

- :func:`running_cluster_address` / :func:`start_ray` / :func:`ray_session`: ``RAY_ADDRESS``,
  or the cluster ``ray start`` recorded on this machine (NeMo-RL's ``ray.sub`` starts the
  head there) when it answers, else a new local cluster; ``RAY_ADDRESS`` names it for NeMo-RL
  code that looks Ray up by ``address="auto"``;
- :func:`collector_on_this_interpreter`: NeMo-RL's async trajectory collector and replay
  buffer on the driver's interpreter (NeMo-RL starts them in its vLLM environment);
- :func:`worker_interpreters`: the interpreter each of NeMo-RL's workers runs in.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from nemo_mmpo.cpu.answers.import_hooks import CPU_ANSWERS_ENV
from nemo_mmpo.errors import MMPOInputError


def running_cluster_address() -> str | None:
    """The address of the Ray cluster this process should join, if one is running:
    ``RAY_ADDRESS``, else the one ``ray start`` recorded on this machine (NeMo-RL's ``ray.sub``
    starts the head there) when its GCS answers. A recorded cluster that has stopped is
    ignored (Ray's own ``address="auto"`` would wait for it and then abort the process)."""
    import socket
    import tempfile

    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"]
    record = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
    try:
        address = record.read_text().strip()
        host, port = address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=2):
            return address
    except (OSError, ValueError):
        return None


def start_ray(setup_hook: str | None = None, num_cpus: int = 2) -> bool:
    """Join the running Ray cluster (:func:`running_cluster_address`), else start a local one
    with this machine's CPUs (at least ``num_cpus`` logical ones: NeMo-RL's placement groups
    ask a CPU per bundle); returns whether this call started it. ``setup_hook``: Ray's
    ``worker_process_setup_hook`` for this job's workers (the engines' CPU answers, asked for
    explicitly: ``NEMO_MMPO_CPU_ANSWERS=1`` in the workers' environment).

    Either way ``RAY_ADDRESS`` then names the cluster: NeMo-RL's memory tracker looks Ray up
    by ``address="auto"``, which fails when other Ray instances run on the machine.
    """
    import ray

    if not ray.is_initialized():
        options: dict = {"include_dashboard": False, "log_to_driver": False}
        if setup_hook is not None:
            options["runtime_env"] = {
                "worker_process_setup_hook": setup_hook,
                # the rig asks for its CPU answers explicitly (also on a machine with a GPU)
                "env_vars": {CPU_ANSWERS_ENV: "1"},
            }
        address = running_cluster_address()
        if address is not None:
            ray.init(address=address, **options)
        else:
            # address="local": a new cluster even if other Ray instances run on this machine
            cpus = max(num_cpus, os.cpu_count() or 2)
            start_local_cluster(cpus, options)
            os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
            return True
    elif setup_hook is not None:
        runtime_env = ray.get_runtime_context().runtime_env or {}
        if runtime_env.get("worker_process_setup_hook") != setup_hook:
            raise MMPOInputError(
                f"Ray was started in this process without worker_process_setup_hook="
                f"{setup_hook!r}, which the engines' workers need: let the rig start Ray "
                "(call it before ray.init), or pass runtime_env={'worker_process_setup_hook': "
                f"{setup_hook!r}}} to ray.init"
            )
    os.environ.setdefault("RAY_ADDRESS", ray.get_runtime_context().gcs_address)
    return False


#: what Ray raises when its raylet has not registered within its fixed 30 s (Ray's
#: ``_private/node.py``; no setting raises it): a loaded machine, not a broken one. Seen on this
#: project's 2-core machine under load (Ray 2.55.1): the raylet waits a fixed ~15 s for its
#: dashboard agent (a Python process, started even without the dashboard) to write its metrics
#: port, ``RAY_agent_register_timeout_ms`` does not raise that wait, and the raylet exits
#: ("Timed out waiting for file ...") when the agent's imports take longer
RAYLET_START_TIMEOUT = "timed out during startup"
#: tries in all; the pause before try ``k`` (1-based) is ``RETRY_PAUSE_S * (k - 1)`` seconds,
#: so a burst of other start-ups (a run's workers importing) can pass
RAYLET_START_TRIES = 3
RETRY_PAUSE_S = 10.0


def start_local_cluster(cpus: int, options: dict) -> None:
    """``ray.init(address="local")``, started again (up to :data:`RAYLET_START_TRIES` tries,
    each said on stderr) while Ray's raylet misses its fixed start-up time: on a machine loaded
    by other work that is a slow start, not an error of the run. Any other error, and the last
    try's, is Ray's own."""
    import ray

    for attempt in range(1, RAYLET_START_TRIES + 1):
        try:
            ray.init(address="local", num_cpus=cpus, **options)
            return
        except Exception as error:  # Ray raises a bare Exception for it
            if RAYLET_START_TIMEOUT not in str(error) or attempt == RAYLET_START_TRIES:
                raise
            pause = RETRY_PAUSE_S * attempt
            print(
                f"[nemo-mmpo] Ray's local cluster did not start in time ({error}); starting it "
                f"again in {pause:.0f} s (try {attempt + 1} of {RAYLET_START_TRIES})",
                file=sys.stderr,
                flush=True,
            )
            ray.shutdown()
            time.sleep(pause)


@contextmanager
def ray_session(setup_hook: str | None = None, num_cpus: int = 2) -> Iterator[None]:
    """:func:`start_ray` for the block; a cluster it started is shut down afterwards, and
    ``RAY_ADDRESS`` is what it was before."""
    import ray

    previous = os.environ.get("RAY_ADDRESS")
    started = start_ray(setup_hook, num_cpus)
    try:
        yield
    finally:
        if started:
            ray.shutdown()
        if previous is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = previous


@contextmanager
def collector_on_this_interpreter(executable: str) -> Iterator[None]:
    """Run NeMo-RL's async trajectory collector and replay buffer on the driver's interpreter
    while the block runs.

    NeMo-RL's registry starts them in its uv-built vLLM environment, which a CPU machine does
    not have (``NEMO_RL_PY_EXECUTABLES_SYSTEM=1`` does the same for every actor).
    """
    from nemo_rl.distributed.ray_actor_environment_registry import ACTOR_ENVIRONMENT_REGISTRY

    names = [
        f"nemo_rl.algorithms.async_utils.{actor}"
        for actor in ("AsyncTrajectoryCollector", "ReplayBuffer")
    ]
    previous = {name: ACTOR_ENVIRONMENT_REGISTRY.get(name) for name in names}
    ACTOR_ENVIRONMENT_REGISTRY.update(dict.fromkeys(names, executable))
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                ACTOR_ENVIRONMENT_REGISTRY.pop(name, None)
            else:
                ACTOR_ENVIRONMENT_REGISTRY[name] = value


def _interpreter(actor: object) -> str:
    """``sys.executable`` of the process this runs in (an actor's, through ``__ray_call__``)."""
    return sys.executable


def worker_interpreters(*engines: object) -> dict[str, list[str]]:
    """``{actor class: [sys.executable of each of its workers]}`` for the engines among
    ``engines`` that run NeMo-RL worker groups (its ``Policy`` and ``VllmGeneration``): the
    environment NeMo-RL gave each worker (its registry's, under ``NEMO_RL_VENV_DIR`` in its
    container; the driver's with ``NEMO_RL_PY_EXECUTABLES_SYSTEM=1``)."""
    import ray

    interpreters: dict[str, list[str]] = {}
    for engine in engines:
        workers = getattr(getattr(engine, "worker_group", None), "workers", None) or []
        for worker in workers:
            name = worker._ray_actor_creation_function_descriptor.class_name
            # by keyword: the handles of NeMo-RL's workers record __ray_call__'s signature as
            # (**kwargs) alone, and Ray refuses a positional argument before sending it
            executable = ray.get(worker.__ray_call__.remote(fn=_interpreter))
            interpreters.setdefault(name, []).append(executable)
    return interpreters
