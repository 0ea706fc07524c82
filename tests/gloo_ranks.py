"""Forking gloo ranks on 127.0.0.1 for the tests that run NeMo-RL's distributed code on the CPU.

:func:`run_launch` forks ``launch['world']`` ranks of a target, each in a gloo group with the
others at the port it picks (:func:`join`), and fails (stopping the others) if one fails.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import socket
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import patience

#: Seconds a rank waits in a collective before gloo gives up (a hang fails instead of waiting;
#: generous: tests/patience.py).
COLLECTIVE_TIMEOUT = patience.COLLECTIVE_S


def free_port() -> int:
    return free_ports(1)[0]


#: below Linux's ephemeral range (32768-60999, what every outgoing connection and ``bind(0)``
#: draw from) and above Ray's worker ports (10002-19999): a port picked here and bound later
#: (a layout's group, a minute on) is not taken meanwhile by a Ray process's connection
#: (EADDRINUSE, seen once in CI)
PORTS = range(20000, 32000)


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports of :data:`PORTS` (their probes held open together)."""
    chosen: list[socket.socket] = []
    try:
        for port in random.Random().sample(PORTS, len(PORTS)):
            probe = socket.socket()
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                probe.close()
                continue
            chosen.append(probe)
            if len(chosen) == count:
                return [probe.getsockname()[1] for probe in chosen]
        raise RuntimeError(f"fewer than {count} free ports in {PORTS}")
    finally:
        for probe in chosen:
            probe.close()


def join(rank: int, world: int, port: int) -> None:
    """This rank's ``torch.distributed`` gloo group with the launch's other ranks."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=COLLECTIVE_TIMEOUT),
    )


def _rank(target: Any, rank: int, world: int, port: int, launch: dict, spec: dict, out: Path):
    """One forked rank: join the group, run ``target``, leave with the others; an error is
    printed and ends the rank with status 1 (:func:`run_launch` then stops the rest)."""
    import torch.distributed as dist

    try:
        join(rank, world, port)
        target(rank, world, launch, spec, out)
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


def run_launch(launch: dict, spec: dict, out: Path, target: Any) -> None:
    """Fork ``launch['world']`` ranks running ``target(rank, world, launch, spec, out)`` in one
    gloo group and wait; if one fails, stop the others and fail."""
    context = multiprocessing.get_context("fork")
    port = launch.get("port") or free_port()  # the launch's gloo group
    ranks = [
        context.Process(target=_rank, args=(target, rank, launch["world"], port, launch, spec, out))
        for rank in range(launch["world"])
    ]
    for process in ranks:
        process.start()
    while any(process.is_alive() for process in ranks):
        if any(process.exitcode not in (None, 0) for process in ranks):
            for process in ranks:
                if process.is_alive():
                    process.terminate()
            break
        time.sleep(0.05)
    for process in ranks:
        process.join()
    failed = [rank for rank, process in enumerate(ranks) if process.exitcode != 0]
    if failed:
        raise SystemExit(f"launch {launch['index']}: rank(s) {failed} failed (see above)")
