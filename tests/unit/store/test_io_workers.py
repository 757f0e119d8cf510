"""IoWorkers and Gate: calls return by their deadline, the pool grows only for stuck threads and stays
bounded, and a task that outlives its call never enters the gate."""

from __future__ import annotations

import threading
import time

import numpy as np

from lifeboat_cache.metrics import Counters
from lifeboat_cache.store.io_workers import Gate, IoWorkers


def test_big_batch_on_healthy_work_never_grows_the_pool() -> None:
    pool = IoWorkers(2, max_workers=8, counters=Counters(), stuck_s=1.0)
    futs, late = pool.run_until(lambda i: time.sleep(0.01) or i, list(range(20)), time.monotonic() + 5, Gate(20), 0.1)
    assert late == [] and [f.result() for f in futs] == list(range(20))
    assert pool.threads <= 2
    pool.shutdown()


def test_a_burst_after_a_quiet_spell_runs_on_every_worker() -> None:
    """One thread idle from an earlier call: a burst of tasks that each wait for all the others must
    get its own threads (taken one after another by the idle thread, it would never finish)."""
    pool = IoWorkers(4, max_workers=8, counters=Counters(), stuck_s=5.0)
    pool.run_until(lambda i: i, [0], time.monotonic() + 5, Gate(1), 0.1)
    assert pool.threads == 1
    together = threading.Barrier(4, timeout=3)
    futs, late = pool.run_until(lambda i: together.wait() >= 0, list(range(4)), time.monotonic() + 5, Gate(4), 0.1)
    assert late == [] and all(f.result() for f in futs), "the burst ran on fewer threads than workers"
    assert pool.threads == 4
    pool.shutdown()


def test_stuck_threads_are_replaced_up_to_the_bound_and_counted() -> None:
    counters = Counters()
    pool = IoWorkers(2, max_workers=4, counters=counters, stuck_s=0.1)
    release = threading.Event()
    for _ in range(6):  # more hung tasks than the bound
        pool.submit(release.wait)
        time.sleep(0.15)
    assert pool.threads == 4 and pool.stuck() == 4
    t0 = time.monotonic()
    futs, late = pool.run_until(lambda i: i, [0, 1], time.monotonic() + 0.3, Gate(2), 0.1)
    assert time.monotonic() - t0 < 0.6  # bounded by the deadline even with every thread stuck
    assert late == [0, 1] and all(f.cancelled() for f in futs)
    assert pool.threads <= 4
    release.set()
    pool.shutdown()


def test_gate_closes_pending_slots_and_reports_those_inside() -> None:
    g = Gate(3)
    assert g.enter(0)
    g.leave(0)
    assert g.enter(1)  # inside when the call returns
    assert g.close() == [1] and g.closed
    assert not g.enter(2)  # a late task never touches the caller's buffer
    g.leave(1)
    assert g.inside() == []


def test_task_arena_slices_never_overlap_within_a_task_and_are_reused_by_the_next_task() -> None:
    from lifeboat_cache.store.io_workers import TaskArena

    a, b = TaskArena(), TaskArena()  # two stores: their tasks share the free buffers
    with a.task():
        x, y = a.take(1000), a.take(3 << 20)  # the second one outgrows the first buffer: a new one
        x[:] = 1
        y[:] = 2
        assert (x == 1).all() and (y == 2).all()
    with b.task():
        z = b.take(3 << 20)
        assert np.shares_memory(z, y)  # the next task reuses the buffer: no fresh page faults
        big = b.take(TaskArena.MAX_BYTES + 1)  # past the bound: a one-off buffer, not kept
        assert not np.shares_memory(big, z)
    outside = a.take(100)  # outside a task: a one-off buffer
    assert outside.nbytes == 100
