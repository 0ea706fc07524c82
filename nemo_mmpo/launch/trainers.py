"""Which of NeMo-RL's GRPO drivers a recipe is for, and the script the entry point hands it to.

NeMo-RL main has two GRPO entry points: ``examples/run_grpo.py`` (``grpo_train``,
``async_grpo_train``, and ``grpo_train_sync`` with ``data_plane.enabled``, chosen inside it) and
``examples/run_grpo_single_controller.py`` (the single controller, ``SingleControllerActor``).
NeMo-RL has no marker that says which a recipe is for: its user picks the script. So the
recipe's own sections decide, as NeMo-RL's declarations draw the line: an ``async_rl``
section is the single controller's (its ``MasterConfig`` requires it,
``single_controller_utils/config.py``; ``run_grpo.py``'s keeps it as an unread extra), and such
a recipe goes to the single controller; every other to ``run_grpo.py``. NeMo-RL v0.7.0 has no
single controller: a recipe for it is refused there, in one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.sections import is_single_controller

__all__ = ["driver_script", "is_single_controller", "missing_single_controller"]

GRPO_SCRIPT = Path("examples") / "run_grpo.py"
SINGLE_CONTROLLER_SCRIPT = Path("examples") / "run_grpo_single_controller.py"
#: where the single controller's ``MasterConfig`` is declared (NeMo-RL main)
SINGLE_CONTROLLER_CONFIG = "nemo_rl.algorithms.single_controller_utils.config"
SINGLE_CONTROLLER = "NeMo-RL's single controller (run_grpo_single_controller.py)"
#: where NeMo-RL's single controller refuses validation (main 7ea279ab)
VALIDATION_REFUSED_AT = "single_controller_utils/setup.py:533-537"


def missing_single_controller(nemo_rl_root: Path) -> str:
    """The one line for a single-controller recipe and a NeMo-RL without one."""
    return (
        f"async_rl: this recipe is for {SINGLE_CONTROLLER}, which the NeMo-RL at "
        f"{nemo_rl_root} does not have (no {SINGLE_CONTROLLER_SCRIPT}; NeMo-RL main has it, "
        "v0.7.0 does not): set NEMO_RL_PATH to a NeMo-RL main checkout, or remove async_rl to "
        "train with run_grpo.py"
    )


def driver_script(config: Mapping[str, Any], nemo_rl_root: Path) -> Path:
    """The NeMo-RL script that trains ``config``: the single controller's for a recipe with
    ``async_rl`` (refused in one line where the checkout has none), ``run_grpo.py`` else."""
    if not is_single_controller(config):
        return nemo_rl_root / GRPO_SCRIPT
    script = nemo_rl_root / SINGLE_CONTROLLER_SCRIPT
    if not script.is_file():
        raise MMPOInputError(missing_single_controller(nemo_rl_root))
    return script
