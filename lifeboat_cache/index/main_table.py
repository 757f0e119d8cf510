"""The index's main part: every merged entry, sorted by mixed key, one region per shard (MainTable).

Lookups read it without a lock: `find` reads the published MainView, then re-checks `epoch`, which a
merge bumps before it overwrites a region a slow reader may still be reading or repoints the
directory; on a change the lookup repeats. A merge writes one shard at a time into the one spare
region, and the shard's old region becomes the spare: extra memory during a merge is one shard (1/16),
not a copy of the index.

Locks belong to index.Index: the write lock is handed in (short publishes take it); every method that
writes entries (merge_sorted, merge_shard, install, rebits) runs under the Index's merge lock, which
the caller holds. drop_units and the read-outs run under the write lock, which the caller holds.
"""

from __future__ import annotations

import logging
import math
import threading

import numpy as np

from .arena import MIN_WINDOW, Arena, MainView, buckets_of, dir_dtype, dir_entries, pad, window
from .order import DEAD, SHARDS, SHARD_BITS, shard_cuts, unit_mask

log = logging.getLogger(__name__)

_PER_BUCKET = 4                    # directory: ~2-4 entries per bucket


class MainTable:
    """The sorted, sharded, lock-free-readable part of an Index; see the module docstring."""

    def __init__(self, cap: int, wlock: threading.RLock) -> None:
        self._wlock = wlock
        self.reset(cap)

    def reset(self, cap: int) -> None:
        """Empty, with regions of `cap` entries (fewer if the address space is limited). Under both locks."""
        try:
            arena = Arena(cap)
        except MemoryError:  # address space limited (ulimit -v): start small, grow by copying
            log.warning("lifeboat: cannot reserve %d index entries per shard; starting with 65536", cap)
            cap = 1 << 16
            arena = Arena(cap)
        self._region = list(range(SHARDS))    # region of each shard
        self._count = [0] * SHARDS            # entries of each shard (padding excluded)
        self._dead = [0] * SHARDS             # of those, dropped (unit == DEAD)
        self._spare = SHARDS
        self._spare_used = 0                  # entries written in the spare region (still resident)
        self._drops: list[int] = []           # units dropped since the last publish
        self._ever_dropped = False            # some entry may be DEAD: lookups must check units
        directory = dir_entries(np.arange(SHARDS) * cap, 0, dir_dtype((SHARDS + 1) * cap))
        win = window(arena, MIN_WINDOW)
        for s in range(SHARDS):
            pad(arena, s, s, 0, 0, MIN_WINDOW)
        self._pad_w = MIN_WINDOW              # every region is padded this far (never shrinks)
        self.epoch = 0                        # bumped before a reader could see anything change
        self._main = MainView(arena, directory, SHARD_BITS, win)

    # ------------------------------------------------------------------ read-outs
    def find(self, x: np.ndarray, want_loc: bool) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        """Lookup of mixed keys: (hit, (units, offsets, lengths) or None), repeated until no region it
        read was rewritten meanwhile. Takes no lock, changes nothing."""
        while True:
            epoch = self.epoch
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
            if self.epoch == epoch:
                return hit, locs

    def total(self) -> int:
        """Entries in main, dropped ones included."""
        return sum(self._count)

    def live(self) -> int:
        """Entries in main that are not dropped."""
        return sum(self._count) - sum(self._dead)

    def shard_size(self, s: int) -> int:
        """Entries of shard s in main, dropped ones included."""
        return self._count[s]

    def live_columns(self, s: int) -> list[np.ndarray]:
        """Copies of shard s's live entries: [mixed keys, units, offsets, lengths], in index order."""
        a, cap = self._main.arena, self._main.arena.cap
        base, cnt = self._region[s] * cap, self._count[s]
        keep = a.units[base:base + cnt] != DEAD
        return [c[base:base + cnt][keep] for c in a.columns()]

    def resident_bytes(self) -> int:
        """Resident bytes, estimated: written arena entries (spare included) and the directory."""
        entries = sum(c + self._pad_w for c in self._count) + self._spare_used
        return entries * 24 + self._main.dir.nbytes

    def layout(self) -> dict[str, object]:
        """Shape figures (tests, diagnostics): entries per region, directory bits, lookup window, and
        per shard the entries and dropped entries."""
        m = self._main
        return {"cap": m.arena.cap, "bits": m.bits, "window": m.win[0], "counts": list(self._count),
                "dead": list(self._dead)}

    # ------------------------------------------------------------------ drops (under the write lock)
    def drop_units(self, ids: np.ndarray, dk: np.ndarray) -> int:
        """Mark every main entry of these units (sorted unique uint32) DEAD. Returns how many live
        entries that forgot, not counting keys in `dk` (sorted mixed keys a delta overrides)."""
        self._ever_dropped = True  # before any DEAD mark, so no lookup skips the unit check
        a, cap, w = self._main.arena, self._main.arena.cap, self._pad_w
        n = 0
        for s in range(SHARDS):
            base, cnt = self._region[s] * cap, self._count[s]
            col = a.units[base:base + cnt + w]
            hit = np.flatnonzero(unit_mask(col, ids))
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
        return n

    # ------------------------------------------------------------------ merges (under the merge lock)
    def merge_sorted(self, x: np.ndarray, units: np.ndarray, offs: np.ndarray, lens: np.ndarray,
                     live: np.ndarray, *, if_absent: bool) -> None:
        """Apply sorted unique mixed keys (live=False: removal) to main, shard by shard."""
        self.rebits(extra=int(live.sum()))  # size the directory for the result first
        cuts = shard_cuts(x)
        for s in range(SHARDS):
            a, b = int(cuts[s]), int(cuts[s + 1])
            if a == b:
                continue
            self.merge_shard(s, x[a:b], units[a:b], offs[a:b], lens[a:b], live[a:b], if_absent)

    def merge_shard(self, s: int, dx: np.ndarray, du: np.ndarray, do: np.ndarray, dl: np.ndarray,
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
        olds = [c[base:base + cnt] for c in a.columns()]
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
        starts, sizes = buckets_of(olds[0], ax, s, m.bits)
        wneed = max(int(sizes.max()), 1)
        w = max(self._pad_w, wneed)
        if max([n_new] + self._count) + w > a.cap:
            self._grow(max([n_new] + self._count) + w)
            m, a = self._main, self._main.arena  # `olds` still view the old arena, which stays intact
        sp = self._spare
        sb = sp * a.cap
        self.epoch += 1  # a reader that started before may still be reading the spare's old contents
        for col, vals, add in zip(a.columns(), olds, (ax, du[dlive], do[dlive], dl[dlive])):
            dst = col[sb:sb + n_new]
            dst[old_pos] = vals
            dst[new_pos] = add
        del olds
        self._publish(a, m, s, sp, n_new, starts, mark, w, wneed)

    def install(self, s: int, x: np.ndarray, units: np.ndarray, offs: np.ndarray, lens: np.ndarray) -> None:
        """Write an empty shard's entries (sorted mixed keys of shard s) into the spare region, then
        publish it."""
        n = len(x)
        m = self._main
        a = m.arena
        with self._wlock:
            mark = len(self._drops)
        starts, sizes = buckets_of(x, np.empty(0, dtype=np.uint64), s, m.bits)
        wneed = max(int(sizes.max()), 1)
        w = max(self._pad_w, wneed)
        if max([n] + self._count) + w > a.cap:
            self._grow(max([n] + self._count) + w)
            m, a = self._main, self._main.arena
        if bool((units == DEAD).any()):
            self._ever_dropped = True  # before the publish: lookups must check units from then on
        sp = self._spare
        sb = sp * a.cap
        self.epoch += 1  # a reader that started before may still be reading the spare's old contents
        for col, vals in zip(a.columns(), (x, units, offs, lens)):
            col[sb:sb + n] = vals
        self._publish(a, m, s, sp, n, starts, mark, w, wneed)

    def _publish(self, a: Arena, m: MainView, s: int, sp: int, n: int, starts: np.ndarray, mark: int, w: int,
                 wneed: int) -> None:
        """Make the spare region `sp` (n sorted entries of shard s, written) the shard's region: pad it,
        apply the drops that came meanwhile, repoint the directory, and the old region becomes the spare."""
        sb = sp * a.cap
        pad(a, s, sp, n, 0, w)
        with self._wlock:
            self._apply_drops(a, [(sp, n)], mark, w)
            # count, don't derive: a drop may have marked entries while they were being copied
            dead = int(np.count_nonzero(a.units[sb:sb + n] == DEAD))
            self._widen(w, wneed)
            self.epoch += 1
            bps = 1 << (m.bits - SHARD_BITS)
            m.dir[s * bps:(s + 1) * bps] = dir_entries(starts, sb, m.dir.dtype)
            old = self._region[s]
            self._spare_used = self._count[s] + self._pad_w
            self._region[s], self._spare = sp, old
            self._count[s], self._dead[s] = n, dead
            self._drops = []

    def _apply_drops(self, a: Arena, regions: list[tuple[int, int]], mark: int, w: int) -> int:
        """Under the write lock: re-apply drop_units calls that raced with a copy into these regions.

        Returns how many real (not padding) entries this newly marked dead."""
        n = 0
        if len(self._drops) <= mark:
            return 0
        ids = np.unique(np.array(self._drops[mark:], dtype=np.int64)).astype(np.uint32)
        for r, cnt in regions:
            col = a.units[r * a.cap:r * a.cap + cnt + w]
            hit = np.flatnonzero(unit_mask(col, ids))
            col[hit] = DEAD
            n += int((hit < cnt).sum())
        return n

    def _widen(self, pad_w: int, win: int) -> None:
        """Under the write lock: pad every published region to pad_w, then let lookups use a window >= win."""
        m = self._main
        if pad_w > self._pad_w:
            for s in range(SHARDS):
                pad(m.arena, s, self._region[s], self._count[s], self._pad_w, pad_w)
            self._pad_w = pad_w
        if win > m.win[0]:
            m.win = window(m.arena, win)

    def _grow(self, need: int) -> None:
        """Copy main into a larger arena (past DEFAULT_CAP entries per shard only; rare)."""
        m = self._main
        a = m.arena
        cap = a.cap
        while cap < need + 1:
            cap *= 4
        log.info("lifeboat: index arena grows to %d entries per shard", cap)
        b = Arena(cap)
        with self._wlock:
            mark = len(self._drops)
        w = self._pad_w
        for s in range(SHARDS):
            r, cnt = self._region[s], self._count[s]
            for src, dst in zip(a.columns(), b.columns()):
                dst[r * cap:r * cap + cnt + w] = src[r * a.cap:r * a.cap + cnt + w]
        directory, _ = self._dir_for(m.bits, b)
        with self._wlock:  # drops were counted by drop_units; only their marks must reach the copy
            self._apply_drops(b, [(self._region[s], self._count[s]) for s in range(SHARDS)], mark, w)
            self.epoch += 1
            self._main = MainView(b, directory, m.bits, window(b, m.win[0]))
            self._spare_used = 0

    def _dir_for(self, bits: int, a: Arena | None = None) -> tuple[np.ndarray, int]:
        """A directory with `bits` for the current regions (of arena a), and the window it needs."""
        a = a or self._main.arena
        bps = 1 << (bits - SHARD_BITS)
        dtype = dir_dtype((SHARDS + 1) * a.cap)
        directory = np.empty(SHARDS * bps, dtype=dtype)
        wneed = 1
        empty = np.empty(0, dtype=np.uint64)
        for s in range(SHARDS):
            base = self._region[s] * a.cap
            if not self._count[s]:  # every bucket starts at the (padded) region's start
                directory[s * bps:(s + 1) * bps] = base
                continue
            starts, sizes = buckets_of(a.keys[base:base + self._count[s]], empty, s, bits)
            directory[s * bps:(s + 1) * bps] = dir_entries(starts, base, dtype)
            wneed = max(wneed, int(sizes.max()))
        return directory, wneed

    def rebits(self, extra: int = 0) -> None:
        """Resize the directory once the index (+ extra coming) has grown or shrunk 2x."""
        total = sum(self._count) + extra
        want = max(SHARD_BITS, math.ceil(math.log2(total / _PER_BUCKET)) if total >= _PER_BUCKET else 0)
        if self._main.bits - 1 <= want <= self._main.bits:
            return
        directory, wneed = self._dir_for(want)
        wneed = max(wneed, MIN_WINDOW)
        if max(self._count) + max(wneed, self._pad_w) > self._main.arena.cap:
            self._grow(max(self._count) + max(wneed, self._pad_w))
            directory, wneed = self._dir_for(want)
            wneed = max(wneed, MIN_WINDOW)
        with self._wlock:
            self._widen(wneed, 0)
            self.epoch += 1
            self._main = MainView(self._main.arena, directory, want, window(self._main.arena, wneed))
