"""The package must stay valid Python on every supported interpreter (3.10 to 3.13).

CI runs the suite on one interpreter; this compiles every source file with each other
supported interpreter found on the machine, so syntax from a newer Python cannot slip in.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [ROOT / "nemo_mmpo", ROOT / "examples", ROOT / "benchmarks"]


def find_interpreter(version: str) -> str | None:
    """A real ``pythonX.Y`` binary: pyenv's installs first (its shims need a selected version)."""
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    for candidate in sorted(pyenv_root.glob(f"versions/{version}.*/bin/python{version}")):
        return str(candidate)
    return shutil.which(f"python{version}")


@pytest.mark.parametrize("version", ["3.10", "3.11", "3.12", "3.13"])
def test_sources_compile(version, tmp_path):
    interpreter = find_interpreter(version)
    if interpreter is None:
        pytest.skip(f"python{version} is not installed on this machine")
    probe = subprocess.run([interpreter, "--version"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"python{version} is present but does not run: {probe.stderr.strip()}")
    targets = [str(path) for path in SOURCES if path.exists()]
    result = subprocess.run(
        [interpreter, "-m", "compileall", "-q", "-d", str(tmp_path), *targets],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPYCACHEPREFIX": str(tmp_path)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
