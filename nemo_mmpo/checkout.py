"""Where this checkout and NeMo-RL's are, and the link that lets our recipes inherit its configs.

Our recipes say ``defaults: nemo_rl/<file>.yaml``, a path relative to ``examples/configs``,
where :func:`link_nemo_rl_configs` keeps a symbolic link ``nemo_rl -> <NeMo-RL checkout>/
examples/configs``. NeMo-RL's own loader then resolves them unchanged.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from nemo_mmpo.errors import MMPOInputError

#: NeMo-RL's checkout inside its container.
CONTAINER_NEMO_RL = Path("/opt/nemo-rl")
LINK_NAME = "nemo_rl"
#: The directory holding ``nemo_mmpo/``: this checkout's root (recipes' relative paths start
#: here), or ``site-packages`` when nemo-mmpo is installed. The one repository-root constant.
REPO_ROOT = Path(__file__).resolve().parents[1]
#: Our recipes (their ``defaults`` name ``nemo_rl/<file>.yaml``).
CONFIGS_DIR = REPO_ROOT / "examples" / "configs"


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


def link_nemo_rl_configs(nemo_rl_root: Path, configs_dir: Path = CONFIGS_DIR) -> Path:
    """Point ``configs_dir/nemo_rl`` at ``nemo_rl_root/examples/configs`` (idempotent).

    The link is replaced in one step (a new link renamed over it), so a process reading it at
    that moment sees the old checkout's configs or the new one's, never no link, and two
    processes re-pointing it at once both succeed (the last one's target stays).
    """
    link = configs_dir / LINK_NAME
    target = (nemo_rl_root / "examples" / "configs").resolve()
    if link.is_symlink() and link.resolve() == target:
        return link
    if link.exists() and not link.is_symlink():
        raise MMPOInputError(
            f"{link} exists and is not a link; remove it so nemo-mmpo can link NeMo-RL's configs"
        )
    staged = configs_dir / f".{LINK_NAME}.{os.getpid()}.{threading.get_ident()}"
    staged.unlink(missing_ok=True)
    staged.symlink_to(target, target_is_directory=True)
    os.replace(staged, link)
    return link
