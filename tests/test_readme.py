"""The README's usage example runs and prints the paper's worked values."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks() -> list[str]:
    # the fence may carry a marker after the language (```python runnable: tests/test_docs.py)
    return re.findall(r"^```python[^\n]*\n(.*?)^```", README.read_text(), flags=re.DOTALL | re.M)


def test_estimator_usage_example_runs():
    block = next(block for block in python_blocks() if "mmpo_advantages" in block)
    assert len(block.strip().splitlines()) <= 10
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(block, str(README), "exec"), {})
    printed = output.getvalue()
    for value in ("4.4062", "-1.4688", "6.1224", "-1.4286"):
        assert value in printed


def test_the_readmes_pip_commands_paste(tmp_path):
    """Every ``pip install`` / ``pip wheel`` line of the README's bash blocks runs as printed,
    ``NEMO_MMPO`` (the one name marked as the user's) being a copy of this clone (a build
    writes beside its source, and other tests watch the checkout): pip accepts the source
    folder with its extras (a dry run, offline, no dependencies) and builds the wheel."""
    import os
    import shutil
    import subprocess
    import sys

    clone = tmp_path / "nemo-mmpo"
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        clone.mkdir(exist_ok=True)
        shutil.copy2(README.parent / name, clone / name)
    shutil.copytree(
        README.parent / "nemo_mmpo",
        clone / "nemo_mmpo",
        ignore=shutil.ignore_patterns("__pycache__"),
    )

    blocks = re.findall(r"^```bash[^\n]*\n(.*?)^```", README.read_text(), flags=re.DOTALL | re.M)
    lines = [
        line.split("#")[0].strip()
        for block in blocks
        for line in block.splitlines()
        if line.startswith(("pip install", "pip wheel"))
    ]
    assert any("[launch]" in line for line in lines) and any("wheel" in line for line in lines)
    pip = f"{sys.executable} -m pip"
    environment = dict(os.environ, NEMO_MMPO=str(clone), HOME=str(tmp_path))
    for line in lines:
        quiet = " --dry-run --no-deps --no-index --no-build-isolation -q"
        command = line.replace("pip install", f"pip install{quiet}", 1).replace(
            "pip wheel", "pip wheel --no-build-isolation -q", 1
        )
        done = subprocess.run(
            ["bash", "-c", command.replace("pip", pip, 1)],
            env=environment,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, (line, done.stderr[-2000:])
    assert list((tmp_path / "wheels").glob("nemo_mmpo-*.whl"))
