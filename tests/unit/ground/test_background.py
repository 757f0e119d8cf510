"""BoundedWriter: drops when full (exact counts), close drains, close gives up on a stuck job in time,
a job that raises is counted and logged without killing the worker or reaching the caller."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from lifeboat_cache.background import BoundedWriter, WriterCounters
from lifeboat_cache.metrics import Counters

NAMES = WriterCounters(dropped_full="full", dropped_full_bytes="full_bytes", dropped_closed="closed",
                       dropped_exit="exit", errors="errors")


class Gated:
    """A handler that blocks until released, recording every batch it was given."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.started = threading.Event()
        self.batches: list[list[str]] = []

    def __call__(self, batch: list[str]) -> None:
        self.started.set()
        assert self.gate.wait(10), "test handler never released"
        self.batches.append(list(batch))


def _writer(handle, counters: Counters, **kw) -> BoundedWriter[str]:
    kw.setdefault("max_bytes", 100)
    return BoundedWriter(handle, counters, names=NAMES, what="test jobs", **kw)


def test_drops_when_full_with_exact_counts_and_never_blocks() -> None:
    c = Counters()
    h = Gated()
    w = _writer(h, c, max_bytes=100)
    try:
        assert w.offer("a", 40)
        assert h.started.wait(5)  # "a" is being written: its bytes still count against the bound
        assert w.offer("b", 40)
        t0 = time.monotonic()
        assert not w.offer("c", 30)  # 40 + 40 + 30 > 100
        assert not w.offer("d", 21)
        assert w.offer("e", 20)  # exactly full
        assert not w.offer("f", 1)
        assert time.monotonic() - t0 < 0.5  # drops return at once while the worker is stuck
        assert w.pending_bytes == 100
        assert c.get("full") == 3 and c.get("full_bytes") == 30 + 21 + 1
        # a prefix offer takes the leading parts that fit and counts each part left out
        h.gate.set()
        assert w.flush(5)
        assert w.pending_bytes == 0
        assert [j for b in h.batches for j in b] == ["a", "b", "e"]
        h.gate.clear()
        h.started.clear()
        assert w.offer("g", 90)
        assert h.started.wait(5)
        made: list[int] = []
        assert w.offer_prefix([5, 4, 3], lambda n: made.append(n) or f"p{n}") == 2
        assert made == [2]
        assert c.get("full") == 4 and c.get("full_bytes") == 52 + 3
        h.gate.set()
        assert w.flush(5)
        assert h.batches[-1] == ["p2"]
    finally:
        h.gate.set()
        w.close(5)


def test_batches_respect_job_and_byte_caps() -> None:
    c = Counters()
    h = Gated()
    w = _writer(h, c, max_bytes=1000, max_batch_jobs=3, max_batch_bytes=25)
    try:
        assert w.offer("x", 1)
        assert h.started.wait(5)  # the first job alone; the rest queue up behind it
        for i in range(5):
            assert w.offer(f"j{i}", 10)
        h.gate.set()
        assert w.flush(5)
        assert h.batches == [["x"], ["j0", "j1"], ["j2", "j3"], ["j4"]]  # 2 x 10 <= 25 < 3 x 10
    finally:
        h.gate.set()
        w.close(5)


def test_close_drains_everything_queued() -> None:
    c = Counters()
    written: list[str] = []
    released: list[str] = []

    def slow(batch: list[str]) -> None:
        time.sleep(0.01)
        written.extend(batch)

    w = _writer(slow, c, max_bytes=10_000, done=released.extend)
    for i in range(20):
        assert w.offer(f"j{i}", 10)
    assert w.close(10) is True
    assert written == [f"j{i}" for i in range(20)]
    assert released == written
    assert c.get("exit") == 0 and w.pending_bytes == 0
    assert not w.offer("late", 1)  # closed: dropped and counted as such, not as full
    assert c.get("closed") == 1 and c.get("full") == 0
    assert all(not t.is_alive() for t in w._threads)


def test_close_times_out_on_a_stuck_job_and_counts_what_it_drops(caplog: pytest.LogCaptureFixture) -> None:
    c = Counters()
    h = Gated()
    released: list[str] = []
    w = _writer(h, c, max_bytes=1000, done=released.extend, items=lambda job: 2, join_timeout_s=0.2)
    try:
        assert w.offer("stuck", 10)
        assert h.started.wait(5)
        for i in range(3):
            assert w.offer(f"q{i}", 10)
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="lifeboat_cache.background"):
            assert w.close(0.3) is False
        took = time.monotonic() - t0
        assert 0.3 <= took < 2.0  # the flush timeout plus at most the join timeout
        assert c.get("exit") == 3 * 2  # items per dropped job
        assert released == ["q0", "q1", "q2"]  # dropped jobs are released too
        assert w.pending_bytes == 10  # only the stuck job's bytes
        lines = [r.getMessage() for r in caplog.records if "were not written within" in r.getMessage()]
        assert len(lines) == 1 and lines[0].startswith("lifeboat: 6 queued test jobs were not written")
    finally:
        h.gate.set()
    w._threads[0].join(5)
    assert not w._threads[0].is_alive()
    assert h.batches == [["stuck"]]  # the stuck job finished; nothing queued ran after close
    assert w.pending_bytes == 0


def test_a_failing_job_is_counted_logged_once_and_the_worker_lives(caplog: pytest.LogCaptureFixture) -> None:
    c = Counters()
    written: list[str] = []
    released: list[str] = []

    def handle(batch: list[str]) -> None:
        if batch[0].startswith("bad"):
            raise RuntimeError(f"boom {batch[0]}")
        written.extend(batch)

    w = _writer(handle, c, max_bytes=1000, done=released.extend, error_log_interval_s=60.0)
    with caplog.at_level(logging.ERROR, logger="lifeboat_cache.background"):
        for job in ("bad1", "ok1", "bad2", "ok2"):
            assert w.offer(job, 1)  # the caller never sees the exception
        assert w.flush(5)
    assert written == ["ok1", "ok2"]  # the worker went on after each failure
    assert released == ["bad1", "ok1", "bad2", "ok2"]  # done() runs for failed batches too
    assert c.get("errors") == 2
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "boom bad1" in errors[0].getMessage()  # once per cooldown
    assert w.close(5) is True


def test_bad_bounds_name_the_field() -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        BoundedWriter(lambda b: None, Counters(), max_bytes=-1, names=NAMES, what="x")
    with pytest.raises(ValueError, match="max_batch_jobs"):
        BoundedWriter(lambda b: None, Counters(), max_bytes=1, names=NAMES, what="x", max_batch_jobs=0)
