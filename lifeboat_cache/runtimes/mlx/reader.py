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


class ChunkReader:
    """Reads runs of consecutive chunks into numpy buffers; safe on any thread (no MLX)."""

    def __init__(self, store: "ChunkStore", fingerprint: ModelFingerprint, workers: int = 2) -> None:
        self.store = store
        self.fp = fingerprint
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
        rows = np.empty((layers, two, len(keys) * c + extra, heads, dim), dtype=self.fp.np_dtype)
        flat = rows.reshape(layers * two, -1)
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
