"""Atomic file writes: a reader never sees a half-written result, an interrupted write loses
nothing that was there before."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def _temporary_beside(path: Path, suffix: str = "") -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(
        prefix=f".{path.name}.", suffix=suffix, dir=path.parent
    )
    os.close(descriptor)
    return temporary


def _publish(temporary: str, path: Path) -> None:
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    path = Path(path)
    temporary = _temporary_beside(path)
    try:
        with open(temporary, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        _publish(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_jsonl_atomic(records: Iterable[dict[str, Any]], path: str | Path) -> int:
    """Write records as JSON lines, atomically; returns how many were written."""
    path = Path(path)
    temporary = _temporary_beside(path)
    count = 0
    try:
        with open(temporary, "w") as handle:
            for record in records:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
                count += 1
            handle.flush()
            os.fsync(handle.fileno())
        _publish(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return count


def save_figure_atomic(figure: Any, path: str | Path, dpi: int = 110) -> None:
    """Save a matplotlib figure as PNG, atomically."""
    path = Path(path)
    temporary = _temporary_beside(path, suffix=".png")
    try:
        figure.savefig(temporary, dpi=dpi, bbox_inches="tight")
        _publish(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def pyplot():
    """matplotlib's pyplot on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot

    return matplotlib.pyplot
