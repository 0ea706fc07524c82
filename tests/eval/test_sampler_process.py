"""A sampler in another interpreter (``nemo_mmpo.eval.sampler_process``): the watcher's calls
come back as the sampler in this process answers them, its errors as the same one line, a dead
process as a plain error, and the process dies with the watcher.

The samplers: transformers' on a tiny random Llama (the same seeded draws here and there), and
stand-ins written into a module of the test's own, reached on ``PYTHONPATH`` as the watcher
reaches nemo-mmpo in a worker environment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nemo_mmpo.errors import MMPOInputError
from nemo_mmpo.eval.sampler_process import SamplerProcess
from nemo_mmpo.eval.worker_environments import worker_environment

STAND_INS = '''
import os, sys, time

class Echo:
    """Each prompt's n responses, numbered; prints on stdout (its fd too) as engines do. The
    prompt "break" raises, "die" ends the process, "sleep" prints its pid and sleeps."""
    draws_fixed_by_call = True

    def __init__(self, suffix=None):
        self.suffix = os.environ.get("ECHO_SUFFIX", "") if suffix is None else suffix
        print("loading weights")  # on the process's stdout: must not reach the watcher's answers
        os.write(1, b"C-level noise\\n")

    def generate(self, prompts, n):
        print("generating")
        if prompts == ["break"]:
            raise ZeroDivisionError("the engine broke")
        if prompts == ["die"]:
            os._exit(7)
        if prompts == ["sleep"]:
            print(f"pid={os.getpid()}", file=sys.stderr, flush=True)
            time.sleep(600)
        return [[f"{prompt}{self.suffix}#{index}" for index in range(n)] for prompt in prompts]

    def close(self):
        with open(os.environ["STAND_IN_CLOSED"], "w") as marker:
            marker.write("closed")
'''


@pytest.fixture
def environment(tmp_path):
    """The watcher's environment for a sampler process: the stand-ins' folder on PYTHONPATH."""
    (tmp_path / "stand_in_samplers.py").write_text(textwrap.dedent(STAND_INS))
    environment = worker_environment(sys.executable)
    environment["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{environment['PYTHONPATH']}"
    environment["STAND_IN_CLOSED"] = str(tmp_path / "closed")
    return environment


def stand_in(name: str, environment: dict[str, str], **options) -> SamplerProcess:
    return SamplerProcess(
        sys.executable, f"stand_in_samplers.{name}", options, environment=environment
    )


def test_calls_come_back_whole_through_the_noise_and_errors_it_prints(environment, tmp_path):
    sampler = stand_in("Echo", environment, suffix="!")
    try:
        assert sampler.draws_fixed_by_call  # the sampler's own, as run_generation reads it
        assert sampler.generate(["a", "b"], 2) == [["a!#0", "a!#1"], ["b!#0", "b!#1"]]
        with pytest.raises(RuntimeError, match="ZeroDivisionError: the engine broke"):
            sampler.generate(["break"], 1)  # its traceback: on the process's stderr
        assert sampler.generate(["c"], 3) == [["c!#0", "c!#1", "c!#2"]]
    finally:
        sampler.close()
    assert (tmp_path / "closed").read_text() == "closed"  # closed inside before it exited
    sampler.close()  # idempotent


def test_setup_runs_there_first_and_a_dead_process_is_named(environment, tmp_path):
    (tmp_path / "stand_in_setup.py").write_text(
        "import os\ndef tag():\n    os.environ['ECHO_SUFFIX'] = '@set-up'\n"
    )
    sampler = SamplerProcess(
        sys.executable, "stand_in_samplers.Echo", {}, ["stand_in_setup.tag"], environment
    )
    assert sampler.generate(["x"], 1) == [["x@set-up#0"]]
    assert "ECHO_SUFFIX" not in os.environ  # there, not here
    with pytest.raises(RuntimeError, match="exited with status 7 without answering"):
        sampler.generate(["die"], 1)
    sampler.close()
    with pytest.raises(RuntimeError, match="No module named 'no_such_module'"):
        SamplerProcess(
            sys.executable, "stand_in_samplers.Echo", {}, ["no_such_module.f"], environment
        )


def test_bad_input_inside_is_the_same_one_line_here(tmp_path):
    """transformers' sampler refuses a model folder that does not exist: the same line."""
    pytest.importorskip("transformers")
    missing = tmp_path / "no-model"
    options = {"model": str(missing)}
    with pytest.raises(MMPOInputError) as caught:
        SamplerProcess(
            sys.executable,
            "nemo_mmpo.eval.generate.TransformersSampler",
            options,
            environment=worker_environment(sys.executable),
        )
    assert str(caught.value).startswith(f"--model {missing}: not a local directory")
    assert "\n" not in str(caught.value)


def test_transformers_samples_there_what_it_samples_here(tiny_model):
    """Seeded sampling of a tiny random Llama: the process's draws are this process's."""
    from nemo_mmpo.eval.generate import TransformersSampler

    options = {"model": str(tiny_model), "max_tokens": 6, "seed": 3, "batch_size": 2}
    prompts = ["12 34", "5 6", "7"]
    here = TransformersSampler(**options)
    try:
        expected = here.generate(prompts, 2)
    finally:
        here.close()
    there = SamplerProcess(
        sys.executable,
        "nemo_mmpo.eval.generate.TransformersSampler",
        options,
        environment=worker_environment(sys.executable),
    )
    try:
        assert not there.draws_fixed_by_call
        assert there.generate(prompts, 2) == expected
    finally:
        there.close()


def test_the_process_dies_with_the_watcher(environment, tmp_path):
    """A watcher killed mid-call (SIGKILL) leaves no sampler process behind (Linux)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    program = (
        "import sys\n"
        "from nemo_mmpo.eval.sampler_process import SamplerProcess\n"
        "sampler = SamplerProcess(sys.executable, 'stand_in_samplers.Echo', {}, "
        f"environment={environment!r})\n"
        "sampler.generate(['sleep'], 1)\n"
    )
    with open(tmp_path / "stderr", "w") as stderr:
        watcher = subprocess.Popen([sys.executable, "-c", program], stderr=stderr, env=environment)
    child = int(wait_for(lambda: sleeping_pid(tmp_path / "stderr"), "the call", 120))
    assert _alive(child)
    os.kill(watcher.pid, signal.SIGKILL)
    watcher.wait()
    wait_for(lambda: not _alive(child), "the sampler process to die", 30)


def sleeping_pid(stderr: Path) -> str | None:
    lines = [line for line in stderr.read_text().splitlines() if line.startswith("pid=")]
    return lines[0].removeprefix("pid=") if lines else None


def wait_for(condition, what: str, seconds: float):
    """``condition()`` once it is truthy; fails after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not (value := condition()):
        assert time.monotonic() < deadline, f"waited {seconds} s for {what}"
        time.sleep(0.1)
    return value


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")
