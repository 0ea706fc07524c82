"""nemo-mmpo as a user installs it: a wheel built from this checkout, installed (not editable)
into a copy of the NeMo-RL environment the test runs in, and the commands run from a folder of
the user's own with nothing of this checkout on their path.

The copy is a thin environment over the running one (its site-packages first, the running
environment's through a ``.pth``, as ``scripts/nemo_rl_env.sh`` layers vLLM's CPU build), so
the wheel goes into a site-packages of its own and the environment the other tests use is
left alone. NeMo-RL itself stays where the test session has it (on ``PYTHONPATH``), as the
container holds it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import patience

ROOT = Path(__file__).resolve().parents[1]
#: what a wheel is built from (a copy: a build writes build/ and *.egg-info beside its source)
WHEEL_SOURCES = ("pyproject.toml", "README.md", "LICENSE", "nemo_mmpo")
#: folders of the checkout that other processes write while a test runs (the snapshots'
#: sessions' logs and caches, the environments, bytecode), left out of :func:`tree_state`
SHARED_FOLDERS = {
    ".git",
    "__pycache__",
    ".nemo-rl",
    ".pytest_cache",
    ".ruff_cache",
    ".hypothesis",
    "_build",
}


#: variables that put other folders on an environment's path (the test session's, not a user's)
OUTSIDE_PATHS = ("PYTHONPATH", "RAY_ADDRESS", "VIRTUAL_ENV", "PYTHONHOME")


def build_wheel(into: Path) -> Path:
    """A wheel of this checkout (``pip wheel``, no dependencies, no download), built from a
    copy in ``into``; returns its path."""
    source = into / "source"
    for name in WHEEL_SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            source.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    command = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    patience.run(
        [*command, "-w", str(into / "dist"), str(source)], check=True, timeout=patience.COMMAND_S
    )
    (wheel,) = (into / "dist").glob("nemo_mmpo-*.whl")
    return wheel


def environment_with(wheel: Path, into: Path) -> Path:
    """A copy of the running environment with ``wheel`` installed into its own site-packages
    (``pip install --no-deps``); returns its folder (``bin/nemo-mmpo`` is the command)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(into)], check=True)
    python = into / "bin" / "python"
    # pip in the new environment alone: with the test session's PYTHONPATH (the checkout, whose
    # editable install left nemo_mmpo.egg-info there) pip finds nemo-mmpo "already satisfied"
    # and installs nothing
    alone = {key: value for key, value in os.environ.items() if key not in OUTSIDE_PATHS}
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        env=alone,
    ).stdout.strip()
    running = [path for path in sys.path if path.endswith("site-packages")]
    running = running or [sysconfig.get_paths()["purelib"]]
    (Path(site) / "_running_environment.pth").write_text("\n".join(running) + "\n")
    patience.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        timeout=patience.COMMAND_S,
        env=alone,
    )
    assert (into / "bin" / "nemo-mmpo").is_file(), f"pip installed no nemo-mmpo from {wheel}"
    return into


def site_packages(environment: Path) -> Path:
    (site,) = (environment / "lib").glob("python3*/site-packages")
    return site


def as_a_user(environment: Path, nemo_rl: Path, scratch: Path) -> dict[str, str]:
    """The variables a user's shell has in NeMo-RL's container with nemo-mmpo installed:
    NeMo-RL on ``PYTHONPATH`` (nothing of this checkout), the environment's ``bin`` first on
    ``PATH``, no Ray cluster to join (a run starts its own: ``TMPDIR`` a short folder of its
    own, so no other cluster's record is found and Ray's socket paths stay short), Ray's
    workers on the driver's interpreter (NeMo-RL's switch for a machine without its uv-built
    actor environments) and the workers' path link (``install()``) in ``scratch``."""
    environment_variables = {
        key: value for key, value in os.environ.items() if key not in OUTSIDE_PATHS
    }
    environment_variables.update(
        PYTHONPATH=str(nemo_rl),
        PATH=os.pathsep.join([str(environment / "bin"), os.environ["PATH"]]),
        TMPDIR=tempfile.mkdtemp(prefix="ray", dir="/tmp"),
        NEMO_RL_PATH=str(nemo_rl),
        NEMO_RL_PY_EXECUTABLES_SYSTEM="1",
        NEMO_MMPO_WORKER_PATH=str(scratch / "worker_path"),
    )
    return environment_variables


def tree_state(root: Path, skip: set[str] = SHARED_FOLDERS) -> dict[str, tuple[int, int]]:
    """``{relative path: (size, mtime in ns)}`` of every file under ``root``, folders named in
    ``skip`` (and ``.venv*`` environments) left out."""
    state = {}
    for folder, folders, files in os.walk(root):
        folders[:] = [name for name in folders if name not in skip and not name.startswith(".venv")]
        for name in files:
            path = Path(folder) / name
            try:
                status = path.lstat()
            except FileNotFoundError:
                continue
            state[str(path.relative_to(root))] = (status.st_size, status.st_mtime_ns)
    return state


def changed(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> list[str]:
    """Paths added, removed or modified between two :func:`tree_state` results."""
    return sorted(
        path for path in before.keys() | after.keys() if before.get(path) != after.get(path)
    )
