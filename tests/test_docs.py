"""Every code block of the README and the docs marked runnable runs; the README's links resolve.

A block is marked by a word after the fence's language: ```` ```python runnable ```` or
```` ```bash runnable ```` (GitHub and Sphinx read only the language). Python blocks run with
``exec`` in a fresh namespace, bash blocks with ``bash -euo pipefail`` in the repository root,
this interpreter first on ``PATH``; a block that raises or exits non-zero fails its test.
Mark only what runs offline in seconds with the test extras (docs/testing.md).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
from pathlib import Path

import patience
import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
DOCUMENTS = [path for path in DOCUMENTS if "_build" not in path.parts]
FENCE = re.compile(r"^```(?P<language>\w+) runnable[ \t]*\n(?P<code>.*?)^```[ \t]*$", re.S | re.M)


def runnable_blocks() -> list[tuple[str, str, str]]:
    """``(where, language, code)`` of every marked block, ``where`` as ``file:line``."""
    blocks = []
    for path in DOCUMENTS:
        text = path.read_text()
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            where = f"{path.relative_to(ROOT)}:{line}"
            blocks.append((where, match["language"], match["code"]))
    return blocks


BLOCKS = runnable_blocks()


def test_the_readme_and_the_docs_have_runnable_blocks():
    where = [block[0] for block in BLOCKS]
    assert any(place.startswith("README.md:") for place in where), where
    assert any(place.startswith("docs/") for place in where), where
    assert {language for _, language, _ in BLOCKS} <= {"python", "bash"}


@pytest.mark.parametrize(("where", "language", "code"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_runnable_block(where: str, language: str, code: str):
    if language == "python":
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(code, where, "exec"), {"__name__": "__docs__"})
        return
    environment = dict(os.environ)
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment['PATH']}"
    result = patience.run(
        ["bash", "-euo", "pipefail", "-c", code],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=patience.COMMAND_S,
    )
    assert result.returncode == 0, f"{where}: exit {result.returncode}\n{result.stderr}"


def test_the_readme_links_resolve():
    """The README's local links name files that exist (the Sphinx build checks them too, with
    their anchors: ``docs/readme.md`` includes the README)."""
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [target for target in targets if "://" not in target]
    assert local, "the README links into docs/"
    missing = [target for target in local if not (ROOT / target).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_the_docs_pages_and_the_changelog_entries_stay_short():
    """Every page of ``docs/`` is at most 300 lines (a page, not a diary: the history of CI's
    times lives in git), and every ``CHANGELOG.md`` entry is one line of at most 250 characters
    saying what a user gets or must change (no continuation lines: the reasons are in the
    commits)."""
    long_pages = {
        path.name: lines
        for path in sorted((ROOT / "docs").glob("*.md"))
        if (lines := len(path.read_text().splitlines())) > 300
    }
    assert not long_pages, f"docs pages over 300 lines: {long_pages}"
    problems = []
    lines = (ROOT / "CHANGELOG.md").read_text().splitlines()
    for number, line in enumerate(lines, 1):
        if line.startswith("- ") and len(line) > 250:
            problems.append(f"CHANGELOG.md:{number}: {len(line)} characters")
        previous = lines[number - 2] if number > 1 else ""
        if line[:1].isspace() and line.strip() and previous.strip():
            problems.append(f"CHANGELOG.md:{number}: a continuation line, not one line an entry")
    assert not problems, "\n".join(problems)
