"""The errors nemo-mmpo raises, and :func:`handle`, which turns them into an exit status.

Every command (``nemo-mmpo <command>``, ``python -m nemo_mmpo.<tool>``,
``examples/run_mmpo_math.py``) runs its ``main(argv, prog)`` through :func:`handle`: bad input
is one ``error:`` line naming the value and the fix (also raised in a Ray actor:
:func:`one_line`), exit status 2 (a module an extra provides
and this environment lacks, too: :data:`EXTRA_OF`); an interrupt exits 130
without a traceback; a run that lost a Ray node or stalled prints its error and exits 1 at once.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path


class MMPOInputError(ValueError):
    """Input the estimators cannot use; the message names the offending value and the fix."""


class NodeDiedError(RuntimeError):
    """A Ray node the run used died; the message names it."""


class TrainingStalledError(RuntimeError):
    """The run stopped making progress; the message says since when and what was waited for."""


# what to install nemo-mmpo from when it does not run from a source folder (not on PyPI)
SOURCE_PLACEHOLDER = "<your nemo-mmpo clone>"


def install_command(extra: str) -> str:
    """The pip command that installs nemo-mmpo with ``extra`` (``launch``, ``eval``, ...), as
    a user pastes it: from the source folder this copy runs from (a clone), else from the
    user's clone, named by a marked placeholder (nemo-mmpo is installed from its source, not
    from PyPI)."""
    source = Path(__file__).resolve().parents[1]
    where = str(source) if (source / "pyproject.toml").is_file() else SOURCE_PLACEHOLDER
    return f'pip install "{where}[{extra}]"'


#: modules nemo-mmpo's commands import from an extra (:func:`install_command`)
EXTRA_OF = {
    "datasets": "eval",
    "pyarrow": "eval",
    "matplotlib": "eval",
    "math_verify": "eval",
    "latex2sympy2_extended": "eval",
    "tqdm": "eval",
    "tensorboard": "eval",
    "transformers": "hf",
    "omegaconf": "launch",
    "hydra": "launch",
    "antlr4": "launch",
    "pydantic": "launch",
    "yaml": "launch",
}


def one_line(error: MMPOInputError) -> MMPOInputError:
    """``error``, or what it wraps when Ray raised it (a ``RayTaskError`` of an actor's
    ``MMPOInputError``, e.g. the single controller's first-step checks: its text is the actor's
    traceback, over many lines; its ``cause`` is our one line)."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, MMPOInputError) else error


def handle(main: Callable[..., int | None], argv: list[str] | None, prog: str) -> int:
    """Run ``main(argv, prog=prog)``; bad input becomes one line on stderr and status 2."""
    try:
        return int(main(argv, prog=prog) or 0)
    except MMPOInputError as error:
        print(f"error: {one_line(error)}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as error:
        extra = EXTRA_OF.get((error.name or "").partition(".")[0])
        if extra is None:
            raise
        print(
            f"error: {prog} needs {error.name}, which is not installed here: "
            f"{install_command(extra)}",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except (NodeDiedError, TrainingStalledError) as error:
        # A run that lost a Ray node or stopped making progress exits now, with its message:
        # Ray's disconnect at interpreter exit can wait for ever on the calls NeMo-RL left
        # pending on the dead node (tests/cpu/test_ray_nodes.py, 2 of 3 runs on 2026-11-24).
        print(f"{prog}: {type(error).__name__}: {error}", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
