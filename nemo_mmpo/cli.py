"""``nemo-mmpo``: one command for every tool, with one error handler.

    nemo-mmpo train --config examples/configs/mmpo_tiny_cpu.yaml [overrides]
    nemo-mmpo eval report runs/mmpo.jsonl --out report/
    nemo-mmpo lab compare --steps 3000
    nemo-mmpo cpu spread --out results/spread
    nemo-mmpo study run --quick

Each subcommand is a module's ``main(argv, prog)`` (``python -m nemo_mmpo.eval`` and friends
keep working through the same :func:`handle`): bad input is one ``error:`` line naming the
value and the fix, exit status 2; an interrupt exits 130 without a traceback; a run that lost
a Ray node or stalled prints its error and exits 1 at once.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

from nemo_mmpo import __version__
from nemo_mmpo.cpu.node_watch import NodeDiedError, TrainingStalledError
from nemo_mmpo.errors import MMPOInputError

#: subcommand -> (module with ``main(argv, prog)``, one-line description)
COMMANDS = {
    "train": ("nemo_mmpo.launch.train", "check a recipe, print its plan, train (NeMo-RL or CPU)"),
    "eval": ("nemo_mmpo.eval.__main__", "sample, grade and report the paper's evaluation"),
    "lab": ("nemo_mmpo.lab.__main__", "the CPU objective simulator"),
    "cpu": ("nemo_mmpo.cpu.__main__", "the CPU rig: warm start, reward curves, seed spread"),
    "study": ("nemo_mmpo.study.__main__", "seeded comparisons of objectives through NeMo-RL"),
}


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


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: nemo-mmpo <command> [arguments] | --version", "", "commands:"]
    lines += [f"  {name:<{width}}  {about}" for name, (_, about) in COMMANDS.items()]
    lines += ["", "nemo-mmpo <command> --help describes each one."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--version"]:
        print(f"nemo-mmpo {__version__}")
        return 0
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"nemo-mmpo: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[command][0])
    return handle(module.main, rest, f"nemo-mmpo {command}")


if __name__ == "__main__":
    sys.exit(main())
