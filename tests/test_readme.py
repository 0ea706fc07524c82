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
