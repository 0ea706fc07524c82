"""``nemo-mmpo``: one command for every tool, with one error handler.

    nemo-mmpo train --config nemo_mmpo/mmpo_tiny_cpu.yaml [overrides]
    nemo-mmpo eval report runs/mmpo.jsonl --out report/
    nemo-mmpo lab compare --steps 3000
    nemo-mmpo cpu spread --out results/spread
    nemo-mmpo study run --quick

Each subcommand is a module's ``main(argv, prog)`` (``python -m nemo_mmpo.eval`` and friends
keep working through the same :func:`~nemo_mmpo.errors.handle`, which maps errors to exit
statuses). Subcommands are named by module, imported only when chosen, so this module sits on
top of every layer without importing them (``tests/test_architecture.py``).
"""

from __future__ import annotations

import importlib
import sys

from nemo_mmpo import __version__
from nemo_mmpo.errors import handle

#: subcommand -> (module with ``main(argv, prog)``, one-line description)
COMMANDS = {
    "train": ("nemo_mmpo.launch.train", "check a recipe, print its plan, train (NeMo-RL or CPU)"),
    "eval": ("nemo_mmpo.eval.__main__", "sample, grade and report the paper's evaluation"),
    "lab": ("nemo_mmpo.lab.__main__", "the CPU objective simulator"),
    "cpu": ("nemo_mmpo.cpu.__main__", "the CPU rig: warm start, reward curves, seed spread"),
    "study": ("nemo_mmpo.study.__main__", "seeded comparisons of objectives through NeMo-RL"),
}


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
