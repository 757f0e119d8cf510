"""Compact in-memory index: 64-bit key -> Loc(unit, offset, length), lock-free lookups at 10M+ pages.

Why this layout (measured in lifeboat_cache/bench/index_scale.py): a 300-key `contains` must stay
well under 0.2 ms at 10M pages, also while another thread writes, in <= 40 B per page, never
copying the whole index at once.

* Main: every entry sorted by its *mixed* key (key * an odd constant mod 2**64: a bijection that
  spreads even sequential keys), split by the mixed key's top 4 bits into 16 shards. Each shard
  lives in one region of four column arenas (uint64 key, uint32 unit, uint64 offset, uint32 length:
  24 B per entry). The arenas are anonymous mmaps reserved up front, so only written pages are
  resident and a growing shard is never copied. A directory (top `bits` of the mixed key -> first
  position, ~2-4 entries per bucket) makes a batch lookup one gather of a `w`-key row per key from a
  strided view of the key arena (`w` = the largest bucket); `w`+ copies of each shard's last entry
  pad its region so a row never reads stale memory.
* Deltas: recent changes sit in a dict (`active`; None = removed). A full one is frozen (never
  written again) and merged into main by a short-lived background thread, one shard at a time, into
  the one spare region; the shard's old region becomes the spare. Extra memory during a merge is
  one shard (1/16), not a copy of the index.
* Snapshots (tiers/snapshot.py) store each shard in this order: `export_shards` yields them,
  `insert_sorted_shard` publishes one whole without a sort or merge (a miss until it is in).

Concurrency: lookups take no lock. They read the published delta tuple, then main, then re-check
`_epoch`, which the merger bumps before it overwrites a region a slow reader may still be reading or
repoints the directory; on a change the lookup repeats. Writers serialise on `_wlock` (dict writes,
short publishes); merges, bulk inserts and exports on `_mlock` (taken before `_wlock`).
`contains` / `get` never change anything, so `exists` cannot disturb eviction.
"""

from __future__ import annotations

import ctypes
import logging
import math
import mmap
import sys
import threading
import time
from dataclasses import dataclass
from operator import attrgetter
from typing import Iterable, Iterator

import numpy as np

log = logging.getLogger(__name__)

DEAD = np.uint32(0xFFFFFFFF)  # unit of a dropped main entry (until the next merge of its shard)
DEFAULT_DELTA_LIMIT = 16384   # smallest active delta that is frozen and merged (grows with the index)
MAX_DELTA_LIMIT = 131072      # ~26 MB of dict per delta at most
EXPORT_VERSION = 2            # export(): dict of "keys", "units", "offsets", "lengths", any order

SHARD_BITS = 4
SHARDS = 1 << SHARD_BITS           # shard of a key: its mixed key's top SHARD_BITS bits (shard_of)
_SHARD_BITS, _NSHARDS = SHARD_BITS, SHARDS
_MIX = 0x9E3779B97F4A7C15          # odd, so multiplying mod 2**64 is a bijection
_UNMIX = pow(_MIX, -1, 1 << 64)
_PER_BUCKET = 4                    # directory: ~2-4 entries per bucket
_MIN_W = 8
_DEFAULT_CAP = 1 << 21             # entries reserved per region (17 regions: 32M entries, ~0.8 GB virtual)
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)
_MISSING = object()
_CHUNK = 512                        # delta entries converted per GIL release (~0.1-0.2 ms of work)


@dataclass(frozen=True, slots=True)
class Loc:
    """Where a record lives in a tier: unit (segment/object id), byte offset and record length."""

    unit: int
    offset: int
    length: int


_NO_LOC = Loc(0, 0, 0)  # stands in for a removal (None) while a delta becomes arrays
_UNIT, _OFFSET, _LENGTH = attrgetter("unit"), attrgetter("offset"), attrgetter("length")


_libc_trim = getattr(ctypes.CDLL(None), "malloc_trim", None) if sys.platform.startswith("linux") else None


def trim_heap() -> None:
    """Hand the C heap's free memory back to the OS (glibc's malloc_trim; elsewhere nothing).

    A rebuild frees tens of MB of sorted columns per batch; glibc keeps freed heap memory resident,
    so without this a 10M-page crash reopen stayed at 38 B/page resident where the index holds 27.
    It walks the heap and what it returns is faulted in again when used: once after a rebuild, not
    per batch (per batch cost 0.2 s of a 2.7 s rebuild). Raises nothing.
    """
    if _libc_trim is not None:
        _libc_trim(0)


def mix_keys(keys: np.ndarray) -> np.ndarray:
    """The index's order key of each int64 key (uint64): entries are sorted by it, shard by shard."""
    return np.ascontiguousarray(keys, dtype=np.int64).view(np.uint64) * np.uint64(_MIX)


def unmix_keys(x: np.ndarray) -> np.ndarray:
    """The int64 keys of mixed keys (the inverse of mix_keys)."""
    return (np.asarray(x, dtype=np.uint64) * np.uint64(_UNMIX)).view(np.int64)


def shard_of(x: np.ndarray) -> np.ndarray:
    """Shard of each mixed key."""
    return (np.asarray(x, dtype=np.uint64) >> np.uint64(64 - SHARD_BITS)).astype(np.int64)


MIX_CONSTANT = _MIX  # part of any file that stores entries in index order (tiers/snapshot.py checks it)
_mix, _unmix = mix_keys, unmix_keys


def _unit_mask(col: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """col[i] in ids (sorted unique uint32 unit ids): a table gather when ids are small, else a search."""
    if len(ids) == 1:
        return col == ids[0]
    top = int(ids[-1])
    if top < (1 << 22):
        table = np.zeros(top + 2, dtype=bool)
        table[ids] = True
        return table[np.minimum(col, np.uint32(top + 1))]
    return _member(col, ids)


def _member(values: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """values[i] in pool, by binary search (np.isin can take seconds on wide-range int64 keys)."""
    if not len(pool):
        return np.zeros(len(values), dtype=bool)
    pool = np.sort(pool)
    return pool[np.minimum(np.searchsorted(pool, values), len(pool) - 1)] == values


def _reserve(n: int, dtype: type) -> np.ndarray:
    """A zero-filled array whose pages become resident only when written."""
    size = max(n * np.dtype(dtype).itemsize, 1)
    try:
        mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | _MAP_NORESERVE,
                       prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except (OSError, ValueError, AttributeError):  # no anonymous mmap: plain (calloc'd) memory
        return np.zeros(n, dtype=dtype)  # MemoryError if even that is refused (RLIMIT_AS)
    return np.frombuffer(mm, dtype=dtype, count=n)


class _Arena:
    """Four columns of (_NSHARDS + 1) regions of `cap` entries each; one region is the spare."""

    __slots__ = ("cap", "keys", "units", "offsets", "lengths")

    def __init__(self, cap: int) -> None:
        n = (_NSHARDS + 1) * cap
        self.cap = cap
        self.keys = _reserve(n, np.uint64)
        self.units = _reserve(n, np.uint32)
        self.offsets = _reserve(n, np.uint64)
        self.lengths = _reserve(n, np.uint32)


class _Main:
    """What a lookup reads: arena, directory and window. Replaced whole when the arena or `bits` change."""

    __slots__ = ("arena", "dir", "bits", "shift", "win")

    def __init__(self, arena: _Arena, directory: np.ndarray, bits: int, win: tuple[int, np.ndarray]) -> None:
        self.arena = arena
        self.dir = directory
        self.bits = bits
        self.shift = np.uint64(64 - bits)
        self.win = win  # (w, rows of w keys): read as one attribute so both always match


def _window(a: "_Arena", w: int) -> tuple[int, np.ndarray]:
    """(w, view of the key arena as overlapping rows of w keys): row i = keys[i:i+w], no copy."""
    n = len(a.keys) - w + 1
    return w, np.lib.stride_tricks.as_strided(a.keys, shape=(n, w), strides=(a.keys.itemsize,) * 2,
                                              writeable=False)


def _dir_dtype(arena_len: int) -> type:
    return np.uint32 if arena_len < 2**32 else np.uint64


def _dir_entries(starts: np.ndarray, base: int, dtype: type) -> np.ndarray:
    """Directory entries: the arena position of each bucket's first entry."""
    return (starts.astype(np.uint64) + np.uint64(base)).astype(dtype)


class Index:
    """Thread-safe map of int64 keys to Locs. Write-then-index: insert only after the bytes are written."""

    _initial_cap = _DEFAULT_CAP  # entries reserved per region; a subclass may start smaller (tests)

    def __init__(self, delta_limit: int | None = None) -> None:
        self._fixed_limit = delta_limit
        self._wlock = threading.RLock()
        self._mlock = threading.Lock()
        self._reset(self._initial_cap)

    def _reset(self, cap: int) -> None:
        try:
            arena = _Arena(cap)
        except MemoryError:  # address space limited (ulimit -v): start small, grow by copying
            log.warning("lifeboat: cannot reserve %d index entries per shard; starting with 65536", cap)
            cap = 1 << 16
            arena = _Arena(cap)
        self._region = list(range(_NSHARDS))   # region of each shard
        self._count = [0] * _NSHARDS           # entries of each shard (padding excluded)
        self._dead = [0] * _NSHARDS            # of those, dropped (unit == DEAD)
        self._spare = _NSHARDS
        self._spare_used = 0                   # entries written in the spare region (still resident)
        self._drops: list[int] = []            # units dropped since the last publish
        self._ever_dropped = False             # some entry may be DEAD: lookups must check units
        directory = _dir_entries(np.arange(_NSHARDS) * cap, 0, _dir_dtype((_NSHARDS + 1) * cap))
        win = _window(arena, _MIN_W)
        for s in range(_NSHARDS):
            self._pad(arena, s, s, 0, 0, _MIN_W)
        self._pad_w = _MIN_W                   # every region is padded this far (never shrinks)
        self._epoch = 0
        self._deltas: tuple[dict[int, Loc | None], tuple[dict[int, Loc | None], ...]] = ({}, ())
        self._merger: threading.Thread | None = None
        self._main = _Main(arena, directory, _SHARD_BITS, win)

    # ------------------------------------------------------------------ lookups (never mutate, no lock)
    def _find(self, x: np.ndarray, want_loc: bool) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        """Main-part lookup of mixed keys, repeated until no region it read was rewritten meanwhile."""
        while True:
            epoch = self._epoch
            m = self._main
            _, rows = m.win
            a = m.arena
            lo = m.dir[x >> m.shift]
            eq = rows[lo] == x[:, None]  # one contiguous w-wide row per key: a memcpy, not w gathers
            first = eq.argmax(axis=1)    # the equal column of each row (0 when none)
            hit = eq.reshape(-1)[np.arange(0, eq.size, eq.shape[1]) + first]  # cheaper than any(axis=1)
            pos = lo + first
            # not `any(self._dead)`: a merge publishing a compacted shard zeroes its count while a
            # reader that already read the old directory still reads the old region's DEAD entries
            if want_loc or self._ever_dropped:
                units = a.units[pos]
                hit &= units != DEAD
            locs = (units, a.offsets[pos], a.lengths[pos]) if want_loc else None
            if self._epoch == epoch:
                return hit, locs

    @staticmethod
    def _resolve(key: int, active: dict, frozen: tuple) -> object:
        v = active.get(key, _MISSING)
        if v is not _MISSING:
            return v
        for f in frozen:
            v = f.get(key, _MISSING)
            if v is not _MISSING:
                return v
        return _MISSING

    @staticmethod
    def _in_deltas(keys: np.ndarray, active: dict, frozen: tuple) -> np.ndarray:
        """Positions of `keys` that some delta mentions (C-speed set intersections, no Python loop)."""
        ql = keys.tolist()
        special = active.keys() & ql
        for f in frozen:
            special |= f.keys() & ql
        if not special:
            return np.empty(0, dtype=np.int64)
        return np.flatnonzero(_member(keys, np.fromiter(special, dtype=np.int64, count=len(special))))

    def contains(self, keys: np.ndarray) -> np.ndarray:
        """Per-key presence for an int64 array; no I/O, no side effects, no lock."""
        keys = np.asarray(keys, dtype=np.int64)
        active, frozen = self._deltas
        hit, _ = self._find(_mix(keys), want_loc=False)
        if active or frozen:
            for i in self._in_deltas(keys, active, frozen).tolist():
                v = self._resolve(int(keys[i]), active, frozen)
                if v is not _MISSING:
                    hit[i] = v is not None
        return hit

    def get(self, key: int) -> Loc | None:
        active, frozen = self._deltas
        v = self._resolve(key, active, frozen)
        if v is not _MISSING:
            return v  # type: ignore[return-value]
        return self._main_locs(np.array([key], dtype=np.int64))[0]

    def _main_locs(self, keys: np.ndarray) -> list[Loc | None]:
        hit, locs = self._find(_mix(keys), want_loc=True)
        assert locs is not None
        return [Loc(u, o, n) if h else None
                for h, u, o, n in zip(hit.tolist(), locs[0].tolist(), locs[1].tolist(), locs[2].tolist())]

    def get_many(self, keys: np.ndarray) -> list[Loc | None]:
        keys = np.asarray(keys, dtype=np.int64)
        active, frozen = self._deltas
        out = self._main_locs(keys)
        if active or frozen:
            for i in self._in_deltas(keys, active, frozen).tolist():
                v = self._resolve(int(keys[i]), active, frozen)
                if v is not _MISSING:
                    out[i] = v  # type: ignore[assignment]
        return out

    def locate(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(found, units, offsets, lengths) per key, as arrays (no Loc objects): vector `get_many`."""
        keys = np.asarray(keys, dtype=np.int64)
        active, frozen = self._deltas
        hit, locs = self._find(_mix(keys), want_loc=True)
        assert locs is not None
        units, offs, lens = locs
        if active or frozen:
            for i in self._in_deltas(keys, active, frozen).tolist():
                v = self._resolve(int(keys[i]), active, frozen)
                if v is None:
                    hit[i] = False
                elif v is not _MISSING:
                    hit[i] = True
                    units[i], offs[i], lens[i] = v.unit, v.offset, v.length  # type: ignore[union-attr]
        return hit, units, offs, lens

    def __len__(self) -> int:
        with self._wlock:
            active, frozen = self._deltas
            main_live = sum(self._count) - sum(self._dead)
            merged = self._merged_deltas(active, frozen)
            if not merged:
                return main_live
            dk = np.fromiter(merged.keys(), dtype=np.int64, count=len(merged))
            in_main, _ = self._find(_mix(dk), want_loc=False)
            return main_live - int(in_main.sum()) + sum(v is not None for v in merged.values())

    @staticmethod
    def _merged_deltas(active: dict, frozen: tuple) -> dict[int, Loc | None]:
        merged: dict[int, Loc | None] = {}
        for f in reversed(frozen):
            merged.update(f)
        merged.update(active)
        return merged

    # ------------------------------------------------------------------ mutations
    def _limit(self) -> int:
        if self._fixed_limit is not None:
            return self._fixed_limit
        return max(DEFAULT_DELTA_LIMIT, min(MAX_DELTA_LIMIT, sum(self._count) // 128))

    def insert(self, key: int, loc: Loc) -> None:
        with self._wlock:
            self._deltas[0][key] = loc
            drain = self._maybe_freeze()
        if drain:
            self._drain()

    def insert_many(self, keys: Iterable[int], locs: Iterable[Loc], *, if_absent: bool = False) -> int:
        """Insert pairs; with if_absent, keep existing entries (a scan never overwrites a newer write)."""
        n = 0
        with self._wlock:
            active = self._deltas[0]
            for k, loc in zip(keys, locs):
                if if_absent and self.get(k) is not None:
                    continue
                active[k] = loc
                n += 1
            drain = self._maybe_freeze()
        if drain:
            self._drain()
        return n

    def remove_if_match(self, key: int, loc: Loc) -> bool:
        """Drop key only if it still points at loc, so a newer write of the same key survives."""
        with self._wlock:
            if self.get(key) != loc:
                return False
            self._deltas[0][key] = None
            drain = self._maybe_freeze()
        if drain:
            self._drain()
        return True

    def _maybe_freeze(self) -> bool:
        """Under _wlock: freeze a full active delta and start the merger. True: caller must help (backlog)."""
        active, frozen = self._deltas
        if len(active) < self._limit():
            return False
        self._deltas = ({}, (active,) + frozen)
        if self._merger is None:
            self._merger = threading.Thread(target=self._merge_loop, name="lifeboat-index-merge", daemon=True)
            self._merger.start()
        return len(frozen) >= 2  # writers outrun the merger: merge in this thread too

    def _merge_loop(self) -> None:
        while True:
            self._drain()
            with self._wlock:
                if not self._deltas[1]:
                    self._merger = None
                    return

    def _drain(self) -> None:
        """Merge every frozen delta into main (oldest first)."""
        with self._mlock:
            while True:
                with self._wlock:
                    frozen = self._deltas[1]
                    if not frozen:
                        return
                    f = frozen[-1]
                keys, units, offs, lens, live = self._delta_arrays(f)
                self._merge_sorted(*self._sorted_mixed(keys, units, offs, lens, live), if_absent=False)
                with self._wlock:
                    active, frozen = self._deltas
                    assert frozen[-1] is f
                    self._deltas = (active, frozen[:-1])
                self._rebits()

    @staticmethod
    def _delta_arrays(f: dict[int, Loc | None]) -> tuple[np.ndarray, ...]:
        """A frozen delta as arrays, in small chunks that each end with a GIL release (sleep(0)):
        readers in other threads then wait for this thread at most one chunk (~0.1-0.2 ms), not a
        switch interval. No object is created per entry (no tuples), so the conversion never
        triggers a garbage collection of the whole heap while it holds the GIL."""
        n = len(f)
        ks, vs = list(f), list(f.values())  # a frozen delta is never written again
        keys = np.empty(n, dtype=np.int64)
        units, offs = np.empty(n, dtype=np.uint32), np.empty(n, dtype=np.uint64)
        lens, live = np.empty(n, dtype=np.uint32), np.empty(n, dtype=bool)
        for a in range(0, n, _CHUNK):
            c = vs[a:a + _CHUNK]
            b = a + len(c)
            keys[a:b] = ks[a:b]
            live[a:b] = [v is not None for v in c]
            c = [v or _NO_LOC for v in c]  # a removal: any location, live=False leaves it out
            units[a:b] = np.fromiter(map(_UNIT, c), dtype=np.uint32, count=len(c))
            offs[a:b] = np.fromiter(map(_OFFSET, c), dtype=np.uint64, count=len(c))
            lens[a:b] = np.fromiter(map(_LENGTH, c), dtype=np.uint32, count=len(c))
            time.sleep(0)
        return keys, units, offs, lens, live

    def settle(self) -> None:
        """Merge all pending deltas now (tests, benchmarks); lookups never need it."""
        with self._wlock:
            active, frozen = self._deltas
            if active:
                self._deltas = ({}, (active,) + frozen)
        self._drain()

    @staticmethod
    def _sorted_mixed(keys: np.ndarray, *cols: np.ndarray) -> tuple[np.ndarray, ...]:
        x = _mix(keys)
        order = np.argsort(x)
        x = x[order]
        if len(x) > 1 and (x[1:] == x[:-1]).any():  # duplicates: their input order must survive
            order = np.argsort(_mix(keys), kind="stable")
            x = _mix(keys)[order]
        return (x,) + tuple(c[order] for c in cols)

    def insert_arrays(self, keys: np.ndarray, units: np.ndarray, offsets: np.ndarray, lengths: np.ndarray,
                      *, if_absent: bool = True) -> None:
        """Bulk insert (scans of sealed segments, snapshot loads): shard by shard, no per-entry objects.

        The last occurrence of a duplicated key wins (later record of the same scan).
        """
        keys = np.asarray(keys, dtype=np.int64)
        units = np.asarray(units).astype(np.uint32, copy=False)
        offsets = np.asarray(offsets).astype(np.uint64, copy=False)
        lengths = np.asarray(lengths).astype(np.uint32, copy=False)
        if not len(keys):
            return
        # group by shard first (a stable radix sort of one byte), then sort one shard at a time:
        # temporaries stay ~17 B per entry plus 1/16 of the input, not a sorted copy of everything
        x = _mix(keys)
        order = np.argsort((x >> np.uint64(64 - _SHARD_BITS)).astype(np.uint8), kind="stable")
        cuts = np.searchsorted(x[order] >> np.uint64(64 - _SHARD_BITS), np.arange(_NSHARDS + 1, dtype=np.uint64))
        with self._mlock:
            self._rebits(extra=len(x))  # size the directory for the result first
            for s in range(_NSHARDS):
                idx = order[cuts[s]:cuts[s + 1]]  # increasing input positions within the shard
                if not len(idx):
                    continue
                # the shard's columns first, in input order (increasing positions: a streaming gather),
                # then sorted where they are small; gathering the big columns in key order was a
                # cache miss per entry and column (a third of a 10M-page crash rebuild)
                xs = x[idx]
                o = np.argsort(xs)
                if len(xs) > 1 and (np.diff(xs[o]) == 0).any():  # duplicates: input order decides
                    o = np.argsort(xs, kind="stable")
                    sx = xs[o]
                    o = o[np.append(sx[1:] != sx[:-1], True)]  # the last duplicate is the latest
                xs = xs[o]
                with self._wlock:  # hold writers off this shard so each key is checked and merged atomically
                    sx, su, so, sl, sv = self._bulk_vs_deltas(xs, units[idx][o], offsets[idx][o], lengths[idx][o],
                                                              np.ones(len(xs), dtype=bool), if_absent)
                    if len(sx):
                        self._merge_shard(s, sx, su, so, sl, sv, if_absent)
            self._rebits()

    def insert_sorted_shard(self, s: int, keys: np.ndarray, units: np.ndarray, offsets: np.ndarray,
                            lengths: np.ndarray, *, total_hint: int = 0) -> None:
        """Install shard s from columns already in index order (a snapshot load): no sort, no merge.

        `keys` are mixed keys (mix_keys), strictly increasing, all of shard s (else ValueError); a unit
        of DEAD marks an entry left out. Lookups see the whole shard at once, and a miss before. If the
        shard already holds entries (writes merged meanwhile), the columns are merged in instead and
        what is there wins. `total_hint`: entries expected in all (sizes the directory once).
        """
        x = np.asarray(keys)
        if x.dtype != np.uint64 or not len(x) == len(units) == len(offsets) == len(lengths):
            raise ValueError("insert_sorted_shard: keys must be uint64 mixed keys, all columns one length")
        n = len(x)
        if not n:
            return
        if not 0 <= s < _NSHARDS or int(x[0] >> np.uint64(64 - _SHARD_BITS)) != s \
                or int(x[-1] >> np.uint64(64 - _SHARD_BITS)) != s or (n > 1 and not bool((x[1:] > x[:-1]).all())):
            raise ValueError(f"insert_sorted_shard: keys of shard {s} must be strictly increasing mixed keys "
                             "of that shard")
        units = np.ascontiguousarray(units, dtype=np.uint32)
        offsets = np.ascontiguousarray(offsets, dtype=np.uint64)
        lengths = np.ascontiguousarray(lengths, dtype=np.uint32)
        with self._mlock:
            self._rebits(extra=max(n, total_hint - sum(self._count)))
            if self._count[s]:
                live = units != DEAD
                with self._wlock:
                    sx, su, so, sl, sv = self._bulk_vs_deltas(x[live], units[live], offsets[live], lengths[live],
                                                              np.ones(int(live.sum()), dtype=bool), True)
                    if len(sx):
                        self._merge_shard(s, sx, su, so, sl, sv, True)
                return
            self._install(s, x, units, offsets, lengths)

    def _install(self, s: int, x: np.ndarray, units: np.ndarray, offs: np.ndarray, lens: np.ndarray) -> None:
        """Under _mlock: write an empty shard's entries into the spare region, then publish it."""
        n = len(x)
        m = self._main
        a = m.arena
        with self._wlock:
            mark = len(self._drops)
        starts, sizes = self._buckets_of(x, np.empty(0, dtype=np.uint64), s, m.bits)
        wneed = max(int(sizes.max()), 1)
        w = max(self._pad_w, wneed)
        if max([n] + self._count) + w > a.cap:
            self._grow(max([n] + self._count) + w)
            m, a = self._main, self._main.arena
        if bool((units == DEAD).any()):
            self._ever_dropped = True  # before the publish: lookups must check units from then on
        sp = self._spare
        sb = sp * a.cap
        self._epoch += 1  # a reader that started before may still be reading the spare's old contents
        for col, vals in zip((a.keys, a.units, a.offsets, a.lengths), (x, units, offs, lens)):
            col[sb:sb + n] = vals
        self._publish(a, m, s, sp, n, starts, mark, w, wneed)

    def drop_unit(self, unit: int) -> int:
        """Forget every entry in a unit (evicted or vanished segment). Returns how many."""
        return self.drop_units([unit])

    def drop_units(self, units: Iterable[int]) -> int:
        """Forget every entry of these units in one pass over the index. Returns how many."""
        ids = np.unique(np.fromiter(units, dtype=np.int64)).astype(np.uint32)
        if not len(ids):
            return 0
        with self._wlock:
            self._ever_dropped = True  # before any DEAD mark, so no lookup skips the unit check
            active, frozen = self._deltas
            merged = self._merged_deltas(active, frozen)
            dk = np.sort(_mix(np.fromiter(merged.keys(), dtype=np.int64, count=len(merged))))
            a, cap, w = self._main.arena, self._main.arena.cap, self._pad_w
            n = 0
            for s in range(_NSHARDS):
                base, cnt = self._region[s] * cap, self._count[s]
                col = a.units[base:base + cnt + w]
                hit = np.flatnonzero(_unit_mask(col, ids))
                if not len(hit):
                    continue
                real = hit[hit < cnt]
                if len(dk) and len(real):
                    hk = a.keys[base + real]
                    p = np.minimum(np.searchsorted(dk, hk), len(dk) - 1)
                    n += int((dk[p] != hk).sum())
                else:
                    n += len(real)
                col[hit] = DEAD
                self._dead[s] += len(real)
            self._drops.extend(ids.tolist())
            idset = set(ids.tolist())
            for k, v in merged.items():
                if v is not None and v.unit in idset:
                    active[k] = None
                    n += 1
            return n

    def clear(self) -> None:
        with self._mlock, self._wlock:
            self._epoch += 1
            merger = self._merger
            self._reset(self._initial_cap)
            self._merger = merger  # a running merger finds no frozen delta and exits
            self._epoch += 1

    # ------------------------------------------------------------------ merge (under _mlock)
    def _pad(self, a: _Arena, s: int, region: int, count: int, start: int, stop: int) -> None:
        """Fill entries [count+start, count+stop) of a region with its last entry (or a foreign key)."""
        base = region * a.cap
        lo, hi = base + count + start, base + count + stop
        if count:
            for col in (a.keys, a.units, a.offsets, a.lengths):
                col[lo:hi] = col[base + count - 1]
        else:  # a key of the next shard's range can never be looked up in this one
            a.keys[lo:hi] = np.uint64(((s + 1) % _NSHARDS) << (64 - _SHARD_BITS))
            a.units[lo:hi] = DEAD
            a.offsets[lo:hi] = 0
            a.lengths[lo:hi] = 0

    def _merge_sorted(self, x: np.ndarray, units: np.ndarray, offs: np.ndarray, lens: np.ndarray,
                      live: np.ndarray, *, if_absent: bool) -> None:
        """Apply sorted unique mixed keys (live=False: removal) to main, shard by shard."""
        self._rebits(extra=int(live.sum()))  # size the directory for the result first
        cuts = np.searchsorted(x >> np.uint64(64 - _SHARD_BITS), np.arange(_NSHARDS + 1, dtype=np.uint64))
        for s in range(_NSHARDS):
            a, b = int(cuts[s]), int(cuts[s + 1])
            if a == b:
                continue
            self._merge_shard(s, x[a:b], units[a:b], offs[a:b], lens[a:b], live[a:b], if_absent)

    def _bulk_vs_deltas(self, x: np.ndarray, u: np.ndarray, o: np.ndarray, n: np.ndarray, live: np.ndarray,
                        if_absent: bool) -> tuple[np.ndarray, ...]:
        """Bulk keys a delta mentions: overwrite them there (deltas win over main), or skip if present."""
        active, frozen = self._deltas
        if not active and not frozen:
            return x, u, o, n, live
        keys = _unmix(x)
        idx = self._in_deltas(keys, active, frozen)
        if not len(idx):
            return x, u, o, n, live
        for i in idx.tolist():
            k = int(keys[i])
            if if_absent and self._resolve(k, active, frozen) is not None:
                continue
            active[k] = Loc(int(u[i]), int(o[i]), int(n[i]))
        keep = np.ones(len(x), dtype=bool)
        keep[idx] = False
        return x[keep], u[keep], o[keep], n[keep], live[keep]

    def _merge_shard(self, s: int, dx: np.ndarray, du: np.ndarray, do: np.ndarray, dl: np.ndarray,
                     dlive: np.ndarray, if_absent: bool) -> None:
        """Write shard s merged with these sorted changes into the spare region, then publish it."""
        m = self._main
        a = m.arena
        with self._wlock:
            mark = len(self._drops)
        base, cnt = self._region[s] * a.cap, self._count[s]
        ok, ou = a.keys[base:base + cnt], a.units[base:base + cnt]
        keep = ou != DEAD
        raw = None
        if cnt:
            raw = np.searchsorted(ok, dx)
            pos = np.minimum(raw, cnt - 1)
            match = ok[pos] == dx
            if if_absent:
                fresh = ~(match & keep[pos])
                if not fresh.all():
                    dx, du, do, dl, dlive, pos, match, raw = (c[fresh] for c in (dx, du, do, dl, dlive, pos, match,
                                                                                  raw))
            keep[pos[match]] = False
        all_live = bool(dlive.all())
        ax = dx if all_live else dx[dlive]
        compact = not keep.all()
        olds = [c[base:base + cnt] for c in (a.keys, a.units, a.offsets, a.lengths)]
        if compact:
            olds = [c[keep] for c in olds]
        del ok, ou, keep
        n_old, n_add = len(olds[0]), len(ax)
        if raw is not None and all_live and not compact:
            at = raw  # nothing left out on either side: the search above already placed every key
        else:
            at = np.searchsorted(olds[0], ax)                 # ax and the kept keys are disjoint
        new_pos = at + np.arange(n_add)
        old_pos = np.arange(n_old) + np.cumsum(np.bincount(at, minlength=n_old + 1))[:n_old]
        n_new = n_old + n_add
        starts, sizes = self._buckets_of(olds[0], ax, s, m.bits)
        wneed = max(int(sizes.max()), 1)
        w = max(self._pad_w, wneed)
        if max([n_new] + self._count) + w > a.cap:
            self._grow(max([n_new] + self._count) + w)
            m, a = self._main, self._main.arena  # `olds` still view the old arena, which stays intact
        sp = self._spare
        sb = sp * a.cap
        self._epoch += 1  # a reader that started before may still be reading the spare's old contents
        for col, vals, add in zip((a.keys, a.units, a.offsets, a.lengths), olds, (ax, du[dlive], do[dlive], dl[dlive])):
            dst = col[sb:sb + n_new]
            dst[old_pos] = vals
            dst[new_pos] = add
        del olds
        self._publish(a, m, s, sp, n_new, starts, mark, w, wneed)

    def _publish(self, a: _Arena, m: _Main, s: int, sp: int, n: int, starts: np.ndarray, mark: int, w: int,
                 wneed: int) -> None:
        """Make the spare region `sp` (n sorted entries of shard s, written) the shard's region: pad it,
        apply the drops that came meanwhile, repoint the directory, and the old region becomes the spare."""
        sb = sp * a.cap
        self._pad(a, s, sp, n, 0, w)
        with self._wlock:
            self._apply_drops(a, [(sp, n)], mark, w)
            # count, don't derive: a drop may have marked entries while they were being copied
            dead = int(np.count_nonzero(a.units[sb:sb + n] == DEAD))
            self._widen(w, wneed)
            self._epoch += 1
            bps = 1 << (m.bits - _SHARD_BITS)
            m.dir[s * bps:(s + 1) * bps] = _dir_entries(starts, sb, m.dir.dtype)
            old = self._region[s]
            self._spare_used = self._count[s] + self._pad_w
            self._region[s], self._spare = sp, old
            self._count[s], self._dead[s] = n, dead
            self._drops = []

    @staticmethod
    def _buckets_of(old: np.ndarray, add: np.ndarray, s: int, bits: int) -> tuple[np.ndarray, np.ndarray]:
        """First position and size of every directory bucket of shard s in the merge of two disjoint
        sorted key arrays (without merging them)."""
        bps = 1 << (bits - _SHARD_BITS)
        cnt = np.bincount((old >> np.uint64(64 - bits)).astype(np.int64) - s * bps, minlength=bps)
        if len(add):
            cnt += np.bincount((add >> np.uint64(64 - bits)).astype(np.int64) - s * bps, minlength=bps)
        starts = np.concatenate(([0], np.cumsum(cnt)[:-1]))
        return starts, cnt

    def _apply_drops(self, a: _Arena, regions: list[tuple[int, int]], mark: int, w: int) -> int:
        """Under _wlock: re-apply drop_unit calls that raced with a copy into these regions.

        Returns how many real (not padding) entries this newly marked dead."""
        n = 0
        if len(self._drops) <= mark:
            return 0
        ids = np.unique(np.array(self._drops[mark:], dtype=np.int64)).astype(np.uint32)
        for r, cnt in regions:
            col = a.units[r * a.cap:r * a.cap + cnt + w]
            hit = np.flatnonzero(_unit_mask(col, ids))
            col[hit] = DEAD
            n += int((hit < cnt).sum())
        return n

    def _widen(self, pad_w: int, win: int) -> None:
        """Under _wlock: pad every published region to pad_w, then let lookups use a window >= win."""
        m = self._main
        if pad_w > self._pad_w:
            for s in range(_NSHARDS):
                self._pad(m.arena, s, self._region[s], self._count[s], self._pad_w, pad_w)
            self._pad_w = pad_w
        if win > m.win[0]:
            m.win = _window(m.arena, win)

    def _grow(self, need: int) -> None:
        """Under _mlock: copy main into a larger arena (past _DEFAULT_CAP entries per shard only; rare)."""
        m = self._main
        a = m.arena
        cap = a.cap
        while cap < need + 1:
            cap *= 4
        log.info("lifeboat: index arena grows to %d entries per shard", cap)
        b = _Arena(cap)
        with self._wlock:
            mark = len(self._drops)
        w = self._pad_w
        for s in range(_NSHARDS):
            r, cnt = self._region[s], self._count[s]
            for src, dst in zip((a.keys, a.units, a.offsets, a.lengths), (b.keys, b.units, b.offsets, b.lengths)):
                dst[r * cap:r * cap + cnt + w] = src[r * a.cap:r * a.cap + cnt + w]
        directory, _ = self._dir_for(m.bits, b)
        with self._wlock:  # drops were counted by drop_unit; only their marks must reach the copy
            self._apply_drops(b, [(self._region[s], self._count[s]) for s in range(_NSHARDS)], mark, w)
            self._epoch += 1
            self._main = _Main(b, directory, m.bits, _window(b, m.win[0]))
            self._spare_used = 0

    def _dir_for(self, bits: int, a: _Arena | None = None) -> tuple[np.ndarray, int]:
        """A directory with `bits` for the current regions (of arena a), and the window it needs."""
        a = a or self._main.arena
        bps = 1 << (bits - _SHARD_BITS)
        dtype = _dir_dtype((_NSHARDS + 1) * a.cap)
        directory = np.empty(_NSHARDS * bps, dtype=dtype)
        wneed = 1
        empty = np.empty(0, dtype=np.uint64)
        for s in range(_NSHARDS):
            base = self._region[s] * a.cap
            if not self._count[s]:  # every bucket starts at the (padded) region's start
                directory[s * bps:(s + 1) * bps] = base
                continue
            starts, sizes = self._buckets_of(a.keys[base:base + self._count[s]], empty, s, bits)
            directory[s * bps:(s + 1) * bps] = _dir_entries(starts, base, dtype)
            wneed = max(wneed, int(sizes.max()))
        return directory, wneed

    def _rebits(self, extra: int = 0) -> None:
        """Under _mlock: resize the directory once the index (+ extra coming) has grown or shrunk 2x."""
        total = sum(self._count) + extra
        want = max(_SHARD_BITS, math.ceil(math.log2(total / _PER_BUCKET)) if total >= _PER_BUCKET else 0)
        if self._main.bits - 1 <= want <= self._main.bits:
            return
        directory, wneed = self._dir_for(want)
        wneed = max(wneed, _MIN_W)
        if max(self._count) + max(wneed, self._pad_w) > self._main.arena.cap:
            self._grow(max(self._count) + max(wneed, self._pad_w))
            directory, wneed = self._dir_for(want)
            wneed = max(wneed, _MIN_W)
        with self._wlock:
            self._widen(wneed, 0)
            self._epoch += 1
            self._main = _Main(self._main.arena, directory, want, _window(self._main.arena, wneed))

    # ------------------------------------------------------------------ persistence helpers
    def export(self) -> dict[str, np.ndarray]:
        """Live entries as arrays (format version EXPORT_VERSION: keys int64, units uint32, offsets
        uint64, lengths uint32; in no particular order). Merges nothing, blocks no lookup or insert."""
        with self._mlock:
            with self._wlock:
                active, frozen = self._deltas
                merged = self._merged_deltas(active, frozen)
            a, cap = self._main.arena, self._main.arena.cap
            parts: list[list[np.ndarray]] = [[], [], [], []]
            for s in range(_NSHARDS):
                base, cnt = self._region[s] * cap, self._count[s]
                u = a.units[base:base + cnt]
                keep = u != DEAD
                for p, col in zip(parts, (a.keys, a.units, a.offsets, a.lengths)):
                    p.append(col[base:base + cnt][keep])
        x, units, offs, lens = (np.concatenate(p) for p in parts)
        keys = _unmix(x)
        if merged:
            dk = np.fromiter(merged.keys(), dtype=np.int64, count=len(merged))
            drop = _member(keys, dk)
            if drop.any():
                keep = ~drop
                keys, units, offs, lens = keys[keep], units[keep], offs[keep], lens[keep]
            livev = [(k, v) for k, v in merged.items() if v is not None]
            keys = np.concatenate([keys, np.fromiter((k for k, _ in livev), np.int64, len(livev))])
            units = np.concatenate([units, np.fromiter((v.unit for _, v in livev), np.uint32, len(livev))])
            offs = np.concatenate([offs, np.fromiter((v.offset for _, v in livev), np.uint64, len(livev))])
            lens = np.concatenate([lens, np.fromiter((v.length for _, v in livev), np.uint32, len(livev))])
        return {"keys": keys, "units": units, "offsets": offs, "lengths": lens}

    def export_shards(self) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """Live entries shard by shard, in index order: (shard, mixed keys, units, offsets, lengths).

        Memory: one shard's copy at a time. Deltas are read once at the start and win over main; each
        shard is copied under the merge lock (released before it is yielded), so no lookup or insert
        waits on the consumer.
        """
        with self._wlock:
            merged = self._merged_deltas(*self._deltas)
        dkeys, du, do, dl, dlive = self._delta_arrays(merged)
        dx, du, do, dl, dlive = self._sorted_mixed(dkeys, du, do, dl, dlive)
        cuts = np.searchsorted(dx >> np.uint64(64 - _SHARD_BITS), np.arange(_NSHARDS + 1, dtype=np.uint64))
        for s in range(_NSHARDS):
            with self._mlock:
                a, cap = self._main.arena, self._main.arena.cap
                base, cnt = self._region[s] * cap, self._count[s]
                keep = a.units[base:base + cnt] != DEAD
                cols = [c[base:base + cnt][keep] for c in (a.keys, a.units, a.offsets, a.lengths)]
            lo, hi = int(cuts[s]), int(cuts[s + 1])
            if lo < hi:
                cols = self._overlay(cols, dx[lo:hi], du[lo:hi], do[lo:hi], dl[lo:hi], dlive[lo:hi])
            yield (s, *cols)

    @staticmethod
    def _overlay(cols: list[np.ndarray], dx: np.ndarray, du: np.ndarray, do: np.ndarray, dl: np.ndarray,
                 dlive: np.ndarray) -> list[np.ndarray]:
        """Sorted columns with sorted unique changes applied (a change wins; live=False removes)."""
        x = cols[0]
        if len(x):
            pos = np.minimum(np.searchsorted(x, dx), len(x) - 1)
            hit = x[pos] == dx
            if hit.any():
                keep = np.ones(len(x), dtype=bool)
                keep[pos[hit]] = False
                cols = [c[keep] for c in cols]
        adds = [dx[dlive], du[dlive], do[dlive], dl[dlive]]
        at = np.searchsorted(cols[0], adds[0])
        n_old, n_add = len(cols[0]), len(adds[0])
        new_pos = at + np.arange(n_add)
        old_pos = np.arange(n_old) + np.cumsum(np.bincount(at, minlength=n_old + 1))[:n_old]
        out = []
        for old, add in zip(cols, adds):
            dst = np.empty(n_old + n_add, dtype=old.dtype)
            dst[old_pos] = old
            dst[new_pos] = add
            out.append(dst)
        return out

    def items(self) -> Iterator[tuple[int, Loc]]:
        arrays = self.export()
        for k, u, o, n in zip(arrays["keys"].tolist(), arrays["units"].tolist(),
                              arrays["offsets"].tolist(), arrays["lengths"].tolist()):
            yield k, Loc(u, o, n)

    def memory_bytes(self) -> int:
        """Resident bytes, estimated: written arena entries (spare included), directory, deltas."""
        with self._wlock:
            m = self._main
            entries = sum(c + self._pad_w for c in self._count) + self._spare_used
            active, frozen = self._deltas
            deltas = len(active) + sum(len(f) for f in frozen)
            return entries * 24 + m.dir.nbytes + deltas * 200  # dict entry + key int + Loc, rough upper bound
