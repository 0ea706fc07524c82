"""The Megatron worker's CPU answer for the garbage collector (``megatron_shims``): once the
worker is built, what it holds is frozen, so NeMo-RL's ``gc.collect()`` calls in every step
walk only what was made since. The worker's own code runs unchanged."""

from __future__ import annotations

import gc

from nemo_mmpo.cpu.answers import megatron_shims


class Worker:
    def __init__(self, size: int) -> None:
        self.held = [[index] for index in range(size)]


def test_a_built_worker_freezes_what_it_holds_and_later_garbage_is_still_collected():
    built = megatron_shims._frozen_once_built(Worker.__init__)
    assert built._nemo_mmpo_cpu and built.__name__ == "__init__"
    gc.unfreeze()
    try:
        worker = object.__new__(Worker)
        built(worker, 5000)
        assert [row[0] for row in worker.held] == list(range(5000))  # __init__ ran as written
        assert gc.get_freeze_count() >= 5000  # the lists it made are frozen
        cycle = [worker]
        cycle.append(cycle)  # garbage made after the freeze: a collection still finds it
        del cycle
        assert gc.collect() >= 1
    finally:
        gc.unfreeze()
