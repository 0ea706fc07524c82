"""How long a test waits for a process before it calls it a hang.

These limits catch hangs, not slowness. CI machines are shared: beside a busy neighbour a 2-core
machine runs a step several times slower than when quiet, and a limit set a few times above a
quiet run's time turns that neighbour into a failed test (an infrastructure hiccup read as a
behaviour change). So every limit here is far above what a quiet run needs; how fast things are
is measured in ``benchmarks/``, never by a test's deadline.
"""

from __future__ import annotations

#: a short command (a dry run, the CLI, a docs block): seconds on a quiet machine
COMMAND_S = 600
#: a training run, the watcher, a killed run reaching its step: minutes on a quiet machine
RUN_S = 3600
#: a gloo collective between rank processes, which reach it at different times (each rank
#: imports Megatron and builds its worker at its own speed on a loaded machine)
COLLECTIVE_S = 900
