"""Reads of chunk runs into numpy rows in pool layout, and the reads started at request arrival.

Safe on any thread (no MLX): turning the rows into MLX arrays happens on the scheduler thread.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from .fingerprint import ModelFingerprint

if TYPE_CHECKING:
    from ...store import ChunkStore


@dataclass
class ChunkRead:
    """Chunks ``first .. first+n_ok-1`` of a chain, read (verified) into ``rows``.

    ``rows`` is in pool layout, ``[layers, 2, n*C, heads, head_dim]``: chunk i is rows
    ``[i*C, (i+1)*C)`` of every layer's K and V, so the install copies each layer's rows with no
    transpose (the read scatters each record's blocks there).
    """

    keys: list[bytes]
    first: int
    rows: np.ndarray
    n_ok: int
    seconds: float
    tail_key: bytes | None = None  # the prompt tail asked for after the last chunk, if any
    tail_rows: int = 0              # rows allocated for it after the chunks' rows
    tail: int = 0                   # tail rows verified: rows[:, :, n*C:n*C+tail] (0: none)

    @property
    def buf(self) -> np.ndarray:
        """The chunks in record layout, ``[n, layers, 2, C, heads, head_dim]`` (a view, no copy)."""
        layers, two, r, heads, dim = self.rows.shape
        n = len(self.keys)
        c = (r - self.tail_rows) // max(n, 1)
        return self.rows[:, :, :n * c].reshape(layers, two, n, c, heads, dim).transpose(2, 0, 1, 3, 4, 5)


class RowBuffers:
    """Reusable staging rows for reads, so a restore writes into memory that is already mapped.

    A read of R rows needs ``[layers, 2, R, heads, head_dim]``; a fresh ``np.empty`` of that (94 MB for
    2,048 fp32 SmolLM2 tokens) pays a page fault per 4 KiB on first touch, every restore. ``take``
    hands out a view of an idle buffer whose capacity fits (rounded up to ``round_rows``), or a new
    one; ``give`` returns it after the install. A buffer never given back (a prefetch that was not
    used) is simply garbage-collected. At most ``max_idle_bytes`` are kept idle. Thread-safe.
    """

    def __init__(self, fingerprint: ModelFingerprint, max_idle_bytes: int, round_rows: int = 512) -> None:
        self.fp = fingerprint
        self.max_idle_bytes = max_idle_bytes
        self.round_rows = max(1, round_rows)
        self._lock = threading.Lock()
        self._idle: list[np.ndarray] = []
        self._out: dict[int, np.ndarray] = {}  # id(base) -> base, for buffers handed out

    def _shape(self, rows: int) -> tuple[int, int, int, int, int]:
        layers, two, _, heads, dim = self.fp.chunk_shape
        return (layers, two, rows, heads, dim)

    def take(self, rows: int) -> np.ndarray:
        """A ``[layers, 2, rows, heads, head_dim]`` view; each layer's K or V rows contiguous."""
        with self._lock:
            fits = [b for b in self._idle if b.shape[2] >= rows]
            if fits:
                base = min(fits, key=lambda b: b.shape[2])
                self._idle.remove(base)
            else:
                cap = -(-max(rows, 1) // self.round_rows) * self.round_rows
                base = np.empty(self._shape(cap), dtype=self.fp.np_dtype)
            self._out[id(base)] = base
        return base[:, :, :rows]

    def give(self, rows: np.ndarray) -> None:
        """Return a view from ``take`` once nothing reads it any more (twice, or a foreign array: ignored)."""
        base = rows.base if rows.base is not None else rows
        with self._lock:
            if self._out.pop(id(base), None) is None:
                return
            self._idle.append(base)
            self._idle.sort(key=lambda b: b.nbytes, reverse=True)
            while sum(b.nbytes for b in self._idle) > self.max_idle_bytes:
                self._idle.pop(0)  # the largest first

    def idle_bytes(self) -> int:
        with self._lock:
            return sum(b.nbytes for b in self._idle)


class ChunkReader:
    """Reads runs of consecutive chunks into numpy buffers; safe on any thread (no MLX)."""

    def __init__(self, store: "ChunkStore", fingerprint: ModelFingerprint, workers: int = 2,
                 buffers: RowBuffers | None = None) -> None:
        self.store = store
        self.fp = fingerprint
        self.buffers = buffers
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lifeboat-mlx-read")

    def leading_hits(self, ns: bytes, keys: Sequence[bytes]) -> int:
        return self.store.count_leading_hits(ns, keys) if keys else 0

    def read(self, ns: bytes, keys: Sequence[bytes], first: int, affinity: int | None = None,
             tail: tuple[bytes, bytes, int] | None = None) -> ChunkRead:
        """Read ``keys`` (chunks ``first..``) and keep the verified leading run; then, if every
        chunk verified, the prompt tail ``tail = (namespace, key, rows)`` right after them."""
        t0 = time.perf_counter()
        layers, two, c, heads, dim = self.fp.chunk_shape
        extra = tail[2] if tail is not None else 0
        total = len(keys) * c + extra
        if self.buffers is not None:
            rows = self.buffers.take(total)
        else:
            rows = np.empty((layers, two, total, heads, dim), dtype=self.fp.np_dtype)
        flat = rows.reshape(layers * two, total * heads * dim)  # a view: each (layer, K/V) block is contiguous
        if total and not np.may_share_memory(flat, rows):
            raise AssertionError("ChunkReader: staging rows cannot be viewed flat")  # a copy would lose the read
        step = c * heads * dim
        # chunk i's record is [layers, 2, C, heads, dim]: its 2*layers blocks land in their pool rows
        pages = [[flat[j, i * step:(i + 1) * step] for j in range(layers * two)] for i in range(len(keys))]
        ok = self.store.get_into(ns, list(keys), pages, affinity=affinity) if keys else []
        n_ok = ok.index(False) if False in ok else len(ok)
        got = 0
        if tail is not None and n_ok == len(keys):
            a, b = len(keys) * step, len(keys) * step + extra * heads * dim
            if self.store.get_into(tail[0], [tail[1]], [[flat[j, a:b] for j in range(layers * two)]],
                                   affinity=affinity)[0]:
                got = extra
        return ChunkRead(list(keys), first, rows, n_ok, time.perf_counter() - t0,
                         tail_key=tail[1] if tail is not None else None, tail_rows=extra, tail=got)

    def submit(self, ns: bytes, keys: Sequence[bytes], first: int, affinity: int | None = None,
               tail: tuple[bytes, bytes, int] | None = None) -> "Future[ChunkRead]":
        return self._pool.submit(self.read, ns, list(keys), first, affinity, tail)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class PrefetchTable:
    """Reads started at request arrival, by request id, bounded in bytes (oldest dropped first)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._items: OrderedDict[str, tuple[bytes, int, int, Future[ChunkRead]]] = OrderedDict()
        self._bytes = 0

    def put(self, rid: str, chain_tag: bytes, first: int, nbytes: int, fut: "Future[ChunkRead]") -> bool:
        with self._lock:
            if nbytes > self.max_bytes:
                return False
            self._drop_locked(rid)
            while self._items and self._bytes + nbytes > self.max_bytes:
                _, (_, _, size, f) = self._items.popitem(last=False)
                f.cancel()
                self._bytes -= size
            self._items[rid] = (chain_tag, first, nbytes, fut)
            self._bytes += nbytes
            return True

    def take(self, rid: str) -> tuple[bytes, int, "Future[ChunkRead]"] | None:
        with self._lock:
            item = self._items.pop(rid, None)
            if item is None:
                return None
            self._bytes -= item[2]
            return item[0], item[1], item[3]

    def drop(self, rid: str) -> None:
        with self._lock:
            self._drop_locked(rid)

    def _drop_locked(self, rid: str) -> None:
        item = self._items.pop(rid, None)
        if item is not None:
            item[3].cancel()
            self._bytes -= item[2]

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
