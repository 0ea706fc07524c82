"""The README's recipe as a user copies it: its YAML blocks and command lines read out of
README.md (so the README cannot drift from what the tests run), and the user's problems in the
README's JSONL shape (sums: the tiny model's task, its warm start)."""

from __future__ import annotations

import json
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
#: the user's training and held-out problems, ``(a, b)`` for "What is a + b?"
TRAIN = [(2, 3), (12, 30), (45, 17), (8, 9), (31, 22), (60, 7), (14, 14), (5, 88)]
HELD_OUT = [(23, 41), (70, 19), (3, 4), (55, 36)]


def readme_file(name: str) -> str:
    """The README's YAML block whose first line names ``~/exp/<name>``."""
    blocks = re.findall(r"^```yaml\n(.*?)^```", README.read_text(), flags=re.DOTALL | re.M)
    (block,) = [block for block in blocks if f"~/exp/{name}" in block.splitlines()[0]]
    return block


def readme_command(start: str) -> list[str]:
    """The README's command line that starts with ``start`` (its comment dropped)."""
    lines = [line for line in README.read_text().splitlines() if line.startswith(start)]
    assert lines, start
    return lines[0].split("#")[0].split()


def problems(pairs: list[tuple[int, int]]) -> str:
    """``pairs`` as the README's JSONL (``problem``, ``answer`` a JSON string)."""
    return "".join(
        json.dumps({"problem": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n"
        for a, b in pairs
    )
