"""The MLX shim's background writer: evaluated numpy views in, ``store.put`` out, never blocking.

The gather and ``mx.eval`` run on the scheduler thread; the writer thread receives read-only numpy
*views of evaluated copies* and does only numpy and file I/O. The queue is bounded in bytes; when full,
chunks are dropped and counted (``mlx_chunks_dropped_queue_full``): recomputed next time, never wrong.
"""

from __future__ import annotations

import atexit
import functools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Sequence

import numpy as np

from ...background import BoundedWriter, WriterCounters

if TYPE_CHECKING:
    from ...store import ChunkStore

log = logging.getLogger(__name__)


@dataclass
class _Batch:
    ns: bytes
    keys: list[bytes]
    views: list[np.ndarray]
    keepalive: Any
    nbytes: int
    affinity: int | None = None
    enqueued: float = field(default_factory=time.perf_counter)
    kind: str = "chunks"  # counter family: mlx_<kind>_written


class ChunkWriter:
    """Background writer: numpy views in, ``store.put`` out, bounded in bytes, never blocks.

    ``offer`` runs on the scheduler thread and only appends to the queue of a
    :class:`~lifeboat_cache.background.BoundedWriter` (one worker thread); when the queue would exceed
    ``max_bytes`` the chunks that do not fit are dropped and counted (the earliest chunks of a
    request are kept, since later chunks are useless without them).
    """

    def __init__(self, store: "ChunkStore", max_bytes: int, *, name: str = "lifeboat-mlx-writer") -> None:
        self.store = store
        self.max_bytes = int(max_bytes)
        self.counters = store.counters
        self._lock = threading.Lock()
        self._pending: dict[bytes, int] = {}  # key -> batches holding it, queued or being written
        self._writer: BoundedWriter[_Batch] = BoundedWriter(
            self._write, self.counters, max_bytes=self.max_bytes, name=name, what="KV chunks", queue="MLX chunk write",
            names=WriterCounters(dropped_full="mlx_chunks_dropped_queue_full",
                                 dropped_closed="mlx_chunks_dropped_closed",
                                 dropped_exit="mlx_chunks_dropped_exit", errors="mlx_chunk_write_exceptions"),
            done=self._release, items=lambda b: len(b.keys), exit_note="they are recomputed next time",
            join_timeout_s=1.0)

    def offer(self, ns: bytes, keys: Sequence[bytes], views: Sequence[np.ndarray], keepalive: Any = None,
              *, affinity: int | None = None, kind: str = "chunks") -> int:
        """Queue chunks for writing; returns how many were accepted (a prefix of ``keys``).

        ``affinity`` is the dialog's drive choice (``ChunkStore.affinity_of`` over its first chunks).
        """
        sizes = [v.nbytes for v in views[:len(keys)]]

        def make(take: int) -> _Batch:  # under the writer's lock: pending before a worker can take it
            batch = _Batch(ns, list(keys[:take]), list(views[:take]), keepalive, sum(sizes[:take]), affinity,
                           kind=kind)
            with self._lock:
                for k in batch.keys:
                    self._pending[k] = self._pending.get(k, 0) + 1
            return batch

        take = self._writer.offer_prefix(sizes, make)
        if take:
            self.counters.add("mlx_chunks_enqueued", take)
        return take

    def is_pending(self, key: bytes) -> bool:
        with self._lock:
            return key in self._pending

    def queued_bytes(self) -> int:
        return self._writer.pending_bytes

    def room(self) -> int:
        """Bytes an offer may have now and still be queued whole (a hint; 0 once closed)."""
        return self._writer.room()

    def drop(self, chunks: int, nbytes: int) -> None:
        """Count chunks dropped before they were offered (the queue had no room for them)."""
        self._writer.drop(chunks, nbytes, closed=self._writer.closed)

    def _write(self, batches: list[_Batch]) -> None:
        for batch in batches:
            ok: list[bool] = [False] * len(batch.keys)
            try:  # the store only raises for caller bugs; the BoundedWriter counts and logs that
                ok = self.store.put(batch.ns, batch.keys, batch.views, affinity=batch.affinity)
            finally:
                n_ok = sum(ok)
                self.counters.add(f"mlx_{batch.kind}_written", n_ok)
                if n_ok < len(ok):
                    self.counters.add(f"mlx_{batch.kind}_write_failed", len(ok) - n_ok)

    def _release(self, batches: list[_Batch]) -> None:
        """After a write (or a drop at close): the keys stop being pending, the views are let go."""
        with self._lock:
            for batch in batches:
                for k in batch.keys:
                    left = self._pending.get(k, 1) - 1
                    if left <= 0:
                        self._pending.pop(k, None)
                    else:
                        self._pending[k] = left
                batch.views.clear()
                batch.keepalive = None

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued chunk is written (tests, demo, shutdown). False on timeout."""
        return self._writer.flush(timeout)

    def close(self, timeout: float | None = 30.0) -> bool:
        """Write what is queued within ``timeout`` seconds, then stop; True when nothing was left.

        Chunks still queued at the deadline are dropped and counted (``mlx_chunks_dropped_exit``),
        with one log line: they are recomputed next time, never served wrong.
        """
        return self._writer.close(timeout)


class Drainable(Protocol):
    """What `drain_at_exit` closes: an `MlxChunkEngine` (or its `ChunkWriter`). A protocol, so this module
    need not import the engine, which imports it."""

    def close(self, timeout: float | None = 30.0) -> Any: ...


def drain_at_exit(engine: Drainable, timeout_s: float) -> None:
    """Close ``engine`` (drain its writer within ``timeout_s``) at a clean interpreter exit.

    Registered with ``threading``'s exit hooks, which run before ``atexit`` and, being registered
    later, before ``concurrent.futures`` stops taking work: the store's io pool is still there while
    the queue drains (plain ``atexit`` ran after it and every multi-chunk write failed with "cannot
    schedule new futures after interpreter shutdown").
    """
    fn = functools.partial(engine.close, timeout_s)
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise RuntimeError("no threading exit hooks")
        register(fn)
    except RuntimeError:
        atexit.register(fn)
