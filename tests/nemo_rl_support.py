"""Helpers for tests that use the real NeMo-RL: import it or skip (or fail, in CI).

``scripts/test_nemo_rl.sh`` runs the tests marked ``nemo_rl`` on Python 3.13 against each
NeMo-RL snapshot, with the snapshot on ``PYTHONPATH`` and ``NEMO_MMPO_REQUIRE_NEMO_RL=1`` (under
``CI=true``), where a NeMo-RL that fails to import is an error, never a skip. On the 3.11 suite
``nemo_rl`` is not importable (as on a login node) and those tests skip; ``NEMO_RL_PATH`` still
names a checkout there, whose configs (and config loader) the launcher reads.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType

import pytest

CONFIGS_DIR = Path(__file__).resolve().parents[1] / "examples" / "configs"
REQUIRE = os.environ.get("NEMO_MMPO_REQUIRE_NEMO_RL") == "1"

# NeMo-RL's own switch: Ray actors run on this interpreter instead of a uv-built venv per actor
# (read when NeMo-RL is first imported, so set before any test imports it).
os.environ.setdefault("NEMO_RL_PY_EXECUTABLES_SYSTEM", "1")


def nemo_rl_checkout() -> Path:
    """The NeMo-RL checkout the tests read configs from (``NEMO_RL_PATH``); skips without one."""
    from nemo_mmpo.checkout import find_nemo_rl_root

    root = find_nemo_rl_root()
    if root is None:
        if REQUIRE:
            raise RuntimeError("NEMO_MMPO_REQUIRE_NEMO_RL=1 but no NeMo-RL checkout was found")
        pytest.skip("no NeMo-RL checkout: set NEMO_RL_PATH (bash scripts/test.sh does)")
    return root


def import_nemo_rl(name: str) -> ModuleType:
    """Import the real ``name`` from NeMo-RL; skip the calling module if it cannot run here."""
    try:
        return importlib.import_module(name)
    except Exception as error:  # ImportError, or a broken dependency of NeMo-RL
        if REQUIRE:
            raise RuntimeError(
                f"NEMO_MMPO_REQUIRE_NEMO_RL=1 but {name} failed to import: {error!r}"
            ) from error
        pytest.skip(f"{name} is not importable here ({error!r})", allow_module_level=True)
        raise  # unreachable: skip raises


def master_config_from_recipe(recipe: str, overrides: list[str] = ()) -> object:
    """``recipe`` loaded as NeMo-RL's ``run_grpo.py`` loads it (the composed recipe the entry
    point hands it, :func:`nemo_mmpo.recipes.write_run_record`), into its ``MasterConfig``."""
    import tempfile

    from omegaconf import OmegaConf

    from nemo_mmpo.checkout import find_nemo_rl_root
    from nemo_mmpo.recipes import load, write_run_record

    config_module = import_nemo_rl("nemo_rl.utils.config")
    grpo = import_nemo_rl("nemo_rl.algorithms.grpo")
    root = find_nemo_rl_root()
    assert root is not None, "set NEMO_RL_PATH to a NeMo-RL checkout"
    config_module.register_omegaconf_resolvers()
    with tempfile.TemporaryDirectory() as folder:
        record = write_run_record(load(CONFIGS_DIR / recipe), Path(folder))
        config = config_module.load_config(str(record))
    if overrides:
        config = config_module.parse_hydra_overrides(config, list(overrides))
    return grpo.MasterConfig(**OmegaConf.to_container(config, resolve=True))


def nemo_rl_inheritance(checkout: Path, into: Path) -> Path:
    """A copy of our recipes in ``into`` whose ``nemo_rl`` is a link to ``checkout``'s configs:
    what NeMo-RL's own ``load_config`` makes of a recipe, with no resolution of ours (the
    reference the composition in :mod:`nemo_mmpo.recipes` is checked against)."""
    import shutil

    configs = into / "configs"
    if not configs.exists():
        shutil.copytree(CONFIGS_DIR, configs, ignore=shutil.ignore_patterns("nemo_rl"))
        (configs / "nemo_rl").symlink_to(checkout / "examples" / "configs", True)
    return configs


class Console:
    """Collects what the CPU driver prints for a person (its ``console``), a line each."""

    def __init__(self):
        self.lines = []

    def write(self, text):
        self.lines.extend(line for line in text.splitlines() if line)

    def flush(self):
        pass
