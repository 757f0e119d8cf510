"""The store's io worker threads: batch calls that return by a deadline, and a gate for late tasks.

Why not `ThreadPoolExecutor`: a tier that hangs (an S3 server that accepts and never answers, a
frozen NFS server) parks worker threads in a syscall. A fixed pool would then queue every later
call behind them. `IoWorkers` keeps `workers` threads and adds one for each thread stuck in a task for
longer than `stuck_s` (the deadline), up to `max_workers` (a bound, so a long hang cannot spawn
threads without end); extra threads exit after `IDLE_EXIT_S` idle. A big batch on healthy tiers
never grows the pool. Threads that outlive their call's deadline are counted (`io_overdue`).

`TaskArena` gives io tasks byte buffers reused from task to task (sealed records built for a write,
records read into private buffers): a fresh multi-MiB buffer per page costs its page faults every
time (measured: AES-GCM into fresh 768 KiB buffers 2.1-2.5 GB/s per core, into reused ones 6.8).

`Gate` protects the caller's buffers: SGLang reuses a page buffer as soon as a call returns with a
miss, so a task that finishes after the deadline must not write into it (reads), nor read from it
(writes). Each page passes the gate before touching caller memory; at the deadline the caller closes
it, waits briefly for pages already inside, and every later task finds it closed.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..cooldown import LogOnce
from ..cpu_policy import apply_to_this_thread
from ..metrics import Counters

log = logging.getLogger(__name__)

IDLE_EXIT_S = 30.0  # an extra thread (above `workers`) exits after this long without work

_PENDING, _INSIDE, _DONE, _CLOSED = 0, 1, 2, 3


class Gate:
    """Per-call guard over the caller's page buffers (one slot per page)."""

    def __init__(self, n: int) -> None:
        self._lock = threading.Lock()
        self._state = [_PENDING] * n
        self._closed = False

    def enter(self, i: int) -> bool:
        """Take slot i before touching the caller's buffers; False once the call has returned."""
        with self._lock:
            if self._state[i] != _PENDING:
                return False
            self._state[i] = _INSIDE
            return True

    def leave(self, i: int, done: bool = True) -> None:
        """Give slot i back. `done=False`: nothing usable landed in the caller's buffers (a refused record),
        so the slot may be entered again, by the read of the same page from the next tier."""
        with self._lock:
            if self._state[i] == _INSIDE:
                self._state[i] = _DONE if done else (_CLOSED if self._closed else _PENDING)

    def close(self) -> list[int]:
        """Close every slot not entered yet; returns the slots still inside (to wait for)."""
        with self._lock:
            self._closed = True
            inside = [i for i, s in enumerate(self._state) if s == _INSIDE]
            self._state = [_CLOSED if s == _PENDING else s for s in self._state]
        return inside

    @property
    def closed(self) -> bool:
        """True once the call has returned (no slot may be entered any more)."""
        return self._closed

    def inside(self) -> list[int]:
        with self._lock:
            return [i for i, s in enumerate(self._state) if s == _INSIDE]


_FREE: list[np.ndarray] = []  # arena buffers between tasks, shared by every store and io thread
_FREE_LOCK = threading.Lock()
FREE_MAX_BYTES = 256 << 20  # kept between tasks at most (process-wide); more is freed


class TaskArena:
    """Byte buffers reused from task to task: inside `with arena.task():` an io task `take(n)`s slices
    of one buffer, which goes back to a process-wide free list when the task ends, so a new store's
    threads start warm too. Invariant: a slice never outlives the task that took it (it is written
    out, or read and decoded, before the task returns; anything kept longer is copied, as the copier
    does). `take` outside a task returns a one-off buffer.
    """

    ALIGN = 64
    MIN_BYTES = 1 << 20
    MAX_BYTES = 64 << 20  # one task's buffer at most; a task that needs more gets one-off buffers past it

    def __init__(self) -> None:
        self._local = threading.local()

    @contextmanager
    def task(self) -> Iterator["TaskArena"]:
        st = self._local
        st.active, st.buf, st.pos = True, None, 0
        try:
            yield self
        finally:
            buf, st.buf, st.active = st.buf, None, False
            if buf is not None:
                with _FREE_LOCK:
                    if sum(b.nbytes for b in _FREE) + buf.nbytes <= FREE_MAX_BYTES:
                        _FREE.append(buf)

    def take(self, n: int) -> np.ndarray:
        """n bytes (uint8, uninitialised) of this task's buffer (a one-off buffer past MAX_BYTES)."""
        st = self._local
        if not getattr(st, "active", False):
            return np.empty(n, dtype=np.uint8)
        buf, pos = st.buf, st.pos
        if buf is None:
            with _FREE_LOCK:
                if _FREE:
                    _FREE.sort(key=lambda b: b.nbytes)
                    buf = _FREE.pop()  # the largest
        if buf is None or pos + n > buf.nbytes:
            size = max(self.MIN_BYTES, 2 * buf.nbytes if buf is not None else 0, pos + n)
            if size > self.MAX_BYTES:
                if buf is not None and st.buf is None:
                    st.buf = buf  # keep what came from the free list, hand this request a one-off
                return np.empty(n, dtype=np.uint8)
            buf, pos = np.empty(size, dtype=np.uint8), 0  # slices of the old buffer keep it alive
        st.buf, st.pos = buf, pos + -(-n // self.ALIGN) * self.ALIGN
        return buf[pos: pos + n]


class IoWorkers:
    """Elastic, bounded set of io threads (see the module docstring)."""

    def __init__(self, workers: int, *, max_workers: int, counters: Counters, stuck_s: float = 2.0,
                 name: str = "lifeboat-io", policy: str = "normal",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.workers = max(1, workers)
        self.clock = clock  # deadlines and stuck threads: may stand still while the process does (gc_pauses.py)
        self.policy = policy  # each thread's scheduling policy (cpu_policy.py)
        self.stuck_s = stuck_s
        self._started: dict[int, float] = {}  # thread ident -> when its current task started
        self.max_workers = max(self.workers, max_workers)
        self.counters = counters
        self.name = name
        self._q: queue.SimpleQueue[tuple[Future, Callable[..., Any], tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._exited = threading.Condition(self._lock)  # notified as each thread exits (shutdown waits on it)
        self._threads = 0
        self._idle = 0
        self._seq = 0
        self._shutdown = False
        self._capped = LogOnce(log)  # one line while every thread is busy; again after one idled

    @property
    def threads(self) -> int:
        return self._threads

    @property
    def busy(self) -> int:
        return self._threads - self._idle

    def stuck(self) -> int:
        """Threads in one task for longer than stuck_s (a hung tier holds them)."""
        now = self.clock()
        with self._lock:
            return sum(1 for t in self._started.values() if now - t > self.stuck_s)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        if self._shutdown:
            raise RuntimeError("IoWorkers is shut down")
        fut: Future = Future()
        self._q.put((fut, fn, args))
        with self._lock:
            now = self.clock()
            stuck = sum(1 for t in self._started.values() if now - t > self.stuck_s)
            # one more thread while the queued tasks outnumber the idle threads (an idle thread that has
            # not taken its task yet still counts as idle: a burst submitted to one idle thread would
            # otherwise run on it alone, one task after another)
            spawn = self._q.qsize() > self._idle and self._threads < min(self.max_workers, self.workers + stuck)
            if self._idle > 0:
                self._capped.reset("capped")
            if spawn:
                self._threads += 1
                self._seq += 1
                seq = self._seq
            elif self._idle == 0 and stuck:
                self._capped.log("capped", "lifeboat: all %d io threads are busy (a tier hangs?); calls wait for "
                                 "their deadline", self._threads)
        if spawn:
            threading.Thread(target=self._run, name=f"{self.name}-{seq}", daemon=True).start()
        return fut

    def _run(self) -> None:
        apply_to_this_thread(self.policy, self._capped)
        while True:
            with self._lock:
                self._idle += 1
            try:
                item = self._q.get(timeout=IDLE_EXIT_S)
            except queue.Empty:
                item = ()  # type: ignore[assignment]
            with self._lock:
                self._idle -= 1
                if item == () and self._threads > self.workers:
                    self._threads -= 1
                    self._exited.notify_all()
                    return
            if item == ():
                continue
            if item is None:
                with self._lock:
                    self._threads -= 1
                    self._exited.notify_all()
                return
            fut, fn, args = item
            if not fut.set_running_or_notify_cancel():
                continue
            me = threading.get_ident()
            with self._lock:
                self._started[me] = self.clock()
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - handed to the caller through the future
                fut.set_exception(e)
            finally:
                with self._lock:
                    self._started.pop(me, None)

    def run_until(self, fn: Callable[[int], Any], items: Sequence[int], t_end: float, gate: Gate,
                  grace_s: float) -> tuple[list[Future], list[int]]:
        """Run fn(i) for every item; return at t_end at the latest (plus up to grace_s for pages
        already inside the gate). Returns (futures, positions not done when the call returned).
        t_end is on `self.clock`, which may stand still while the whole process does."""
        futs = [self.submit(fn, i) for i in items]
        while True:
            _, not_done = wait_futures(futs, timeout=max(0.0, t_end - self.clock()))
            if not not_done:
                return futs, []
            if t_end - self.clock() <= 0.001:
                break  # else the process stood still meanwhile: the deadline moved on, wait out the rest
        for f in not_done:
            f.cancel()  # not started yet: never runs
        inside = gate.close()
        if inside:
            pos = {item: k for k, item in enumerate(items)}
            wait_futures([futs[pos[i]] for i in inside if i in pos], timeout=grace_s)
        late = [k for k, f in enumerate(futs) if f in not_done and (f.cancelled() or not f.done())]
        self.counters.add("io_overdue", sum(1 for f in futs if not f.done()))  # threads still stuck
        return futs, late

    def shutdown(self, wait: bool = True, timeout: float = 10.0) -> None:
        """Stop the threads; with wait, join those not stuck (up to timeout)."""
        self._shutdown = True
        with self._lock:
            n = self._threads
        for _ in range(n):
            self._q.put(None)
        if wait:
            # woken as each thread exits: a close waits for the last one, not for a polling tick (10 ms
            # was a tenth of closing a 100 MiB write)
            with self._exited:
                self._exited.wait_for(lambda: self._threads == 0, timeout=timeout)
