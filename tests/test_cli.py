"""The command line's error handler: a run that lost a Ray node or stalled exits at once with
its message, even when something registered to run at exit would wait for ever (as Ray's
disconnect can, on calls NeMo-RL left pending on a dead node)."""

from __future__ import annotations

import subprocess
import sys

import patience
import pytest

PROGRAM = """
import atexit, threading
from nemo_mmpo.cli import handle
from nemo_mmpo.cpu.rig.node_watch import {error}

atexit.register(threading.Event().wait)  # an exit hook that never returns

def main(argv, prog):
    raise {error}("no step for 600 s after step 3")

handle(main, [], "run_mmpo_math.py")
"""


@pytest.mark.parametrize("error", ["NodeDiedError", "TrainingStalledError"])
def test_a_run_that_ended_badly_exits_with_its_message_despite_a_hanging_exit_hook(error):
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM.format(error=error)],
        capture_output=True,
        text=True,
        timeout=patience.COMMAND_S,
    )
    assert result.returncode == 1
    assert result.stderr.strip() == (f"run_mmpo_math.py: {error}: no step for 600 s after step 3")


def test_bad_input_is_one_line_and_status_2():
    from nemo_mmpo.cli import handle
    from nemo_mmpo.errors import MMPOInputError

    def main(argv, prog):
        raise MMPOInputError("steps=0: give integers >= 1")

    assert handle(main, [], "study") == 2


def test_version_is_the_released_one_in_the_changelog(capsys):
    import re
    from pathlib import Path

    from nemo_mmpo import __version__
    from nemo_mmpo.cli import main

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"nemo-mmpo {__version__}\n"
    changelog = (Path(__file__).resolve().parent.parent / "CHANGELOG.md").read_text()
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", changelog, re.MULTILINE)
    assert released and released[0] == __version__  # the newest release heading
