"""MlxChunkEngine: store + writer + reader + prefetch for one model, what the SGLang radix cache calls."""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from .fingerprint import ModelFingerprint
from .keys import chain_seed, chunk_keys, tail_key
from .reader import ChunkRead, ChunkReader, PrefetchTable, RowBuffers
from .transfer import (
    PoolLayout, gather_chunks, gather_request_chunks, install_rows, numpy_view, prepare_pool, settle_pool)
from .writer import ChunkWriter

if TYPE_CHECKING:
    import mlx.core as mx

    from ...store import ChunkStore

log = logging.getLogger(__name__)


class RequestPathClock:
    """Accumulates seconds spent on the scheduler thread by LifeboatCache (for the overhead report)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.totals: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def add(self, what: str, seconds: float) -> None:
        with self._lock:
            self.totals[what] = self.totals.get(what, 0.0) + seconds
            self.counts[what] = self.counts.get(what, 0) + 1

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            out = {f"{k}_seconds": v for k, v in self.totals.items()}
            out.update({f"{k}_calls": float(v) for k, v in self.counts.items()})
            return out


class MlxChunkEngine:
    """Store + writer + reader + prefetch for one model: what the SGLang radix cache calls.

    Owns nothing of SGLang. Threading: ``capture`` and ``install`` run on the pool-owning (scheduler)
    thread; the writer and the readers never touch MLX.
    """

    def __init__(self, store: "ChunkStore", fingerprint: ModelFingerprint, *, queue_bytes: int,
                 prefetch_bytes: int | None = None, idle_read_bytes: int | None = None, read_workers: int = 2,
                 owns_store: bool = True) -> None:
        """``queue_bytes`` bounds the writer's queue (see ``queue_size.writer_queue_size``);
        ``prefetch_bytes`` the reads started at arrival and ``idle_read_bytes`` the staging buffers kept
        for reuse between restores (both default to ``queue_bytes``)."""
        self.store = store
        self.fp = fingerprint
        self.ns = fingerprint.namespace()
        self.state_ns = fingerprint.state_namespace()
        self.tail_ns = fingerprint.tail_namespace()
        self.chunk = fingerprint.chunk_tokens
        self.writer = ChunkWriter(store, queue_bytes)
        read_bytes = prefetch_bytes if prefetch_bytes is not None else queue_bytes
        self.buffers = RowBuffers(fingerprint, max_idle_bytes=read_bytes if idle_read_bytes is None
                                  else idle_read_bytes)
        self.reader = ChunkReader(store, fingerprint, workers=read_workers, buffers=self.buffers)
        self.prefetches = PrefetchTable(read_bytes)
        self._layout: tuple[Any, PoolLayout] | None = None  # (weakref to the pool, what installs need)
        self.clock = RequestPathClock()
        self.counters = store.counters
        self._owns_store = owns_store
        self._closed = False
        self.reporter: Any = None  # a StatsReporter (stats file, Prometheus) when serving

    # -------------------------------------------------------------- keys
    def seed(self, extra_key: str | None = None, cache_salt: str | None = None) -> bytes:
        return chain_seed(self.ns, extra_key, cache_salt)

    def keys(self, seed: bytes, tokens: Sequence[int] | np.ndarray, n_chunks: int) -> list[bytes]:
        return chunk_keys(seed, tokens, n_chunks, self.chunk)

    def affinity(self, keys: Sequence[bytes]) -> int | None:
        """Drive choice of a dialog from its first chunk keys (chunk 0 onwards)."""
        fn = getattr(self.store, "affinity_of", None)
        return fn(self.ns, list(keys)) if fn is not None and keys else None

    # -------------------------------------------------------------- writes (scheduler thread)
    def missing(self, keys: Sequence[bytes]) -> list[int]:
        """Indices of keys neither stored nor waiting in the writer's queue (index only, no I/O)."""
        present = self.store.contains(self.ns, list(keys)) if keys else []
        return [i for i, (k, p) in enumerate(zip(keys, present)) if not p and not self.writer.is_pending(k)]

    def capture(self, pool: Any, chunk_slots: Sequence[np.ndarray], keys: Sequence[bytes],
                affinity: int | None = None) -> int:
        """Copy chunks out of the pool (gather + eval here) and queue them; returns chunks queued."""
        fit = queued = self._fitting(len(keys))
        if fit:
            t0 = time.perf_counter()
            settle_pool(pool)  # SGLang's deferred pool writes: work it would do anyway, timed apart
            t1 = time.perf_counter()
            self.clock.add("pool_settle", t1 - t0)
            kv = gather_chunks(pool, np.concatenate(list(chunk_slots)[:fit]), self.chunk)
            queued = self._queue(kv, keys[:fit], affinity, t1)
        return self._count_unfit(len(keys), fit, queued)

    def capture_from_request(self, layer_caches: Sequence[Any], chunk_ids: Sequence[int],
                             keys: Sequence[bytes], affinity: int | None = None) -> int:
        """Copy chunks out of a request's own KV caches (see :func:`gather_request_chunks`) and queue them."""
        fit = queued = self._fitting(len(keys))
        if fit:
            t0 = time.perf_counter()
            kv = gather_request_chunks(layer_caches, list(chunk_ids)[:fit], self.chunk)
            queued = self._queue(kv, keys[:fit], affinity, t0)
        return self._count_unfit(len(keys), fit, queued)

    def _fitting(self, n: int) -> int:
        """How many of ``n`` chunks (from the first) the writer's queue has room for now. Only those
        are copied: a copy of chunks the queue then refuses would cost the scheduler thread for nothing
        and hold their memory until the batch is written.

        Only the scheduler thread offers chunks and the writer only frees room, so what fits here still
        fits at the offer; the offer enforces the bound regardless."""
        return max(0, min(n, self.writer.room() // self.fp.chunk_bytes))

    def _count_unfit(self, n: int, fit: int, queued: int) -> int:
        """Count the ``n - fit`` chunks that were never copied as dropped (after the offer, so the
        drop's log line shows the queue with this request in it; the offer counts its own); returns
        ``queued``."""
        if fit < n:
            self.writer.drop(n - fit, (n - fit) * self.fp.chunk_bytes)
        return queued

    def _queue(self, kv: "mx.array", keys: Sequence[bytes], affinity: int | None, t0: float) -> int:
        whole = numpy_view(kv)
        views = [whole[i] for i in range(len(keys))]
        n = self.writer.offer(self.ns, keys, views, keepalive=kv, affinity=affinity)
        self.clock.add("capture", time.perf_counter() - t0)
        return n

    # -------------------------------------------------------------- reads
    def stored_run(self, keys: Sequence[bytes]) -> int:
        """How many of ``keys``, from the first, the store holds (index only)."""
        return self.reader.leading_hits(self.ns, keys)

    def read(self, keys: Sequence[bytes], first: int, affinity: int | None = None,
             tail: tuple[bytes, int] | None = None) -> ChunkRead:
        return self.reader.read(self.ns, keys, first, affinity, self.tail_spec(tail))

    # -------------------------------------------------------------- prompt tails
    def tail_of(self, keys: Sequence[bytes], tokens: Sequence[int] | np.ndarray,
                stop: int) -> tuple[bytes, int] | None:
        """(key, rows) of the partial chunk ``tokens[n*C:stop]`` after the ``n = stop // C`` full
        chunks whose keys are ``keys[:n]``; None when ``stop`` is chunk-aligned or ``n`` is 0.

        A prompt's tail (what SGLang matches of it: all but its last token) is stored once per
        prompt, so the same prompt again restores everything an in-memory hit would and prefills
        one token, not up to C-1.
        """
        n = stop // self.chunk
        r = stop - n * self.chunk
        if r <= 0 or n <= 0 or len(keys) < n:
            return None
        return tail_key(keys[n - 1], np.asarray(tokens[n * self.chunk:stop])), r

    def has_tail(self, key: bytes) -> bool:
        return bool(self.store.contains(self.tail_ns, [key])[0])

    def tail_spec(self, tail: tuple[bytes, int] | None) -> tuple[bytes, bytes, int] | None:
        return (self.tail_ns, tail[0], tail[1]) if tail is not None else None

    def capture_tail(self, kv: "mx.array", key: bytes, affinity: int | None = None) -> int:
        """Queue an evaluated ``[layers, 2, r, heads, head_dim]`` prompt tail (scheduler thread)."""
        n = self.writer.offer(self.tail_ns, [key], [numpy_view(kv)], keepalive=kv, affinity=affinity,
                              kind="tails")
        return n

    def prefetch(self, rid: str, chain_tag: bytes, keys: Sequence[bytes], first: int,
                 affinity: int | None = None, tail: tuple[bytes, int] | None = None) -> bool:
        """Start reading at request arrival; ``chain_tag`` (the key of the last chunk) validates reuse."""
        if not keys:
            return False
        nbytes = len(keys) * self.fp.chunk_bytes
        fut = self.reader.submit(self.ns, keys, first, affinity, self.tail_spec(tail))
        ok = self.prefetches.put(rid, chain_tag, first, nbytes, fut)
        if not ok:
            fut.cancel()
        else:
            self.counters.add("mlx_prefetches_started")
        return ok

    def take_prefetch(self, rid: str, keys: Sequence[bytes], first: int,
                      timeout: float = 30.0) -> ChunkRead | None:
        """The arrival read for ``rid`` if it covers chunk ``first`` of this chain, else None."""
        item = self.prefetches.take(rid)
        if item is None:
            return None
        tag, p_first, fut = item
        try:
            read = fut.result(timeout=timeout)
        except Exception as e:  # cancelled, timed out or failed: fall back to a direct read
            log.debug("lifeboat: prefetch for %s unusable: %s", rid, e)
            return None
        if p_first > first or not read.keys or p_first + read.n_ok <= first:
            return None
        if read.keys[-1] != tag or list(keys[p_first:p_first + len(read.keys)]) != read.keys:
            return None  # another chain (the prompt changed): never install it
        self.counters.add("mlx_prefetches_used")
        return read

    def install(self, pool: Any, slots: np.ndarray, read: ChunkRead, upto_chunk: int, skip: int,
                tail: int = 0) -> None:
        """Install chunks ``read.first .. upto_chunk-1`` and then ``tail`` rows of the prompt tail,
        minus the first ``skip`` rows (scheduler thread)."""
        t0 = time.perf_counter()
        n = upto_chunk - read.first
        install_rows(pool, slots, read.rows[:, :, :n * self.chunk + tail], skip, self.prepare_pool(pool))
        self.buffers.give(read.rows)  # the rows are in the pool now: the staging buffer serves the next read
        layers, two, _, heads, dim = read.rows.shape
        read.rows = np.empty((layers, two, 0, heads, dim), dtype=read.rows.dtype)
        self.clock.add("install", time.perf_counter() - t0)

    def prepare_pool(self, pool: Any) -> PoolLayout:
        """What installs into ``pool`` need, learned once per pool (scheduler thread; cheap after the
        first call). The radix cache calls it at its first checkpoint so a first restore does not pay it."""
        got = self._layout
        if got is not None and got[0]() is pool and got[1].fits(pool):
            return got[1]
        layout = prepare_pool(pool)
        self._layout = (weakref.ref(pool), layout)  # one pool per engine; a new one replaces it
        return layout

    # -------------------------------------------------------------- hybrid state records
    def put_state(self, key: bytes, state: np.ndarray, affinity: int | None = None) -> int:
        """Queue one recurrent-state record (already numpy, evaluated) under the state namespace."""
        return self.writer.offer(self.state_ns, [key], [state], affinity=affinity)

    def has_states(self, keys: Sequence[bytes]) -> list[bool]:
        return self.store.contains(self.state_ns, list(keys)) if keys else []

    def get_state(self, key: bytes, nbytes: int, affinity: int | None = None) -> np.ndarray | None:
        buf = np.empty(nbytes, dtype=np.uint8)
        ok = self.store.get_into(self.state_ns, [key], [buf], affinity=affinity)
        return buf if ok and ok[0] else None

    # -------------------------------------------------------------- housekeeping
    def stats(self) -> dict[str, Any]:
        c = self.counters.snapshot()
        out: dict[str, Any] = {k: v for k, v in c.items()
                               if k.startswith(("mlx_", "miss_", "read_", "write_", "pages_"))}
        out["writer_queued_bytes"] = self.writer.queued_bytes()
        out.update(self.clock.snapshot())
        return out

    def flush(self, timeout: float | None = 60.0) -> bool:
        """Write everything queued and make it durable for the next process."""
        done = self.writer.flush(timeout)
        self.store.flush()
        return done

    def close(self, timeout: float | None = 30.0) -> None:
        if self._closed:
            return
        self._closed = True
        self.writer.close(timeout)
        self.reader.close()
        if self.reporter is not None:
            self.reporter.close()  # after the drain, so the last stats file counts it
        if self._owns_store:
            self.store.close()
