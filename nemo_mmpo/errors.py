"""The errors nemo-mmpo raises, and :func:`handle`, which turns them into an exit status.

Every command (``nemo-mmpo <command>``, ``python -m nemo_mmpo.<tool>``,
``examples/run_mmpo_math.py``) runs its ``main(argv, prog)`` through :func:`handle`: bad input
is one ``error:`` line naming the value and the fix, exit status 2; an interrupt exits 130
without a traceback; a run that lost a Ray node or stalled prints its error and exits 1 at once.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable


class MMPOInputError(ValueError):
    """Input the estimators cannot use; the message names the offending value and the fix."""


class NodeDiedError(RuntimeError):
    """A Ray node the run used died; the message names it."""


class TrainingStalledError(RuntimeError):
    """The run stopped making progress; the message says since when and what was waited for."""


def handle(main: Callable[..., int | None], argv: list[str] | None, prog: str) -> int:
    """Run ``main(argv, prog=prog)``; bad input becomes one line on stderr and status 2."""
    try:
        return int(main(argv, prog=prog) or 0)
    except MMPOInputError as error:
        print(f"error: {error}", file=sys.stderr)
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
