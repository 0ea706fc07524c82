#!/usr/bin/env python3
# /// script
# requires-python = ">=3.10"
# dependencies = []
# ///
"""Train with MMPO inside NeMo-RL's GRPO: ``uv run examples/run_mmpo_math.py [--config X] [k=v]``.

The same as ``nemo-mmpo train``: load the recipe and overrides exactly as NeMo-RL will, check
them, print the run plan, then run NeMo-RL's own ``examples/run_grpo.py`` with our estimator
and loss installed (or the tiny CPU run, for ``cpu_backend.enabled`` recipes). ``--dry-run``
stops after the plan; ``--print-config`` also prints the resolved config NeMo-RL would train
with. See :mod:`nemo_mmpo.launch.train`.

Started by ``uv run`` from this repository, the script gets a bare environment; it re-executes
itself inside NeMo-RL's (``$NEMO_RL_PATH`` or the container's ``/opt/nemo-rl``) to train, and to
check (``--dry-run``) when ``uv run`` started it; started by a Python that cannot check (a bare
login-node Python), it says what is missing.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))


def _environment():
    """:mod:`nemo_mmpo.launch.environment`, read by path (importing nemo_mmpo needs torch)."""
    path = REPO_ROOT / "nemo_mmpo" / "launch" / "environment.py"
    spec = importlib.util.spec_from_file_location("nemo_mmpo_launch_environment", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    environment = _environment()
    checking_only = any(
        flag in argv for flag in ("--dry-run", "--print-config", "--prepare-data", "-h", "--help")
    )
    missing = environment.missing_modules()
    if missing and not checking_only:
        environment.reexecute_in_nemo_rl(
            Path(__file__), argv, f"{', '.join(missing)} not importable here", REPO_ROOT
        )
    if not checking_only and importlib.util.find_spec("nemo_rl") is None:
        environment.reexecute_in_nemo_rl(
            Path(__file__), argv, "nemo_rl is not importable here", REPO_ROOT
        )
    if missing and environment.started_by_uv() and environment.can_reexecute():
        # `uv run examples/run_mmpo_math.py --dry-run`: uv's bare script environment cannot
        # check; NeMo-RL's, which trains, can
        environment.reexecute_in_nemo_rl(
            Path(__file__), argv, f"{', '.join(missing)} not importable here", REPO_ROOT
        )
    if missing:
        print(
            f"run_mmpo_math.py: cannot check the plan with {sys.executable}: it lacks "
            f"{', '.join(missing)}. Install nemo-mmpo with its launch extra into it "
            f'({sys.executable} -m pip install "{REPO_ROOT}[launch]") or use a Python that '
            "has them",
            file=sys.stderr,
        )
        return environment.CANNOT_CHECK
    from nemo_mmpo.errors import handle
    from nemo_mmpo.launch.train import main as train

    return handle(train, argv, "run_mmpo_math.py")


if __name__ == "__main__":
    sys.exit(main())
