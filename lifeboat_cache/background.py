"""One bounded background writer: a queue bounded in bytes, worker threads, drop-when-full.

Writes that leave a caller's hot path (the store's copy to lower tiers, the MLX shim's chunk writes)
must never block that caller (SGLang's scheduler or its io threads) and never raise into it. So:

* ``offer`` only appends under a lock; a job that would take the queue past ``max_bytes`` (bytes
  queued *or being written*) is dropped and counted, never waited for. A dropped write is a later
  miss, never a wrong answer.
* ``max_bytes`` is a bound, not an allocation: the queue is a deque of the owner's jobs and a byte
  count; nothing is reserved, and a job's memory is let go once it is written (``done``).
* a job that raises is counted and logged (at most once per ``error_log_interval_s``, so a broken tier
  does not flood the log); the worker lives on, or the queue would fill for good.
* ``flush`` waits for the queue to empty (up to a timeout); ``close`` flushes, then drops and counts
  what is left, with one log line, and stops the workers without waiting on a stuck job for long.

The owner decides what a job is and how to write it (``handle``), and names the counters, so each
keeps its own stat names. Nothing here is global: every writer owns its queue, lock and threads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Generic, Sequence, TypeVar

from .cooldown import LogOnce, RateLimitedLog
from .cpu_policy import apply_to_this_thread
from .metrics import Counters

log = logging.getLogger(__name__)

J = TypeVar("J")

DROP_LOG_INTERVAL_S = 60.0
ERROR_LOG_INTERVAL_S = 60.0


@dataclass(frozen=True)
class WriterCounters:
    """Counter names a writer adds to (None: not counted). Drops count *parts* (see ``offer_prefix``)
    or jobs; errors count the jobs of a batch that raised; ``exit`` counts ``items(job)`` per job."""

    dropped_full: str | None = None
    dropped_full_bytes: str | None = None
    dropped_closed: str | None = None
    dropped_closed_bytes: str | None = None
    dropped_exit: str | None = None
    errors: str | None = None


class BoundedWriter(Generic[J]):
    """Bounded queue of jobs + worker threads that pass batches of them to ``handle``.

    ``handle(batch)`` runs on a worker thread with up to ``max_batch_jobs`` jobs (and, past the first,
    at most ``max_batch_bytes`` in all). ``done(batch)``, if given, runs after it on the same thread,
    whether it raised or not, before the batch stops counting as pending (so a ``flush`` that returned
    has seen every ``done``). ``items(job)`` is how many records a job holds, for the exit count.
    """

    def __init__(self, handle: Callable[[list[J]], None], counters: Counters, *, max_bytes: int,
                 names: WriterCounters, what: str, queue: str = "background", workers: int = 1,
                 name: str = "lifeboat-writer", policy: str = "normal",
                 max_batch_jobs: int = 1, max_batch_bytes: int | None = None,
                 done: Callable[[list[J]], None] | None = None, items: Callable[[J], int] | None = None,
                 drop_note: Callable[[], str] | None = None, exit_note: str = "",
                 join_timeout_s: float = 5.0, drop_log_interval_s: float = DROP_LOG_INTERVAL_S,
                 error_log_interval_s: float = ERROR_LOG_INTERVAL_S) -> None:
        if max_bytes < 0:
            raise ValueError(f"BoundedWriter: max_bytes={max_bytes}; give the queue bound in bytes, >= 0")
        if max_batch_jobs < 1:
            raise ValueError(f"BoundedWriter: max_batch_jobs={max_batch_jobs}; it must be at least 1")
        self.max_bytes = int(max_bytes)
        self.counters = counters
        self.names = names
        self.queue = queue  # for log lines: "<queue> queue full"
        self.what = what  # for log lines: "copies to nfs", "KV chunks" ("%d queued KV chunks were not ...")
        self._handle = handle
        self._policy = policy  # the workers' scheduling policy (cpu_policy.py); a refusal is logged once
        self._policy_log = LogOnce(log)
        self._done = done
        self._items = items or (lambda job: 1)
        self._drop_note = drop_note
        self._exit_note = exit_note
        self._max_batch_jobs = max_batch_jobs
        self._max_batch_bytes = max_batch_bytes
        self._join_timeout_s = join_timeout_s
        self._drop_log = RateLimitedLog(drop_log_interval_s, log)
        self._error_log = RateLimitedLog(error_log_interval_s, log)
        self._cv = threading.Condition()
        self._q: deque[tuple[J, int]] = deque()
        self._pending = 0  # bytes queued or being written
        self._busy = 0
        self._closed = False
        self._threads = [threading.Thread(target=self._run, name=f"{name}-{i}" if workers > 1 else name,
                                          daemon=True) for i in range(max(1, workers))]
        for t in self._threads:
            t.start()

    # ------------------------------------------------------------------ caller side (never blocks)
    @property
    def pending_bytes(self) -> int:
        """Bytes queued or being written."""
        return self._pending

    @property
    def closed(self) -> bool:
        return self._closed

    def room(self) -> int:
        """Bytes a job may have now and still be queued (a hint: read without the lock); 0 once closed."""
        return 0 if self._closed else max(0, self.max_bytes - self._pending)

    def offer(self, job: J, nbytes: int) -> bool:
        """Queue ``job`` (``nbytes`` against the bound); False when it was dropped (full or closed)."""
        return self.offer_prefix([nbytes], lambda n: job) == 1

    def offer_prefix(self, sizes: Sequence[int], make: Callable[[int], J]) -> int:
        """Queue the longest leading run of parts that fits, as one job ``make(n)``; returns ``n``.

        The parts after it are dropped and counted (a later chunk is useless without the earlier
        ones). ``make`` runs under the writer's lock, so the job is registered before a worker can
        take it; keep it cheap.
        """
        with self._cv:
            if self._closed:
                closed, take = True, 0
            else:
                closed = False
                room = self.max_bytes - self._pending
                take = used = 0
                while take < len(sizes) and used + sizes[take] <= room:
                    used += sizes[take]
                    take += 1
                if take:
                    self._q.append((make(take), used))
                    self._pending += used
                    self._cv.notify()
        if take < len(sizes):
            self.drop(len(sizes) - take, sum(sizes[take:]), closed=closed)
        return take

    def drop(self, parts: int, nbytes: int, *, closed: bool = False) -> None:
        """Count (and log, rate-limited) parts dropped unqueued; for owners that checked ``room`` first."""
        n = self.names
        name, bytes_name = (n.dropped_closed, n.dropped_closed_bytes) if closed else (n.dropped_full,
                                                                                       n.dropped_full_bytes)
        if name:
            self.counters.add(name, parts)
        if bytes_name:
            self.counters.add(bytes_name, nbytes)
        if not closed and self._drop_log.ready():
            note = self._drop_note() if self._drop_note is not None else ""
            log.warning("lifeboat: %s queue full (%d of %d MiB queued): dropping %s (%s dropped so far)%s",
                        self.queue, self._pending >> 20, self.max_bytes >> 20, self.what,
                        self.counters.get(name) if name else "some", f"; {note}" if note else "")

    # ------------------------------------------------------------------ workers
    def _take(self) -> list[tuple[J, int]] | None:
        with self._cv:
            while not self._q and not self._closed:
                self._cv.wait()
            if not self._q:
                return None
            batch = [self._q.popleft()]
            size = batch[0][1]
            cap = self._max_batch_bytes
            while self._q and len(batch) < self._max_batch_jobs and (cap is None or size + self._q[0][1] <= cap):
                item = self._q.popleft()
                batch.append(item)
                size += item[1]
            self._busy += 1
            return batch

    def _run(self) -> None:
        apply_to_this_thread(self._policy, self._policy_log)
        while True:
            batch = self._take()
            if batch is None:
                return
            jobs = [job for job, _ in batch]
            try:
                self._handle(jobs)
            except Exception as e:  # never into the caller, never out of the worker: count and go on
                if self.names.errors:
                    self.counters.add(self.names.errors, len(jobs))
                if self._error_log.ready():
                    log.error("lifeboat: background write of %s failed (%s); counted, further failures "
                              "logged at most every %.0f s", self.what, e, self._error_log.interval_s,
                              exc_info=True)
            finally:
                try:
                    if self._done is not None:
                        self._done(jobs)
                except Exception:
                    log.exception("lifeboat: %s writer cleanup failed", self.what)
                with self._cv:
                    self._pending -= sum(n for _, n in batch)
                    self._busy -= 1
                    self._cv.notify_all()

    # ------------------------------------------------------------------ flush / close
    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued job is written (or failed); False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while self._q or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def close(self, timeout: float | None = 30.0) -> bool:
        """Write what is queued within ``timeout`` seconds, then stop; True when nothing was left.

        Jobs still queued at the deadline are dropped and counted (``names.dropped_exit``, per
        item) with one log line; a job stuck in ``handle`` is waited for at most ``join_timeout_s``
        more (the workers are daemon threads). Later offers are dropped as closed.
        """
        t0 = time.monotonic()
        done = self.flush(timeout)
        with self._cv:
            self._closed = True
            left = list(self._q)
            self._q.clear()
            self._pending -= sum(n for _, n in left)
            self._cv.notify_all()
        if left:
            if self._done is not None:
                self._done([job for job, _ in left])
            items = sum(self._items(job) for job, _ in left)
            if self.names.dropped_exit:
                self.counters.add(self.names.dropped_exit, items)
            log.warning("lifeboat: %d queued %s were not written within %.1f s of shutdown%s", items, self.what,
                        time.monotonic() - t0, f"; {self._exit_note}" if self._exit_note else "")
        deadline = time.monotonic() + self._join_timeout_s
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        return done
