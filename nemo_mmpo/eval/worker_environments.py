"""The interpreters NeMo-RL gives its Ray workers, for the watcher's processes that need them.

NeMo-RL's driver environment has neither vLLM nor Megatron (its container's
``/opt/nemo_rl_venv``, a checkout's uv project): each Ray actor class runs in the environment
``ACTOR_ENVIRONMENT_REGISTRY`` names for it, a uv-built ``NEMO_RL_VENV_DIR/<actor class path>``
(prebuilt by the container's ``prefetch_venvs.py``). The watcher (``nemo-mmpo eval watch``)
samples with vLLM in a process of the vLLM worker's environment and converts a Megatron
checkpoint in one of the Megatron worker's, each found by :func:`worker_python` as NeMo-RL's
``worker_groups.py`` finds it. nemo-mmpo reaches those processes on ``PYTHONPATH``
(:func:`worker_environment`), as it reaches NeMo-RL's Ray workers.

``NEMO_RL_PY_EXECUTABLES_SYSTEM=1`` (NeMo-RL's switch) maps both workers to the driver's own
interpreter: one environment for every process, as the CPU rig's tests run.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from nemo_mmpo.checkout import find_nemo_rl_root, worker_pythonpath
from nemo_mmpo.errors import MMPOInputError

#: NeMo-RL's vLLM generation worker (the same path in v0.7.0 and main)
VLLM_WORKER = "nemo_rl.models.generation.vllm.vllm_worker.VllmGenerationWorker"
#: NeMo-RL's Megatron policy worker (the same path in v0.7.0 and main)
MEGATRON_WORKER = "nemo_rl.models.policy.workers.megatron_policy_worker.MegatronPolicyWorker"
#: set in a process moved into NeMo-RL's uv project, so that it never moves again (the name
#: ``nemo-mmpo train``'s move sets: nemo_mmpo/launch/environment.py's REEXEC_FLAG)
MOVED_FLAG = "NEMO_MMPO_REEXECUTED"


def move_into_nemo_rl(argv: list[str], prog: str = "nemo-mmpo eval") -> None:
    """Where ``nemo_rl`` does not import but a NeMo-RL checkout (``NEMO_RL_PATH``) and ``uv``
    are at hand, replace this process by ``python -m nemo_mmpo.eval <argv>`` in NeMo-RL's uv
    project (its driver environment, synced once), nemo-mmpo on ``PYTHONPATH``, as
    ``nemo-mmpo train`` moves there. Otherwise return (:func:`registered_executable` says
    what to run when NeMo-RL is needed)."""
    if importlib.util.find_spec("nemo_rl") is not None or os.environ.get(MOVED_FLAG):
        return
    root, uv = find_nemo_rl_root(), os.environ.get("UV") or shutil.which("uv")
    if root is None or uv is None:
        return
    environment = dict(os.environ, NEMO_RL_PATH=str(root), **{MOVED_FLAG: "1"})
    inherited = environment.get("PYTHONPATH", "").split(os.pathsep)
    environment["PYTHONPATH"] = os.pathsep.join([worker_pythonpath(), *filter(None, inherited)])
    environment.pop("VIRTUAL_ENV", None)  # uv must pick the project's environment, not this one
    print(f"[{prog}] nemo_rl is not importable here; re-running in NeMo-RL's environment at {root}")
    sys.stdout.flush()
    command = [uv, "run", "--project", str(root), "python", "-m", "nemo_mmpo.eval", *argv]
    os.execve(uv, command, environment)


def worker_python(actor_class_path: str) -> str:
    """The interpreter NeMo-RL gives the Ray actor class ``actor_class_path``: its registry's
    ``PY_EXECUTABLES`` entry; for a ``uv run ...`` entry, the environment
    ``NEMO_RL_VENV_DIR/<actor class path>`` (used as it is when its ``bin/python`` exists,
    else built with uv as NeMo-RL builds it); otherwise the entry itself."""
    registered = registered_executable(actor_class_path)
    if not registered.startswith("uv"):
        return registered
    return os.path.normpath(uv_environment_python(registered, actor_class_path))


def registered_executable(actor_class_path: str) -> str:
    """``ACTOR_ENVIRONMENT_REGISTRY[actor_class_path]`` of the NeMo-RL this process imports."""
    try:
        from nemo_rl.distributed.ray_actor_environment_registry import get_actor_python_env
    except ImportError as error:
        raise MMPOInputError(
            f"finding the environment of NeMo-RL's {actor_class_path.rpartition('.')[2]} needs "
            f"NeMo-RL's own environment ({error.name or 'nemo_rl'} does not import here): run "
            "`NEMO_RL_PATH=<your NeMo-RL checkout> nemo-mmpo eval watch ...` (it moves into "
            "NeMo-RL's uv project) or `uv run --project /opt/nemo-rl nemo-mmpo eval watch ...` "
            "in NeMo-RL's container"
        ) from None
    try:
        return get_actor_python_env(actor_class_path)
    except ValueError:
        raise MMPOInputError(
            f"NeMo-RL's ACTOR_ENVIRONMENT_REGISTRY has no environment for {actor_class_path}: "
            "use NeMo-RL v0.7.0 or a main that registers it"
        ) from None


def uv_environment_python(py_executable: str, venv_name: str) -> str:
    """NeMo-RL's own ``_env_builder`` decision, without Ray: the existing
    ``NEMO_RL_VENV_DIR/<venv_name>/bin/python`` as it is (nothing synced), or, waiting for a
    build another process started, or building it with ``create_local_venv``. Never a forced
    rebuild (``NRL_FORCE_REBUILD_VENVS`` is the training run's: its workers use the
    environment)."""
    from nemo_rl.utils import venvs

    build = getattr(venvs._env_builder, "_function", None)  # the Ray task's own function
    directory = os.environ.get("NEMO_RL_VENV_DIR", venvs.DEFAULT_VENV_DIR)
    existing = Path(directory) / venv_name / "bin" / "python"
    try:
        if build is not None:
            return build(py_executable, venv_name, 0, False)
        if existing.exists():
            return str(existing)
        return venvs.create_local_venv(py_executable, venv_name)
    except (OSError, subprocess.CalledProcessError) as error:
        raise MMPOInputError(
            f"NeMo-RL's environment for {venv_name} is not in {directory} and uv could not "
            f"build it ({error}): build NeMo-RL's worker environments as its container does "
            "(`uv run nemo_rl/utils/prefetch_venvs.py` in its checkout), or set "
            "NEMO_RL_VENV_DIR to where they are"
        ) from None


def worker_environment(python: str) -> dict[str, str]:
    """This process's environment for a process of ``python``: nemo-mmpo on ``PYTHONPATH``
    (:func:`~nemo_mmpo.checkout.worker_pythonpath`) and, for another environment, its
    ``VIRTUAL_ENV`` and ``UV_PROJECT_ENVIRONMENT``, as NeMo-RL gives its workers."""
    environment = dict(os.environ)
    inherited = environment.get("PYTHONPATH", "").split(os.pathsep)
    entries = [worker_pythonpath(), *filter(None, inherited)]
    environment["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(entries))
    if os.path.normpath(python) != os.path.normpath(sys.executable):
        venv = os.path.dirname(os.path.dirname(python))  # the bin/python suffix removed
        environment.update(VIRTUAL_ENV=venv, UV_PROJECT_ENVIRONMENT=venv)
    return environment
