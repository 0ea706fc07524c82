"""One tiny run as a person runs it, in its own folder, once: the building block of the seed
spread (:mod:`nemo_mmpo.cpu.spread.robustness`) and the study (:mod:`nemo_mmpo.study`).

:func:`run_recipe` runs ``examples/run_mmpo_math.py --config RECIPE overrides`` in a child
process, its terminal output in ``terminal.txt``, the resolved config in ``run_config.json``;
``finished.json`` (written atomically last) marks the run done, and a later call returns it
without running again. A run that stopped half-way is resumed by the entry point itself (from
its newest checkpoint). A failed run raises, naming its terminal log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from nemo_mmpo.checkout import CONFIGS_DIR, REPO_ROOT
from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.io import write_text_atomic
from nemo_mmpo.recipes import load

ENTRY = REPO_ROOT / "examples" / "run_mmpo_math.py"
#: The tiny CPU recipe (MMPO), which the spread and the study run with overrides.
TINY_RECIPE = CONFIGS_DIR / "mmpo_tiny_cpu.yaml"
FINISHED = "finished.json"


def finished(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / FINISHED
    return json.loads(path.read_text()) if path.is_file() else None


def run_recipe(
    run_dir: Path,
    recipe: Path,
    overrides: list[str],
    environment: dict[str, str] | None = None,
    record: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run ``recipe`` with ``overrides`` in ``run_dir`` unless it finished before; returns the
    run's record (``record`` plus ``seconds`` and the resolved config's path)."""
    done = finished(run_dir)
    if done is not None:
        return done
    run_dir.mkdir(parents=True, exist_ok=True)
    resolved = load(recipe, overrides).config
    write_text_atomic(run_dir / "run_config.json", json.dumps(resolved, indent=2) + "\n")
    started = time.monotonic()
    # the clone's entry point; installed (no examples/), the same command by module
    entry = [str(ENTRY)] if ENTRY.is_file() else ["-m", "nemo_mmpo.cli", "train"]
    command = [sys.executable, *entry, "--config", str(recipe), *overrides]
    with open(run_dir / "terminal.txt", "a") as terminal:
        result = subprocess.run(
            command,
            env={**os.environ, **(environment or {})},
            stdout=terminal,
            stderr=subprocess.STDOUT,
        )
    if result.returncode != 0:
        raise MMPOInputError(
            f"the run in {run_dir} failed (exit {result.returncode}); see "
            f"{run_dir / 'terminal.txt'} and the nemo_rl.log in its log directory. The same "
            "command resumes it from its newest checkpoint"
        )
    done = {**(record or {}), "seconds": round(time.monotonic() - started, 1)}
    write_text_atomic(run_dir / FINISHED, json.dumps(done, indent=2) + "\n")
    return done


def run_config(run_dir: Path) -> dict[str, Any]:
    """The resolved config a run trained with."""
    return json.loads((run_dir / "run_config.json").read_text())
