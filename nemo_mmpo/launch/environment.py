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


def reexecute_in_nemo_rl(script: Path, argv: list[str], reason: str, repo_root: Path) -> None:
    """Replace this process by ``script argv`` inside NeMo-RL's uv project, or exit saying how
    to run it."""
    root = nemo_rl_root_without_imports()
    if root is None or os.environ.get(REEXEC_FLAG) or shutil.which("uv") is None:
        sys.exit(
            f"run_mmpo_math.py: {reason}. Run it inside NeMo-RL's environment: in its container "
            "(NeMo-RL at /opt/nemo-rl), or set NEMO_RL_PATH=<your NeMo-RL v0.7.0 checkout> and "
            "have `uv` on PATH. For a plan without NeMo-RL use --dry-run from an environment "
            "with nemo-mmpo's launch extra (pip install -e '.[launch]')."
        )
    environment = dict(os.environ, NEMO_RL_PATH=str(root))
    environment[REEXEC_FLAG] = "1"
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(repo_root), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    command = ["uv", "run", "--project", str(root), "python", str(script.resolve())]
    print(f"[nemo-mmpo] {reason}; re-running in NeMo-RL's environment at {root}", flush=True)
    os.execvpe("uv", [*command, *argv], environment)
