"""The driver's node watch on a stand-in node table: a node that dies under a loop which, like
NeMo-RL's async trainer, swallows every exception and would otherwise wait forever, or under a
``ray.get`` that would never return, ends the block with :class:`NodeDiedError` naming the
node, promptly, after the loop's clean-up (cut if it hangs); Ctrl-C's handler is back
afterwards. The same on a real two-node cluster: ``test_ray_nodes.py``. A run that logs nothing
for ``cpu_backend.stall_timeout_s`` (the driver's stall check, on its real progress logger)
ends the same way with :class:`TrainingStalledError`; one that keeps logging runs on."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.nemo_rl  # the NeMo-RL suite's environment has Ray
ray = pytest.importorskip("ray")

from nemo_mmpo.cpu.engines.ray_cluster import start_local_cluster
from nemo_mmpo.cpu.rig.console import ProgressLogger
from nemo_mmpo.cpu.rig.node_watch import NodeDiedError, TrainingStalledError, watch_nodes
from nemo_mmpo.nemo_rl.versions import ASYNC_RESUME_FIX, async_resume_can_stall

HEAD = {"NodeID": "a" * 56, "NodeManagerAddress": "10.0.0.1", "Alive": True, "Resources": {}}
WORKER = {
    "NodeID": "b" * 56,
    "NodeManagerAddress": "10.0.0.2",
    "Alive": True,
    "Resources": {"CPU": 4.0, "worker_node": 1.0, "node:10.0.0.2": 1.0},
}


def test_a_dead_node_ends_a_loop_that_swallows_errors(monkeypatch):
    """NeMo-RL's async trainer: a wait inside ``except Exception`` (printed, then on), and a
    ``finally`` that cleans up. The interrupt is not swallowed, and the clean-up runs."""
    table = [dict(HEAD), dict(WORKER)]
    monkeypatch.setattr(ray, "nodes", lambda: [dict(node) for node in table])
    handler = signal.getsignal(signal.SIGINT)
    swallowed, cleaned_up = [], []
    started = time.monotonic()
    with pytest.raises(NodeDiedError) as error, watch_nodes(period=0.1):
        table[1]["Alive"] = False
        try:
            while time.monotonic() - started < 30:  # NeMo-RL's wait for its replay buffer
                try:
                    time.sleep(0.05)
                except Exception as caught:  # NeMo-RL prints it and goes on
                    swallowed.append(caught)
        finally:
            time.sleep(0.5)  # a clean-up that takes a while (several watch periods)
            cleaned_up.append(time.monotonic())
    assert time.monotonic() - started < 5
    assert swallowed == [] and len(cleaned_up) == 1
    assert str(error.value) == (
        f"Ray node {'b' * 12} (10.0.0.2, resources worker_node) died during training"
    )
    assert signal.getsignal(signal.SIGINT) is handler


def test_a_clean_up_stuck_on_the_dead_node_is_cut_after_the_grace(monkeypatch):
    table = [dict(HEAD), dict(WORKER)]
    monkeypatch.setattr(ray, "nodes", lambda: [dict(node) for node in table])
    started = time.monotonic()
    with pytest.raises(NodeDiedError), watch_nodes(period=0.1, cleanup_grace=1.0):
        table[1]["Alive"] = False
        try:
            time.sleep(30)
        finally:
            time.sleep(30)  # e.g. NeMo-RL shutting down an environment on the dead node
    assert 1.0 <= time.monotonic() - started < 8


def test_a_dead_node_ends_a_wait_inside_ray_get(monkeypatch):
    """Inside ``ray.get`` Ray raises at once only for a ``KeyboardInterrupt`` from a signal
    handler; any other exception waits for the call (here 60 s; on a dead node, for ever)."""
    started_ray = not ray.is_initialized()
    if started_ray:
        start_local_cluster(1, {"include_dashboard": False, "log_to_driver": False})
    try:

        @ray.remote(num_cpus=0)
        def slow() -> int:
            time.sleep(60)
            return 1

        pending = slow.remote()
        table = [dict(HEAD), dict(WORKER)]
        monkeypatch.setattr(ray, "nodes", lambda: [dict(node) for node in table])
        started = time.monotonic()
        with pytest.raises(NodeDiedError), watch_nodes(period=0.1):
            table[1]["Alive"] = False
            ray.get(pending)
        assert time.monotonic() - started < 10
        ray.cancel(pending, force=True)
    finally:
        if started_ray:
            ray.shutdown()


def test_a_node_that_stays_alive_changes_nothing(monkeypatch):
    monkeypatch.setattr(ray, "nodes", lambda: [dict(HEAD), dict(WORKER)])
    handler = signal.getsignal(signal.SIGINT)
    with watch_nodes(period=0.05):
        time.sleep(0.3)
    assert signal.getsignal(signal.SIGINT) is handler


class QuietLogger:
    """NeMo-RL's ``Logger``, as far as the progress logger calls it."""

    def log_metrics(self, metrics, step, prefix="", *args, **kwargs):
        return None


class Lines:
    def __init__(self):
        self.lines = []

    def write(self, text):
        self.lines.append(text)

    def flush(self):
        pass


def stall_check(progress, timeout_s):
    driver = pytest.importorskip("nemo_mmpo.cpu.rig.driver")
    grpo = pytest.importorskip("nemo_rl.algorithms.grpo")
    return driver._stall_check(progress, timeout_s, grpo)


def test_a_run_that_logs_nothing_for_the_stall_timeout_ends_with_a_clear_error(monkeypatch):
    monkeypatch.setattr(ray, "nodes", lambda: [dict(HEAD)])
    progress = ProgressLogger(QuietLogger(), 10, Lines())
    stalled = stall_check(progress, 0.5)
    progress.log_metrics({"reward": 0.5}, 3, prefix="train")
    swallowed = []
    started = time.monotonic()
    with pytest.raises(TrainingStalledError) as error:
        with watch_nodes(period=0.05, stalled=stalled):
            while time.monotonic() - started < 30:  # NeMo-RL's wait for its replay buffer
                try:
                    time.sleep(0.05)
                except Exception as caught:
                    swallowed.append(caught)
    assert 0.5 <= time.monotonic() - started < 5
    assert swallowed == []
    assert "logged nothing for" in str(error.value) and "after step 3" in str(error.value)
    assert "cpu_backend.stall_timeout_s=0.5" in str(error.value)
    # on a NeMo-RL without the async fix (v0.7.0) the message names it; on main it does not
    root = Path(pytest.importorskip("nemo_rl.algorithms.grpo").__file__).resolve().parents[2]
    assert (ASYNC_RESUME_FIX in str(error.value)) == async_resume_can_stall(root)


def test_a_run_that_keeps_logging_is_not_stalled(monkeypatch):
    monkeypatch.setattr(ray, "nodes", lambda: [dict(HEAD)])
    progress = ProgressLogger(QuietLogger(), 100, Lines())
    stalled = stall_check(progress, 0.5)
    progress.log_metrics({"reward": 0.5}, 0, prefix="train")
    with watch_nodes(period=0.05, stalled=stalled):
        for step in range(1, 11):  # a step every 0.1 s for 1 s: twice the timeout in all
            time.sleep(0.1)
            progress.log_metrics({"reward": 0.5}, step, prefix="train")
    assert progress.last_step == 10
