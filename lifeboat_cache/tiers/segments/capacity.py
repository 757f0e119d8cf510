"""Capacity gc of a segment directory with retention: evict, keep whole or reinsert, unit by unit.

The queue is the evictable units in order of position (retention/access.py: where a unit was put when
kept, else its age). For the unit at the head, retention/policy.py decides from the records read since
they were written: evict it, keep it whole (it goes to the tail), or rewrite its read records through
the keeper lane and then evict it. The keys of the records that go are told to the ghost (which pages
were evicted, and when: retention/ghost.py). Crash safety is the store's: a reinserted record is written and
indexed before its old unit is unlinked, so a crash in between leaves two valid copies, never none;
only records the index still points at are rewritten (a purged, replaced or quarantined one is not).
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Callable

import numpy as np

from ...index import Index
from ...metrics import Counters
from ...retention import (
    EVICT, KEEP, REINSERT, RETENTION_COUNTERS, AccessTable, Ghost, RewriteBudget, Row, gone_keys, judge, keep_whole,
    tail_position)
from .eviction import EvictionPolicy
from .format import read_table, unit_ms
from .units import Unit, UnitTable

if TYPE_CHECKING:
    from .writers import Writers

COUNTERS = ("evicted_segments", "evicted_bytes", *RETENTION_COUNTERS)


class Evictor:
    """Runs capacity gc for one directory, one pass at a time: a caller that finds one running waits for it
    (then runs its own, usually finding nothing left to do), so writes never outrun eviction."""

    def __init__(self, table: UnitTable, writers: "Writers", index: Index, policy: EvictionPolicy,
                 access: AccessTable, budget: RewriteBudget, counters: Counters,
                 log_once: Callable[..., bool], ghost: Ghost | None = None) -> None:
        self.table, self.writers, self.index, self.policy = table, writers, index, policy
        self.ghost = ghost if ghost is not None else Ghost()
        self.access, self.budget, self.counters, self._log_once = access, budget, counters, log_once
        self._running = threading.Lock()

    def evict(self, limit: int) -> int:
        """Free units until the pages' bytes (writers.projected_bytes: open segments included) fit `limit`.
        Seals idle open segments early when only they are left. Returns bytes freed."""
        with self._running:
            return self._evict(limit)

    def _evict(self, limit: int) -> int:
        freed, sealed_early, kept = 0, False, 0
        while True:
            with self.table.lock:
                if self.writers.projected_bytes() <= limit:
                    return freed
                units = [u for u in self.table.live() if self.policy.evictable(u)]
                if not units and sealed_early:
                    return freed
                victim = min(units, key=lambda u: self.access.rank(u.name, unit_ms(u.name))) if units else None
            if victim is None:
                sealed_early = True
                self.writers.seal_idle()  # outside the lock: a seal's I/O must not hold up readers
                continue
            # every keep lowers counts, so this ends; the bound only stops a pathological loop early
            action, rows, unread, table = self._choose(victim, keep_allowed=kept <= 4 * len(units))
            if action == KEEP:
                kept += 1
                keep_whole(self.access, self.counters, victim.name, len(rows))
                continue
            if action == REINSERT:
                self._reinsert(victim, rows)
            elif rows:
                self.counters.add("retention_over_budget_records", len(rows))
            gone = [] if table is None else gone_keys(table, victim.id, self.index,
                                                      rows if action == REINSERT else [])
            if not self._unlink(victim):
                return freed
            self.ghost.evicted(gone, self.index.held())
            self.counters.add("evicted_unread_records", unread)
            freed += victim.size

    def _choose(self, victim: Unit, *, keep_allowed: bool) -> tuple[str, list[Row], int, np.ndarray | None]:
        """The policy's action for the victim, its read records still current in the index (rows), how
        many of its current records were not read, and its trailer table (None: unreadable)."""
        hits = self.access.hits_of(victim.name)
        table = self._table(victim)
        if table is None:
            return EVICT, [], 0, None
        return (*judge(table, victim.id, victim.size, self.index, hits, self.budget, keep_allowed=keep_allowed),
                table)

    def _table(self, unit: Unit) -> np.ndarray | None:
        """The victim's trailer table (None: no valid trailer, gone, or unreadable: evict it as it is)."""
        with self.table.reading(unit.name) as fd:
            if fd is None:
                return None
            try:
                return read_table(fd, unit.size)
            except OSError:
                return None

    def _reinsert(self, victim: Unit, rows: list[Row]) -> None:
        """Rewrite the read records through the keeper lane (write, then index), carrying their counts
        less one. A record that cannot be read or written is left to go with its unit."""
        hits = self.access.hits_of(victim.name)
        records, counts = [], []
        with self.table.reading(victim.name) as fd:
            if fd is None:
                return
            for key, off, digest, length in rows:
                try:
                    data = os.pread(fd, length, off)
                except OSError:
                    continue
                if len(data) == length:
                    records.append((key, digest, [data], length))
                    counts.append(hits.get(off, 1) - 1)
        done = 0
        born = unit_ms(victim.name)
        while done < len(records):
            try:
                locs, _, err = self.writers.append_part(records, done, kept_ms=born)
            except OSError as e:
                locs, err = [], e
            unit = self.table.get(locs[0].unit) if locs else None
            if unit is not None:  # one keeper segment per append_part call; it goes to the tail now
                self.access.place(unit.name, tail_position())
                self.access.carry(unit.name, {loc.offset: c for loc, c in zip(locs, counts[done:]) if c > 0})
            done += len(locs)
            n = sum(loc.length for loc in locs)
            self.budget.spend(n)
            self.counters.add("retention_reinserted_records", len(locs))
            self.counters.add("retention_rewritten_bytes", n)
            if err is not None:
                self._log_once(f"reinsert:{err.errno}", "lifeboat: cannot keep read records of %s (%s); they are "
                                                        "evicted with it", victim.path, err)
                return

    def _unlink(self, victim: Unit) -> bool:
        try:
            os.unlink(victim.path)
        except FileNotFoundError:
            pass
        except OSError as e:
            self._log_once(f"evict:{e.errno}", "lifeboat: cannot evict %s: %s", victim.path, e)
            return False
        self.table.drop(victim)
        self.counters.add("evicted_segments")
        self.counters.add("evicted_bytes", victim.size)
        return True
