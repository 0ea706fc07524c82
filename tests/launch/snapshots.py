"""Each NeMo-RL snapshot as a checkout of its own, with a copy of our recipes that inherits it.

The launcher links ``examples/configs/nemo_rl`` to the checkout it reads; a test that dry-runs
against both snapshots in one process (beside other test processes reading the link) gives each
snapshot its own copy of ``examples/configs`` instead, whose ``nemo_rl`` link points at it.
Only what the dry run reads is unpacked: ``nemo_rl/`` (config loader and declarations) and
``examples/`` (base configs).
"""

from __future__ import annotations

import os
import shutil
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
    configs: Path  # our recipes, with nemo_rl -> root/examples/configs

    def recipe(self, name: str) -> Path:
        return self.configs / name


def unpack(archive: Path, into: Path) -> SnapshotCheckout:
    """``archive``'s ``nemo_rl/`` and ``examples/`` under ``into``, and a copy of our recipes."""
    ref = archive.name.removesuffix(".tar.gz").removeprefix("nemo-rl-")
    with tarfile.open(archive) as bundle:
        wanted = [
            member
            for member in bundle.getmembers()
            if member.name.split("/")[1:2] in (["nemo_rl"], ["examples"])
        ]
        bundle.extractall(into, members=wanted, filter="data")
    root = into / f"nemo-rl-{ref}"
    configs = into / f"configs-{ref}"
    shutil.copytree(CONFIGS, configs, ignore=shutil.ignore_patterns("nemo_rl"))
    (configs / "nemo_rl").symlink_to(root / "examples" / "configs", target_is_directory=True)
    return SnapshotCheckout(ref, root, configs)
