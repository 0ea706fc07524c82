"""A clear error, not a hang, when a Ray node dies under a run or the run stops making progress.

NeMo-RL's ``async_grpo_train`` waits for its replay buffer without a deadline, and its
trajectory collector prints and swallows the errors of the generation and environment calls
that would have filled it; NeMo-RL's ``MathEnvironment`` restarts without limit
(``max_restarts=-1``), so an environment placed on a node that died waits for that node to come
back. A node lost under an async run would leave the driver waiting forever; so would a step
the collector never generates (a race in NeMo-RL's collector: see the driver).

:func:`watch_nodes` reads Ray's node table (``ray.nodes()``, from the GCS) every ``period``
seconds in a thread, and asks ``stalled()`` (when given) whether the run has stopped making
progress. When a node that was alive when the block started is no longer alive
(:class:`NodeDiedError`), or ``stalled()`` returns a message (:class:`TrainingStalledError`),
it interrupts the main thread the way Ctrl-C does (a ``SIGINT`` to that thread, whose Python
handler is replaced for the block), and the block raises that error. The interrupt is a
``KeyboardInterrupt``: inside ``ray.get`` Ray turns only that into an exception at once
(another exception raised by a signal handler there is swallowed until the call returns, which
for a call waiting on a dead node is never: seen in ``test_ray_nodes.py``, 2026-11-24). NeMo-RL's
``except Exception`` clauses let it through and its ``finally`` clean-up runs; if the
block has not ended ``cleanup_grace`` seconds after an interrupt was delivered (a clean-up call
waiting on the dead node), it is interrupted again. A real Ctrl-C still reaches the previous
handler.
"""

from __future__ import annotations

import _thread
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from nemo_mmpo.errors import NodeDiedError, TrainingStalledError

#: Ray's own resources, left out of a node's description (the custom ones say what it was for).
_RAY_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory", "node:", "accelerator_type:")


class WatchInterrupt(KeyboardInterrupt):
    """What the watch raises in the main thread; the block turns it into the error it names."""


def describe(node: dict[str, Any]) -> str:
    """``<id> (<address>, resources a, b)`` for a row of ``ray.nodes()``."""
    custom = sorted(
        name for name in node.get("Resources", {}) if not name.startswith(_RAY_RESOURCES)
    )
    resources = f", resources {', '.join(custom)}" if custom else ""
    return f"{node['NodeID'][:12]} ({node.get('NodeManagerAddress', '?')}{resources})"


def interrupt_main_thread() -> None:
    """A real ``SIGINT`` to the main thread where the platform can direct one (it also ends a
    blocking system call there, such as a ``time.sleep``), else Python's simulated one."""
    if hasattr(signal, "pthread_kill"):
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
    else:
        _thread.interrupt_main(signal.SIGINT)


class _Watch:
    """The state of one :func:`watch_nodes` block: the nodes watched, what failed, and the
    thread that polls Ray's node table and ``stalled()``."""

    def __init__(
        self,
        watched: dict[str, dict[str, Any]],
        period: float,
        stalled: Callable[[], str | None] | None,
        cleanup_grace: float,
    ) -> None:
        self.watched = watched
        self.period = period
        self.stalled = stalled
        self.cleanup_grace = cleanup_grace
        self.lost: list[dict[str, Any]] = []
        self.stall: list[str] = []
        self.delivered: list[float] = []  # when the handler raised the interrupt
        self.done = threading.Event()
        self.previous = signal.getsignal(signal.SIGINT)

    def failed(self) -> bool:
        return bool(self.lost or self.stall)

    def error(self) -> RuntimeError:
        if self.lost:
            names = "; ".join(describe(node) for node in self.lost)
            return NodeDiedError(f"Ray node {names} died during training")
        return TrainingStalledError(self.stall[0])

    def on_interrupt(self, signum: int, frame: Any) -> None:
        """The ``SIGINT`` handler for the block: our interrupt, or a real Ctrl-C."""
        if self.failed() and self.done.is_set():
            return  # a late interrupt: the block is ending, and raises the error itself
        if self.failed():
            self.delivered.append(time.monotonic())
            raise WatchInterrupt(str(self.error()))
        if callable(self.previous):  # a real Ctrl-C: what it did before the block
            self.previous(signum, frame)
        else:
            raise KeyboardInterrupt

    def check(self, alive_nodes: Callable[[], set[str]]) -> None:
        """One poll: record lost nodes and a stall (once something failed, nothing more)."""
        if not self.failed():
            try:
                alive = alive_nodes()
            except Exception:  # the GCS did not answer this time; ask again
                return
            self.lost.extend(node for key, node in self.watched.items() if key not in alive)
        if not self.failed() and self.stalled is not None:
            message = self.stalled()
            if message:
                self.stall.append(message)

    def run(self, alive_nodes: Callable[[], set[str]]) -> None:
        """The thread: poll every ``period`` seconds; interrupt the main thread on a failure,
        again after ``cleanup_grace`` seconds if the block has not ended."""
        while not self.done.wait(self.period):
            self.check(alive_nodes)
            if self.failed() and not self.done.is_set():
                if (
                    not self.delivered
                    or time.monotonic() - self.delivered[-1] >= self.cleanup_grace
                ):
                    interrupt_main_thread()


@contextmanager
def watch_nodes(
    period: float = 1.0,
    stalled: Callable[[], str | None] | None = None,
    cleanup_grace: float = 20.0,
) -> Iterator[None]:
    """Raise :class:`NodeDiedError` in the block as soon as a Ray node that was alive when it
    started has died (within about ``period`` seconds of Ray's GCS marking it dead), and
    :class:`TrainingStalledError` as soon as ``stalled()`` returns a message.

    Must be entered from the main thread (Python runs signal handlers there); elsewhere the
    block runs unwatched.
    """
    import ray

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    state = _Watch(
        {node["NodeID"]: node for node in ray.nodes() if node["Alive"]},
        period,
        stalled,
        cleanup_grace,
    )

    def alive_nodes() -> set[str]:
        return {node["NodeID"] for node in ray.nodes() if node["Alive"]}

    signal.signal(signal.SIGINT, state.on_interrupt)
    thread = threading.Thread(
        target=state.run, args=(alive_nodes,), name="nemo-mmpo-node-watch", daemon=True
    )
    thread.start()
    try:
        yield
    except (NodeDiedError, TrainingStalledError):
        raise
    except BaseException:  # the interrupt (ours, or Ray's KeyboardInterrupt from
        # ray.get), or another error on the way (a dead actor's): the node's error
        if state.failed():
            raise state.error() from None
        raise
    finally:
        state.done.set()
        thread.join(timeout=period + 10)
        # signal.signal runs a simulated SIGINT still pending (with our handler, which does
        # nothing once done is set) before it puts the previous handler back
        signal.signal(signal.SIGINT, state.previous)
    if state.failed():  # the block caught the interrupt and returned
        raise state.error()
