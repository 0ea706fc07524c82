"""Which Python runs the entry point, and moving to NeMo-RL's when this one cannot train.

Standard library only: ``examples/run_mmpo_math.py`` loads this file by path before anything
else, in whatever environment ``uv run`` gave it (often a bare one, where ``import nemo_mmpo``
would fail for lack of torch).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

#: Set in the re-executed process, so that it never re-executes again.
REEXEC_FLAG = "NEMO_MMPO_REEXECUTED"
#: Exit status of a check that could not run here (as opposed to 2: the config is invalid).
CANNOT_CHECK = 3
#: What reading, checking and printing a plan needs (the ``launch`` extra, plus torch).
CHECK_MODULES = ("torch", "omegaconf", "hydra", "pydantic", "yaml")


def missing_modules(names: tuple[str, ...] = CHECK_MODULES) -> list[str]:
    return [name for name in names if importlib.util.find_spec(name) is None]


def nemo_rl_root_without_imports() -> Path | None:
    """``$NEMO_RL_PATH`` or the container's ``/opt/nemo-rl``, when it holds ``run_grpo.py``."""
    for candidate in (os.environ.get("NEMO_RL_PATH"), "/opt/nemo-rl"):
        if candidate and (Path(candidate) / "examples" / "run_grpo.py").exists():
            return Path(candidate)
    return None


def uv_executable() -> str | None:
    """The ``uv`` to re-execute with: the one that started this process (``uv run`` sets
    ``UV`` to its own path in what it runs), else the first on ``PATH``."""
    return os.environ.get("UV") or shutil.which("uv")


def started_by_uv() -> bool:
    """Whether ``uv run`` started this process (it sets ``UV``)."""
    return bool(os.environ.get("UV"))


def can_reexecute() -> bool:
    """Whether :func:`reexecute_in_nemo_rl` would move rather than exit: a NeMo-RL checkout, a
    ``uv``, and not already re-executed."""
    return (
        nemo_rl_root_without_imports() is not None
        and not os.environ.get(REEXEC_FLAG)
        and uv_executable() is not None
    )


def reexecute_in_nemo_rl(
    script: Path | None,
    argv: list[str],
    reason: str,
    pythonpath: Path | str,
    prog: str = "run_mmpo_math.py",
) -> None:
    """Replace this process by ``script argv`` (``python -m nemo_mmpo.cli train argv`` when
    ``script`` is None: ``nemo-mmpo train``) inside NeMo-RL's uv project, with ``pythonpath``
    (the folder that holds ``nemo_mmpo``) on ``PYTHONPATH``, or exit saying how to run it. In
    NeMo-RL's container uv's own variables (``UV_PROJECT_ENVIRONMENT``, ``UV_NO_SYNC``) make
    that the prepared environment, with no sync."""
    if not can_reexecute():
        source = Path(pythonpath)
        source = str(source) if (source / "pyproject.toml").is_file() else "<your nemo-mmpo clone>"
        sys.exit(
            f"{prog}: {reason}. Run it inside NeMo-RL's environment (its container, with "
            f'nemo-mmpo installed there: pip install --no-deps "{source}"), or set '
            "NEMO_RL_PATH=<your NeMo-RL v0.7.0 checkout, cloned with --recursive> and have "
            "`uv` on PATH, which moves it there. For a plan without NeMo-RL use --dry-run "
            f'(pip install "{source}[launch]").'
        )
    root, uv = nemo_rl_root_without_imports(), uv_executable()
    environment = dict(os.environ, NEMO_RL_PATH=str(root))
    environment[REEXEC_FLAG] = "1"
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(pythonpath), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    # uv run's script environment is not NeMo-RL's: uv must pick the project's, not this one
    environment.pop("VIRTUAL_ENV", None)
    target = [str(script.resolve())] if script is not None else ["-m", "nemo_mmpo.cli", "train"]
    command = [uv, "run", "--project", str(root), "python", *target]
    print(f"[nemo-mmpo] {reason}; re-running in NeMo-RL's environment at {root}", flush=True)
    os.execve(uv, [*command, *argv], environment)
