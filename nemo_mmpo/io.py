"""Atomic file writes (a reader never sees a half-written result, an interrupted write loses
nothing that was there before), figures, and the markdown tables the reports write."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def atomic_path(path: str | Path, suffix: str = "") -> Iterator[str]:
    """Yield a temporary path beside ``path``; on success it replaces ``path``, else vanishes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(
        prefix=f".{path.name}.", suffix=suffix, dir=path.parent
    )
    os.close(descriptor)
    try:
        yield temporary
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_jsonl_atomic(records: Iterable[dict[str, Any]], path: str | Path) -> int:
    """Write records as JSON lines, atomically; returns how many were written."""
    count = 0
    with atomic_path(path) as temporary, open(temporary, "w") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
        handle.flush()
        os.fsync(handle.fileno())
    return count


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    with atomic_path(path) as temporary, open(temporary, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def save_figure_atomic(figure: Any, path: str | Path, dpi: int = 110) -> None:
    """Save a matplotlib figure as PNG, atomically."""
    with atomic_path(path, suffix=".png") as temporary:
        figure.savefig(temporary, dpi=dpi, bbox_inches="tight")


def finish_figure(
    figure: Any, axis: Any, path: str | Path, *, xlabel: str, ylabel: str, title: str
) -> None:
    """Label one-axis ``figure`` (grid, small legend), save it atomically and close it.

    More than five legend entries go beside the axes, where they cover no data."""
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.set_title(title)
    axis.grid(alpha=0.3)
    if len(axis.get_legend_handles_labels()[1]) > 5:
        axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    else:
        axis.legend(fontsize=8)
    save_figure_atomic(figure, path)
    pyplot().close(figure)


def pyplot():
    """matplotlib's pyplot on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot

    return matplotlib.pyplot


def markdown_table(header: Sequence[object], rows: Iterable[Sequence[object]]) -> list[str]:
    """A markdown table's lines: ``| a | b |``, ``|---|---|``, then ``| x | y |`` per row.

    Cells are written with ``str``; every row should have ``len(header)`` cells.
    """
    lines = ["| " + " | ".join(map(str, header)) + " |", "|---" * len(header) + "|"]
    return lines + ["| " + " | ".join(map(str, row)) + " |" for row in rows]
