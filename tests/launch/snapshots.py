"""Each NeMo-RL snapshot as a checkout of its own, which our recipes inherit from.

A recipe's ``nemo_rl/<file>`` bases are read from the checkout the load names (``NEMO_RL_PATH``,
or :func:`nemo_mmpo.recipes.load`'s ``nemo_rl_root``), so both snapshots are dry-run from the
one ``examples/configs``, in one process or beside other test processes. Only what the dry run
reads is unpacked: ``nemo_rl/`` (config loader and declarations) and ``examples/`` (base configs).
"""

from __future__ import annotations

import os
import tarfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "examples" / "configs"


def snapshot_archives() -> list[Path]:
    """``nemo-rl-<ref>.tar.gz`` in ``NEMO_RL_SNAPSHOTS`` (default ``../shared/nemo-rl``)."""
    folder = Path(os.environ.get("NEMO_RL_SNAPSHOTS", ROOT.parent / "shared" / "nemo-rl"))
    return sorted(folder.glob("nemo-rl-*.tar.gz"))


@dataclass(frozen=True)
class SnapshotCheckout:
    ref: str
    root: Path  # the checkout: nemo_rl/ and examples/
    configs: Path  # our recipes

    def recipe(self, name: str) -> Path:
        return self.configs / name


def unpack(archive: Path, into: Path) -> SnapshotCheckout:
    """``archive``'s ``nemo_rl/`` and ``examples/`` under ``into``."""
    ref = archive.name.removesuffix(".tar.gz").removeprefix("nemo-rl-")
    with tarfile.open(archive) as bundle:
        wanted = [
            member
            for member in bundle.getmembers()
            if member.name.split("/")[1:2] in (["nemo_rl"], ["examples"])
        ]
        bundle.extractall(into, members=wanted, filter="data")
    return SnapshotCheckout(ref, into / f"nemo-rl-{ref}", CONFIGS)
