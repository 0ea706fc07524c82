"""The driver's node watch on a stand-in node table (no cluster): a node that dies under a loop
which, like NeMo-RL's async trainer, swallows every exception and would otherwise wait forever,
ends the block with :class:`NodeDiedError` naming the node, promptly; Ctrl-C's handler is back
afterwards. The same on a real two-node cluster: ``test_ray_nodes.py``."""

from __future__ import annotations

import signal
import time

import pytest

pytestmark = pytest.mark.nemo_rl  # the NeMo-RL suite's environment has Ray
ray = pytest.importorskip("ray")

from nemo_mmpo.cpu.node_watch import NodeDiedError, watch_nodes

HEAD = {"NodeID": "a" * 56, "NodeManagerAddress": "10.0.0.1", "Alive": True, "Resources": {}}
WORKER = {
    "NodeID": "b" * 56,
    "NodeManagerAddress": "10.0.0.2",
    "Alive": True,
    "Resources": {"CPU": 4.0, "worker_node": 1.0, "node:10.0.0.2": 1.0},
}


def test_a_dead_node_ends_a_loop_that_swallows_errors(monkeypatch):
    table = [dict(HEAD), dict(WORKER)]
    monkeypatch.setattr(ray, "nodes", lambda: [dict(node) for node in table])
    handler = signal.getsignal(signal.SIGINT)
    swallowed = []
    started = time.monotonic()
    with pytest.raises(NodeDiedError) as error, watch_nodes(period=0.1):
        table[1]["Alive"] = False
        while time.monotonic() - started < 30:  # NeMo-RL's wait for its replay buffer
            try:
                time.sleep(0.05)
            except Exception as caught:  # NeMo-RL prints it and goes on
                swallowed.append(caught)
                break  # its loop ends after an error; the block then raises
    assert time.monotonic() - started < 5
    assert len(swallowed) == 1 and isinstance(swallowed[0], NodeDiedError)
    assert str(error.value) == (
        f"Ray node {'b' * 12} (10.0.0.2, resources worker_node) died during training"
    )
    assert signal.getsignal(signal.SIGINT) is handler


def test_a_node_that_stays_alive_changes_nothing(monkeypatch):
    monkeypatch.setattr(ray, "nodes", lambda: [dict(HEAD), dict(WORKER)])
    handler = signal.getsignal(signal.SIGINT)
    with watch_nodes(period=0.05):
        time.sleep(0.3)
    assert signal.getsignal(signal.SIGINT) is handler
