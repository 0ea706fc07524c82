"""The command line's error handler: a run that lost a Ray node or stalled exits at once with
its message, even when something registered to run at exit would wait for ever (as Ray's
disconnect can, on calls NeMo-RL left pending on a dead node)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

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
    result = patience.run(
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


def test_train_without_nemo_rl_or_a_way_to_it_says_what_to_run(tmp_path):
    """``nemo-mmpo train`` where ``nemo_rl`` does not import (the 3.11 suite, a login node) and
    neither a NeMo-RL checkout nor uv is at hand: one line saying what to run, not a traceback
    (with both, it moves into NeMo-RL's uv project as ``uv run examples/run_mmpo_math.py``
    does: :func:`nemo_mmpo.launch.environment.reexecute_in_nemo_rl`)."""
    import os

    if importlib.util.find_spec("nemo_rl") is not None:
        pytest.skip("nemo_rl imports here: train would start")
    environment = {
        key: value for key, value in os.environ.items() if key not in ("UV", "NEMO_RL_PATH")
    }
    environment["PATH"] = os.path.dirname(sys.executable)  # no uv
    environment["NEMO_RL_PATH"] = str(tmp_path)  # no NeMo-RL checkout
    root = Path(__file__).resolve().parents[1]
    environment["PYTHONPATH"] = str(root)  # this checkout's nemo_mmpo
    recipe = root / "examples" / "configs" / "mmpo_tiny_cpu.yaml"
    done = subprocess.run(
        [sys.executable, "-m", "nemo_mmpo.cli", "train", "--config", str(recipe)],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("nemo-mmpo train: nemo_rl is not importable here"), line
    assert "NEMO_RL_PATH" in line and "--recursive" in line
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_module_of_a_missing_extra_is_one_line_naming_the_extra(capsys):
    """``--prepare-data`` without ``datasets``, ``eval summary`` without matplotlib: the
    command says which extra to install instead of a traceback."""
    from nemo_mmpo.cli import handle

    def main(argv, prog):
        raise ModuleNotFoundError("No module named 'datasets'", name="datasets")

    assert handle(main, [], "nemo-mmpo train") == 2
    root = Path(__file__).resolve().parents[1]  # a clone: the command names this folder
    assert capsys.readouterr().err == (
        "error: nemo-mmpo train needs datasets, which is not installed here: "
        f'pip install "{root}[eval]"\n'
    )

    def other(argv, prog):
        raise ModuleNotFoundError("No module named 'something_else'", name="something_else")

    with pytest.raises(ModuleNotFoundError):  # not an extra's: a bug, with its traceback
        handle(other, [], "nemo-mmpo train")


def test_install_commands_paste(tmp_path, monkeypatch):
    """The pip command an error prints installs for real: pip accepts ``"<folder>[extra]"``
    (a dry run of it, offline, resolves this clone's name and extra); an installed copy (no
    source folder beside it) names the user's clone with a marked placeholder."""
    import subprocess
    import sys

    from nemo_mmpo import errors

    command = errors.install_command("launch")
    root = Path(__file__).resolve().parents[1]
    assert command == f'pip install "{root}[launch]"'
    report = tmp_path / "report.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            "--report",
            str(report),
            "-q",
            f"{root}[launch]",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (installed,) = __import__("json").loads(report.read_text())["install"]
    assert installed["metadata"]["name"] == "nemo-mmpo"
    assert installed["requested_extras"] == ["launch"]
    monkeypatch.setattr(errors, "__file__", str(tmp_path / "site-packages" / "nemo_mmpo" / "x.py"))
    assert errors.install_command("eval") == f'pip install "{errors.SOURCE_PLACEHOLDER}[eval]"'
