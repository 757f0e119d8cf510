"""Compact in-memory index: 64-bit key -> Loc(unit, offset, length), lock-free lookups at 10M+ pages.

Why this layout (measured in lifeboat_cache/bench/index_scale.py): a 300-key `contains` must stay
well under 0.2 ms at 10M pages, also while another thread writes, in <= 40 B per page, never
copying the whole index at once.

* Main (main_table.MainTable over arena.py's columns): every entry sorted by its *mixed* key (key *
  an odd constant mod 2**64: a bijection that spreads even sequential keys; order.py), split by the
  mixed key's top 4 bits into 16 shards. Each shard lives in one region of four column arenas (uint64
  key, uint32 unit, uint64 offset, uint32 length: 24 B per entry). The arenas are anonymous mmaps
  reserved up front, so only written pages are resident and a growing shard is never copied. A
  directory (top `bits` of the mixed key -> first position, ~2-4 entries per bucket) makes a batch
  lookup one gather of a `w`-key row per key from a strided view of the key arena (`w` = the largest
  bucket); `w`+ copies of each shard's last entry pad its region so a row never reads stale memory.
* Deltas (deltas.py): recent changes sit in a dict (`active`; None = removed). A full one is frozen
  (never written again) and merged into main by a short-lived background thread, one shard at a time,
  into the one spare region; the shard's old region becomes the spare. Extra memory during a merge is
  one shard (1/16), not a copy of the index.
* Snapshots (tiers/segments/snapshot_file.py) store each shard in this order: `export_shards` yields them,
  `insert_sorted_shard` publishes one whole without a sort or merge (a miss until it is in).

Concurrency: lookups take no lock. They read the published delta tuple, then main, then re-check
main's epoch, which the merger bumps before it overwrites a region a slow reader may still be reading
or repoints the directory; on a change the lookup repeats. Writers serialise on `_wlock` (dict writes,
short publishes); merges, bulk inserts and exports on `_mlock` (taken before `_wlock`).
`contains` / `get` never change anything, so `exists` cannot disturb eviction.

This module is the Index itself (its lookups, writes, merge thread and exports) and the import path of
every public name of the index family: other code imports from here, not from index_*.
"""

from __future__ import annotations

import threading
from typing import Iterable, Iterator

import numpy as np

from .arena import DEFAULT_CAP
from .deltas import MISSING, bulk_vs_deltas, delta_arrays, in_deltas, merged_deltas, overlay, resolve, sorted_mixed
from .main_table import MainTable
from .order import DEAD, SHARDS, SHARD_BITS, Loc, member, mix_keys, shard_cuts, unmix_keys

__all__ = ["DEFAULT_DELTA_LIMIT", "EXPORT_VERSION", "Index", "MAX_DELTA_LIMIT"]

DEFAULT_DELTA_LIMIT = 16384   # smallest active delta that is frozen and merged (grows with the index)
MAX_DELTA_LIMIT = 131072      # ~26 MB of dict per delta at most
EXPORT_VERSION = 2            # export(): dict of "keys", "units", "offsets", "lengths", any order


class Index:
    """Thread-safe map of int64 keys to Locs. Write-then-index: insert only after the bytes are written."""

    initial_cap = DEFAULT_CAP  # entries reserved per region; a subclass may start smaller (tests)

    def __init__(self, delta_limit: int | None = None) -> None:
        self._fixed_limit = delta_limit
        self._wlock = threading.RLock()
        self._mlock = threading.Lock()
        self._table = MainTable(self.initial_cap, self._wlock)
        self._deltas: tuple[dict[int, Loc | None], tuple[dict[int, Loc | None], ...]] = ({}, ())
        self._merger: threading.Thread | None = None
        self._changes = 0  # entries written or dropped so far (under _wlock): when held() counts again
        self._held: tuple[int, int] | None = None  # (len, _changes when counted)

    # ------------------------------------------------------------------ lookups (never mutate, no lock)
    def contains(self, keys: np.ndarray) -> np.ndarray:
        """Per-key presence for an int64 array; no I/O, no side effects, no lock."""
        keys = np.asarray(keys, dtype=np.int64)
        active, frozen = self._deltas
        hit, _ = self._table.find(mix_keys(keys), want_loc=False)
        if active or frozen:
            for i in in_deltas(keys, active, frozen).tolist():
                v = resolve(int(keys[i]), active, frozen)
                if v is not MISSING:
                    hit[i] = v is not None
        return hit

    def get(self, key: int) -> Loc | None:
        active, frozen = self._deltas
        v = resolve(key, active, frozen)
        if v is not MISSING:
            return v  # type: ignore[return-value]
        return self._main_locs(np.array([key], dtype=np.int64))[0]

    def _main_locs(self, keys: np.ndarray) -> list[Loc | None]:
        hit, locs = self._table.find(mix_keys(keys), want_loc=True)
        assert locs is not None
        return [Loc(u, o, n) if h else None
                for h, u, o, n in zip(hit.tolist(), locs[0].tolist(), locs[1].tolist(), locs[2].tolist())]

    def get_many(self, keys: np.ndarray) -> list[Loc | None]:
        keys = np.asarray(keys, dtype=np.int64)
        active, frozen = self._deltas
        out = self._main_locs(keys)
        if active or frozen:
            for i in in_deltas(keys, active, frozen).tolist():
                v = resolve(int(keys[i]), active, frozen)
                if v is not MISSING:
                    out[i] = v  # type: ignore[assignment]
        return out

    def locate(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(found, units, offsets, lengths) per key, as arrays (no Loc objects): vector `get_many`."""
        keys = np.asarray(keys, dtype=np.int64)
        active, frozen = self._deltas
        hit, locs = self._table.find(mix_keys(keys), want_loc=True)
        assert locs is not None
        units, offs, lens = locs
        if active or frozen:
            for i in in_deltas(keys, active, frozen).tolist():
                v = resolve(int(keys[i]), active, frozen)
                if v is None:
                    hit[i] = False
                elif v is not MISSING:
                    hit[i] = True
                    units[i], offs[i], lens[i] = v.unit, v.offset, v.length  # type: ignore[union-attr]
        return hit, units, offs, lens

    def __len__(self) -> int:
        with self._wlock:
            active, frozen = self._deltas
            main_live = self._table.live()
            merged = merged_deltas(active, frozen)
            if not merged:
                return main_live
            dk = np.fromiter(merged.keys(), dtype=np.int64, count=len(merged))
            in_main, _ = self._table.find(mix_keys(dk), want_loc=False)
            return main_live - int(in_main.sum()) + sum(v is not None for v in merged.values())

    def held(self) -> int:
        """len(self), counted again only after more than max(64, last count / 16) entries changed (so off by
        at most that): for what asks on every write (the ghost's span), where len() would merge every delta
        under the write lock, holding the GIL from SGLang's scheduler thread 1.2 ms at 16k delta entries."""
        with self._wlock:
            if self._held is None or self._changes - self._held[1] > max(64, self._held[0] // 16):
                self._held = (len(self), self._changes)
            return self._held[0]

    # ------------------------------------------------------------------ mutations
    def _limit(self) -> int:
        if self._fixed_limit is not None:
            return self._fixed_limit
        return max(DEFAULT_DELTA_LIMIT, min(MAX_DELTA_LIMIT, self._table.total() // 128))

    def insert(self, key: int, loc: Loc) -> None:
        with self._wlock:
            self._deltas[0][key] = loc
            self._changes += 1
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
            self._changes += n
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
            self._changes += 1
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
                keys, units, offs, lens, live = delta_arrays(f)
                self._table.merge_sorted(*sorted_mixed(keys, units, offs, lens, live), if_absent=False)
                with self._wlock:
                    active, frozen = self._deltas
                    assert frozen[-1] is f
                    self._deltas = (active, frozen[:-1])
                self._table.rebits()

    def settle(self) -> None:
        """Merge all pending deltas now (tests, benchmarks); lookups never need it."""
        with self._wlock:
            active, frozen = self._deltas
            if active:
                self._deltas = ({}, (active,) + frozen)
        self._drain()

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
        x = mix_keys(keys)
        order = np.argsort((x >> np.uint64(64 - SHARD_BITS)).astype(np.uint8), kind="stable")
        cuts = shard_cuts(x[order])
        table = self._table
        with self._mlock:
            table.rebits(extra=len(x))  # size the directory for the result first
            for s in range(SHARDS):
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
                    sx, su, so, sl, sv = bulk_vs_deltas(*self._deltas, xs, units[idx][o], offsets[idx][o],
                                                        lengths[idx][o], np.ones(len(xs), dtype=bool), if_absent)
                    if len(sx):
                        table.merge_shard(s, sx, su, so, sl, sv, if_absent)
                    self._changes += len(sx)
            table.rebits()

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
        if not 0 <= s < SHARDS or int(x[0] >> np.uint64(64 - SHARD_BITS)) != s \
                or int(x[-1] >> np.uint64(64 - SHARD_BITS)) != s or (n > 1 and not bool((x[1:] > x[:-1]).all())):
            raise ValueError(f"insert_sorted_shard: keys of shard {s} must be strictly increasing mixed keys "
                             "of that shard")
        units = np.ascontiguousarray(units, dtype=np.uint32)
        offsets = np.ascontiguousarray(offsets, dtype=np.uint64)
        lengths = np.ascontiguousarray(lengths, dtype=np.uint32)
        table = self._table
        with self._mlock:
            table.rebits(extra=max(n, total_hint - table.total()))
            if table.shard_size(s):
                live = units != DEAD
                with self._wlock:
                    sx, su, so, sl, sv = bulk_vs_deltas(*self._deltas, x[live], units[live], offsets[live],
                                                        lengths[live], np.ones(int(live.sum()), dtype=bool), True)
                    if len(sx):
                        table.merge_shard(s, sx, su, so, sl, sv, True)
                    self._changes += len(sx)
                return
            table.install(s, x, units, offsets, lengths)
            with self._wlock:
                self._changes += n

    def drop_unit(self, unit: int) -> int:
        """Forget every entry in a unit (evicted or vanished segment). Returns how many."""
        return self.drop_units([unit])

    def drop_units(self, units: Iterable[int]) -> int:
        """Forget every entry of these units in one pass over the index. Returns how many."""
        ids = np.unique(np.fromiter(units, dtype=np.int64)).astype(np.uint32)
        if not len(ids):
            return 0
        with self._wlock:
            active, frozen = self._deltas
            merged = merged_deltas(active, frozen)
            dk = np.sort(mix_keys(np.fromiter(merged.keys(), dtype=np.int64, count=len(merged))))
            n = self._table.drop_units(ids, dk)
            idset = set(ids.tolist())
            for k, v in merged.items():
                if v is not None and v.unit in idset:
                    active[k] = None
                    n += 1
            self._changes += n
            return n

    def clear(self) -> None:
        with self._mlock, self._wlock:
            self._table.epoch += 1
            self._table.reset(self.initial_cap)
            self._deltas = ({}, ())  # a running merger finds no frozen delta and exits
            self._held = None
            self._table.epoch += 1

    # ------------------------------------------------------------------ persistence helpers
    def export(self) -> dict[str, np.ndarray]:
        """Live entries as arrays (format version EXPORT_VERSION: keys int64, units uint32, offsets
        uint64, lengths uint32; in no particular order). Merges nothing, blocks no lookup or insert."""
        with self._mlock:
            with self._wlock:
                active, frozen = self._deltas
                merged = merged_deltas(active, frozen)
            parts: list[list[np.ndarray]] = [[], [], [], []]
            for s in range(SHARDS):
                for p, col in zip(parts, self._table.live_columns(s)):
                    p.append(col)
        x, units, offs, lens = (np.concatenate(p) for p in parts)
        keys = unmix_keys(x)
        if merged:
            dk = np.fromiter(merged.keys(), dtype=np.int64, count=len(merged))
            drop = member(keys, dk)
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
            merged = merged_deltas(*self._deltas)
        dkeys, du, do, dl, dlive = delta_arrays(merged)
        dx, du, do, dl, dlive = sorted_mixed(dkeys, du, do, dl, dlive)
        cuts = shard_cuts(dx)
        for s in range(SHARDS):
            with self._mlock:
                cols = self._table.live_columns(s)
            lo, hi = int(cuts[s]), int(cuts[s + 1])
            if lo < hi:
                cols = overlay(cols, dx[lo:hi], du[lo:hi], do[lo:hi], dl[lo:hi], dlive[lo:hi])
            yield (s, *cols)

    def items(self) -> Iterator[tuple[int, Loc]]:
        arrays = self.export()
        for k, u, o, n in zip(arrays["keys"].tolist(), arrays["units"].tolist(),
                              arrays["offsets"].tolist(), arrays["lengths"].tolist()):
            yield k, Loc(u, o, n)

    def memory_bytes(self) -> int:
        """Resident bytes, estimated: written arena entries (spare included), directory, deltas."""
        with self._wlock:
            active, frozen = self._deltas
            deltas = len(active) + sum(len(f) for f in frozen)
            return self._table.resident_bytes() + deltas * 200  # dict entry + key int + Loc, rough upper bound

    def layout(self) -> dict[str, object]:
        """Shape of the main part (tests, diagnostics): "cap" entries reserved per region, directory
        "bits", lookup "window", and per shard "counts" of entries and "dead" (dropped) entries."""
        with self._wlock:
            return self._table.layout()
