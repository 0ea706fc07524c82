"""A sampler in another interpreter: ``python -m nemo_mmpo.eval.sampler_process``.

The watcher samples with vLLM in a process of NeMo-RL's vLLM worker environment
(:func:`~nemo_mmpo.eval.worker_environments.worker_python`), never in its own: NeMo-RL's driver
environment has no vLLM. :class:`SamplerProcess` is a sampler of the watcher's (``generate``,
``close``, ``draws_fixed_by_call``) whose calls run in that process, one JSON line each way:

- the watcher writes the start line on the process's stdin, ``{"setup": [function names],
  "sampler": "module.Class", "options": {keyword arguments}}``; the process calls each setup
  function (the CPU rig's answers for vLLM's CPU build), builds the sampler, and answers
  ``{"ready": true, "python": ..., "draws_fixed_by_call": ...}``;
- then each call: ``{"prompts": [...], "n": N}``, answered ``{"responses": [[...], ...]}``;
- an error is answered ``{"error": "...", "input": true}`` (an ``MMPOInputError``: the
  watcher raises it as one line) or ``"input": false`` (anything else; its traceback is on
  the process's stderr);
- the watcher closes stdin: the process closes the sampler and exits.

The process answers on the stdout it started with; everything printed there after that
(vLLM's logs, C libraries' output) goes to its stderr, the watcher's. It dies with the watcher
(Linux's ``PR_SET_PDEATHSIG``): a watcher killed mid-call leaves no engine holding the GPU for
the next one. Resuming stays the watcher's (:func:`~nemo_mmpo.eval.generate.run_generation`
writes each call's graded samples as they come back), and so do the per-row seeds (the
sampler's ``seed_per_row``, inside the process).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import traceback
from collections.abc import Sequence
from typing import IO, Any

from nemo_mmpo.errors import MMPOInputError, one_line

MODULE = "nemo_mmpo.eval.sampler_process"


class SamplerProcess:
    """The sampler class ``sampler`` (``module.Class``, built with ``options``) in a process
    of ``python`` with ``environment``, ``setup`` (``module.function`` names) called there
    first. Starts the process and waits until the sampler is built."""

    def __init__(
        self,
        python: str,
        sampler: str,
        options: dict[str, Any],
        setup: Sequence[str] = (),
        environment: dict[str, str] | None = None,
    ) -> None:
        self.python = python
        self.process: subprocess.Popen | None = subprocess.Popen(
            [python, "-m", MODULE, str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=environment,
            text=True,
        )
        try:
            ready = self._ask({"setup": list(setup), "sampler": sampler, "options": options})
        except BaseException:
            self.close()
            raise
        self.draws_fixed_by_call = bool(ready.get("draws_fixed_by_call"))

    def generate(self, prompts: Sequence[str], n: int) -> list[list[str]]:
        return self._ask({"prompts": list(prompts), "n": n})["responses"]

    def close(self) -> None:
        """End the process (its sampler closed first) and wait for it. Idempotent."""
        process, self.process = self.process, None
        if process is None:
            return
        try:
            process.stdin.close()
        except OSError:
            pass
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stdout.close()

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send ``request``; its answer, or the process's error raised here."""
        process = self.process
        if process is None:
            raise RuntimeError("the sampler process is closed")
        try:
            process.stdin.write(json.dumps(request) + "\n")
            process.stdin.flush()
        except OSError:
            pass  # it died: its missing answer says so below
        line = process.stdout.readline()
        if not line:
            status = process.wait()
            raise RuntimeError(
                f"the sampler process ({self.python} -m {MODULE}) exited with status {status} "
                "without answering; its output is above"
            )
        answer = json.loads(line)
        if "error" in answer:
            if answer.get("input"):
                raise MMPOInputError(answer["error"])
            raise RuntimeError(
                f"the sampler process ({self.python}) failed: {answer['error']} (its traceback "
                "is above)"
            )
        return answer


def die_with_parent(parent: int) -> None:
    """Exit when the watcher ``parent`` dies (Linux: a SIGKILL from the kernel, which reaches
    a process busy in C code)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # it died before the signal was armed
        os._exit(0)


def build_sampler(start: dict[str, Any]) -> Any:
    """The start line's sampler, its setup functions called first."""
    from nemo_mmpo.eval.convert import run_setup

    run_setup(start.get("setup") or ())
    module, _, name = start["sampler"].rpartition(".")
    return getattr(importlib.import_module(module), name)(**start.get("options", {}))


def answer_for(work: Any, *arguments: Any) -> dict[str, Any]:
    """The answer line of ``work(*arguments)``: its result, or its error."""
    try:
        return work(*arguments)
    except MMPOInputError as error:
        return {"error": str(one_line(error)), "input": True}
    except Exception as error:  # the watcher raises it; the traceback stays readable here
        traceback.print_exc()
        return {"error": f"{type(error).__name__}: {error}", "input": False}


def serve(requests: IO[str], answers: IO[str]) -> None:
    """Answer the start line and every call until ``requests`` ends."""

    def reply(answer: dict[str, Any]) -> None:
        answers.write(json.dumps(answer) + "\n")
        answers.flush()

    sampler = None

    def start(line: str) -> dict[str, Any]:
        nonlocal sampler
        sampler = build_sampler(json.loads(line))
        fixed = bool(getattr(sampler, "draws_fixed_by_call", False))
        return {"ready": True, "python": sys.executable, "draws_fixed_by_call": fixed}

    first = requests.readline()
    if not first:
        return

    def generate(line: str) -> dict[str, Any]:
        call = json.loads(line)
        return {"responses": sampler.generate(call["prompts"], call["n"])}

    reply(answer_for(start, first))
    if sampler is None:
        return
    try:
        for line in requests:
            reply(answer_for(generate, line))
    finally:
        getattr(sampler, "close", lambda: None)()


def main() -> None:
    die_with_parent(int(sys.argv[1]))
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # what anything prints: the watcher's stderr
    serve(sys.stdin, answers)


if __name__ == "__main__":
    main()
