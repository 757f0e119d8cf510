"""Compact in-memory index: 64-bit key -> Loc(unit, offset, length).

Layout (after Navy's compact index, in numpy): a sorted "main" part of four parallel arrays
(int64 key, uint32 unit, uint64 offset, uint32 length: 24 bytes per entry, no per-entry objects)
plus a small dict "delta" for recent changes, merged into main once it grows past `delta_limit`.
Lookups of a batch are one `searchsorted`; a removed main entry is a tombstone (unit = DEAD) until
the next merge. `peek`-style lookups never change anything, so `exists` cannot disturb eviction.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

DEAD = np.uint32(0xFFFFFFFF)
DEFAULT_DELTA_LIMIT = 16384


@dataclass(frozen=True, slots=True)
class Loc:
    """Where a record lives in a tier: unit (segment/object id), byte offset and record length."""

    unit: int
    offset: int
    length: int


class Index:
    """Thread-safe map of int64 keys to Locs. Write-then-index: insert only after the bytes are written."""

    def __init__(self, delta_limit: int = DEFAULT_DELTA_LIMIT) -> None:
        self._lock = threading.Lock()
        self._keys = np.empty(0, dtype=np.int64)
        self._units = np.empty(0, dtype=np.uint32)
        self._offsets = np.empty(0, dtype=np.uint64)
        self._lengths = np.empty(0, dtype=np.uint32)
        self._delta: dict[int, Loc | None] = {}  # None masks a main entry (removed)
        self._delta_limit = delta_limit
        self._live_main = 0

    # ------------------------------------------------------------------ lookups (never mutate)
    def _main_pos(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos = np.searchsorted(self._keys, keys)
        pos_c = np.minimum(pos, max(len(self._keys) - 1, 0))
        if len(self._keys) == 0:
            return pos_c, np.zeros(len(keys), dtype=bool)
        hit = (self._keys[pos_c] == keys) & (self._units[pos_c] != DEAD)
        return pos_c, hit

    def contains(self, keys: np.ndarray) -> np.ndarray:
        """Per-key presence for an int64 array; no I/O, no side effects."""
        keys = np.asarray(keys, dtype=np.int64)
        with self._lock:
            _, hit = self._main_pos(keys)
            if self._delta:
                delta = self._delta
                for i, k in enumerate(keys.tolist()):
                    if k in delta:
                        hit[i] = delta[k] is not None
            return hit

    def get(self, key: int) -> Loc | None:
        with self._lock:
            return self._get(key)

    def get_many(self, keys: np.ndarray) -> list[Loc | None]:
        keys = np.asarray(keys, dtype=np.int64)
        with self._lock:
            pos, hit = self._main_pos(keys)
            out: list[Loc | None] = []
            delta = self._delta
            for i, k in enumerate(keys.tolist()):
                if k in delta:
                    out.append(delta[k])
                elif hit[i]:
                    p = pos[i]
                    out.append(Loc(int(self._units[p]), int(self._offsets[p]), int(self._lengths[p])))
                else:
                    out.append(None)
            return out

    def _get(self, key: int) -> Loc | None:
        if key in self._delta:
            return self._delta[key]
        pos, hit = self._main_pos(np.array([key], dtype=np.int64))
        if not hit[0]:
            return None
        p = pos[0]
        return Loc(int(self._units[p]), int(self._offsets[p]), int(self._lengths[p]))

    def __len__(self) -> int:
        with self._lock:
            live_delta_new = 0
            masked = 0
            if self._delta:
                dk = np.fromiter(self._delta.keys(), dtype=np.int64, count=len(self._delta))
                _, in_main = self._main_pos(dk)
                for present, v in zip(in_main.tolist(), self._delta.values()):
                    if present:
                        masked += 1
                        live_delta_new += v is not None
                    else:
                        live_delta_new += v is not None
            return self._live_main - masked + live_delta_new

    # ------------------------------------------------------------------ mutations
    def insert(self, key: int, loc: Loc) -> None:
        with self._lock:
            self._delta[key] = loc
            self._maybe_merge()

    def insert_many(self, keys: Iterable[int], locs: Iterable[Loc], *, if_absent: bool = False) -> int:
        """Insert pairs; with if_absent, keep existing entries (a scan never overwrites a newer write)."""
        n = 0
        with self._lock:
            for k, loc in zip(keys, locs):
                if if_absent and self._get(k) is not None:
                    continue
                self._delta[k] = loc
                n += 1
            self._maybe_merge()
        return n

    def insert_arrays(self, keys: np.ndarray, units: np.ndarray, offsets: np.ndarray, lengths: np.ndarray,
                      *, if_absent: bool = True) -> None:
        """Bulk insert (scans of sealed segments): one merge, no per-entry Python objects."""
        keys = np.asarray(keys, dtype=np.int64)
        with self._lock:
            self._merge()
            if if_absent and len(self._keys):
                _, hit = self._main_pos(keys)
                keep = ~hit
                keys, units, offsets, lengths = keys[keep], units[keep], offsets[keep], lengths[keep]
            # last occurrence of a duplicated key wins (later record in the same scan)
            order = np.argsort(keys, kind="stable")
            keys, units, offsets, lengths = keys[order], units[order], offsets[order], lengths[order]
            if len(keys) > 1:
                last = np.append(keys[1:] != keys[:-1], True)
                keys, units, offsets, lengths = keys[last], units[last], offsets[last], lengths[last]
            self._merge_sorted(keys, units.astype(np.uint32), offsets.astype(np.uint64),
                               lengths.astype(np.uint32))

    def remove_if_match(self, key: int, loc: Loc) -> bool:
        """Drop key only if it still points at loc, so a newer write of the same key survives."""
        with self._lock:
            if self._get(key) != loc:
                return False
            self._delta[key] = None
            self._maybe_merge()
            return True

    def drop_unit(self, unit: int) -> int:
        """Forget every entry in a unit (evicted or vanished segment). Returns how many."""
        with self._lock:
            dead = self._units == np.uint32(unit)
            n = int(dead.sum())
            self._units[dead] = DEAD
            self._live_main -= n
            for k in [k for k, v in self._delta.items() if v is not None and v.unit == unit]:
                self._delta[k] = None
                n += 1
            return n

    def clear(self) -> None:
        with self._lock:
            self.__init__(self._delta_limit)  # type: ignore[misc]

    # ------------------------------------------------------------------ merge
    def _maybe_merge(self) -> None:
        if len(self._delta) >= self._delta_limit:
            self._merge()

    def _merge(self) -> None:
        if not self._delta:
            return
        items = sorted(self._delta.items())
        self._delta = {}
        dk = np.fromiter((k for k, _ in items), dtype=np.int64, count=len(items))
        # mask main entries that the delta replaces or removes
        if len(self._keys):
            pos, hit = self._main_pos(dk)
            self._units[pos[hit]] = DEAD
            self._live_main -= int(hit.sum())
        live = [(k, v) for k, v in items if v is not None]
        if not live:
            self._compact()
            return
        keys = np.fromiter((k for k, _ in live), dtype=np.int64, count=len(live))
        units = np.fromiter((v.unit for _, v in live), dtype=np.uint32, count=len(live))
        offs = np.fromiter((v.offset for _, v in live), dtype=np.uint64, count=len(live))
        lens = np.fromiter((v.length for _, v in live), dtype=np.uint32, count=len(live))
        self._merge_sorted(keys, units, offs, lens)

    def _merge_sorted(self, keys: np.ndarray, units: np.ndarray, offs: np.ndarray, lens: np.ndarray) -> None:
        if len(self._keys):
            pos, hit = self._main_pos(keys)
            self._units[pos[hit]] = DEAD
            self._live_main -= int(hit.sum())
        self._compact()
        at = np.searchsorted(self._keys, keys)
        self._keys = np.insert(self._keys, at, keys)
        self._units = np.insert(self._units, at, units)
        self._offsets = np.insert(self._offsets, at, offs)
        self._lengths = np.insert(self._lengths, at, lens)
        self._live_main += len(keys)

    def _compact(self) -> None:
        dead = self._units == DEAD
        if dead.any():
            keep = ~dead
            self._keys, self._units = self._keys[keep], self._units[keep]
            self._offsets, self._lengths = self._offsets[keep], self._lengths[keep]

    # ------------------------------------------------------------------ persistence helpers
    def export(self) -> dict[str, np.ndarray]:
        """Merged, compacted arrays for a snapshot."""
        with self._lock:
            self._merge()
            self._compact()
            return {"keys": self._keys.copy(), "units": self._units.copy(),
                    "offsets": self._offsets.copy(), "lengths": self._lengths.copy()}

    def items(self) -> Iterator[tuple[int, Loc]]:
        arrays = self.export()
        for k, u, o, n in zip(arrays["keys"].tolist(), arrays["units"].tolist(),
                              arrays["offsets"].tolist(), arrays["lengths"].tolist()):
            yield k, Loc(u, o, n)

    def memory_bytes(self) -> int:
        with self._lock:
            arrays = self._keys.nbytes + self._units.nbytes + self._offsets.nbytes + self._lengths.nbytes
            return arrays + len(self._delta) * 200  # dict entry + key int + Loc, rough upper bound
