"""Where this checkout and NeMo-RL's are.

Our recipes say ``defaults: nemo_rl/<file>.yaml``: :mod:`nemo_mmpo.recipes` reads that file
from the ``examples/configs`` of the checkout :func:`find_nemo_rl_root` finds (or the one a
caller names), wherever the recipe lives; nothing is linked or copied into this checkout.
Our own recipes are package data (:data:`CONFIGS_DIR`), found the same way from a clone and
from an installed wheel.
"""

from __future__ import annotations

import os
from pathlib import Path

#: NeMo-RL's checkout inside its container.
CONTAINER_NEMO_RL = Path("/opt/nemo-rl")
#: The directory holding ``nemo_mmpo/``: this checkout's root, or ``site-packages`` when
#: nemo-mmpo is installed (then nothing of a run is written or read there: a recipe's relative
#: paths start in the working directory). The one repository-root constant.
REPO_ROOT = Path(__file__).resolve().parents[1]
#: Our recipes, package data (``base/<file>`` and ``nemo_mmpo/<file>`` in a recipe's
#: ``defaults``); a clone's ``examples/configs`` is a link to this folder.
CONFIGS_DIR = Path(__file__).resolve().parent / "configs"


def find_nemo_rl_root() -> Path | None:
    """NeMo-RL's checkout: ``$NEMO_RL_PATH``, the imported ``nemo_rl``'s, or the container's."""
    candidates = []
    if os.environ.get("NEMO_RL_PATH"):
        candidates.append(Path(os.environ["NEMO_RL_PATH"]))
    try:
        import nemo_rl

        candidates.append(Path(nemo_rl.__file__).resolve().parent.parent)
    except ImportError:
        pass
    candidates.append(CONTAINER_NEMO_RL)
    for candidate in candidates:
        if (candidate / "examples" / "configs").is_dir() and (candidate / "nemo_rl").is_dir():
            return candidate.resolve()
    return None


def worker_pythonpath() -> str:
    """The directory that makes ``import nemo_mmpo`` work in NeMo-RL's Ray workers (and the
    watcher's processes in their environments): the folder holding ``nemo_mmpo``."""
    if REPO_ROOT.name not in ("site-packages", "dist-packages"):
        return str(REPO_ROOT)  # a source checkout: its root holds nemo_mmpo/ and nothing else
    # Installed into an environment: expose only our package, not the driver's site-packages.
    link_dir = Path(os.environ.get("NEMO_MMPO_WORKER_PATH", Path.home() / ".cache/nemo-mmpo/path"))
    link_dir.mkdir(parents=True, exist_ok=True)
    link = link_dir / "nemo_mmpo"
    target = REPO_ROOT / "nemo_mmpo"
    if not (link.is_symlink() and link.resolve() == target):
        if link.is_symlink():
            link.unlink()
        link.symlink_to(target, target_is_directory=True)
    return str(link_dir)
