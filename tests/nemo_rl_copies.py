"""Copies of the imported NeMo-RL, changed as a release could change it, and ``install()`` run
against a copy in a fresh interpreter. NeMo-RL's files are never edited: a copy lives in a
temporary folder and is changed there by text replacements."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import patience

ROOT = Path(__file__).resolve().parents[1]

INSTALL = (
    "from nemo_mmpo.nemo_rl import install, is_installed\n"
    "try:\n"
    "    print('HOOKED:', ' '.join(install()))\n"
    "except RuntimeError as error:\n"
    "    print('REFUSED:', error, '| installed:', is_installed())\n"
)


def nemo_rl_copy(into: Path) -> Path:
    """A copy of the imported NeMo-RL's package under ``into`` (its parent goes on the path);
    returns its ``algorithms`` folder."""
    import nemo_rl

    shutil.copytree(Path(nemo_rl.__file__).resolve().parent, into / "nemo_rl")  # bytecode too
    return into / "nemo_rl" / "algorithms"


def edit(path: Path, old: str, new: str) -> None:
    """Replace the one occurrence of ``old`` in ``path``."""
    text = path.read_text()
    assert text.count(old) == 1, (path, old)
    path.write_text(text.replace(old, new))


def substitute(path: Path, pattern: str, replacement: str, at_least: int = 1) -> None:
    """``re.sub`` over ``path`` (multi-line), which must match ``at_least`` times."""
    text, count = re.subn(pattern, replacement, path.read_text(), flags=re.MULTILINE)
    assert count >= at_least, (path, pattern, count)
    path.write_text(text)


def append(path: Path, code: str) -> None:
    path.write_text(path.read_text() + "\n\n" + code)


def run_in(nemo_rl_root: Path, code: str = INSTALL) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter that imports NeMo-RL from the copy ``nemo_rl_root``."""
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(nemo_rl_root), str(ROOT)]))
    return patience.run(
        [sys.executable, "-W", "ignore", "-c", code],
        capture_output=True,
        text=True,
        env=environment,
        timeout=patience.COMMAND_S,
    )
