"""What retention knows: reads per record since it was written or last kept, and each unit's queue place.

Counts are capped (HIT_CAP; 1 makes a record simply read or not) and go down by one each time their
unit passes the head of the queue and is kept (the clock hand of CLOCK, per record): a record never
read again goes after HIT_CAP passes. A unit kept whole goes a tenth of the way from its last read
to the tail (KEEP_PLACE), so the queue is close to LRU's order with a little credit for having been
kept, and among units at one place the younger go first (`rank`); docs/storage.md, "Retention", says
why. Everything here is a hint: a lost or stale count costs a miss or a rewrite, never a wrong page
(what is served is always verified).
"""

from __future__ import annotations

import threading
import time
from typing import Iterable

HIT_CAP = 1
KEEP_PLACE = 0.1  # a unit kept whole goes this share of the way from its last read to the tail
HEAD = 0  # the position of a unit sent to the head of the queue (before every age)


class AccessTable:
    """Per unit name: record offset -> reads (1..HIT_CAP), and the queue position of units kept whole.

    Thread-safe: io threads count hits while the evictor reads and the publisher exports.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hits: dict[str, dict[int, int]] = {}
        self._order: dict[str, int] = {}
        self._last: dict[str, int] = {}  # unit -> when (ms) one of its records was last read
        self.version = 0  # bumped on every change: a publisher saves only when it moved

    def hit(self, unit: str, offset: int) -> None:
        """Count one read of the record at `offset` of `unit`."""
        self.hit_many({unit: (offset,)})

    def hit_many(self, offsets_by_unit: dict[str, Iterable[int]]) -> None:
        """Count one read of each record at these offsets of these units, under one lock (batch_exists).
        The version moves only when a count does: a batch of records already counted saves nothing."""
        now = int(time.time() * 1000)
        with self._lock:
            for unit, offsets in offsets_by_unit.items():
                counts = self._hits.setdefault(unit, {})
                self._last[unit] = now
                for o in offsets:
                    c = counts.get(o, 0)
                    if c < HIT_CAP:
                        counts[o] = c + 1
                        self.version += 1

    def hits_of(self, unit: str) -> dict[int, int]:
        """The read counts of a unit's records (a copy; records never read are absent)."""
        with self._lock:
            return dict(self._hits.get(unit, {}))

    def position(self, unit: str, default: int) -> int:
        """The unit's place in the queue: where it was put when kept whole, else `default` (its age)."""
        with self._lock:
            return self._order.get(unit, default)

    def rank(self, unit: str, born_ms: int) -> tuple[int, int, str]:
        """The unit's place in the eviction queue (smallest goes first): its position (`born_ms`, its age,
        unless it was placed), then, among units at the same position, the younger first. Units read
        by one request share a position (reads are timed in ms), and the younger hold the deeper pages
        of the prefix: SGLang's radix tree evicts those first too (leaves), and a prefix without its
        tail still serves its head, while a tail without its head serves nothing."""
        return self.position(unit, born_ms), -born_ms, unit

    def keep(self, unit: str, position: int) -> None:
        """The unit was kept whole: it goes KEEP_PLACE of the way from its last read to `position` (the
        tail), so a unit read long ago comes back to the head sooner than one read just now, and each of
        its counts goes down by one."""
        with self._lock:
            last = self._last.get(unit)
            if last is not None and last < position:
                position = last + int(KEEP_PLACE * (position - last))
            counts = self._hits.get(unit, {})
            self._hits[unit] = {o: c - 1 for o, c in counts.items() if c > 1}
            self._order[unit] = position
            self.version += 1

    def to_head(self, unit: str) -> None:
        """Put a unit at the head of the queue: it goes at the next pass unless read first (ghost.py)."""
        with self._lock:
            self._order[unit] = HEAD
            self.version += 1

    def place(self, unit: str, position: int) -> None:
        """Put a unit at `position` in the queue (a segment of reinserted records goes to the tail)."""
        with self._lock:
            self._order[unit] = max(position, self._order.get(unit, position))
            self.version += 1

    def carry(self, unit: str, counts: dict[int, int]) -> None:
        """Records moved into `unit` keep these counts (already lowered by the caller)."""
        if not counts:
            return
        with self._lock:
            mine = self._hits.setdefault(unit, {})
            for o, c in counts.items():
                if c > mine.get(o, 0):
                    mine[o] = min(c, HIT_CAP)
            self.version += 1

    def forget(self, units: Iterable[str]) -> None:
        """Drop what is known of units that are gone (evicted, vanished)."""
        with self._lock:
            for u in units:
                self._hits.pop(u, None)
                self._order.pop(u, None)
                self._last.pop(u, None)
            self.version += 1

    def merge(self, hits: dict[str, dict[int, int]], order: dict[str, int]) -> None:
        """Fold in what another process published (or an earlier run saved): the larger count and the
        later position win, so a merge never makes a record look colder than either side saw it."""
        with self._lock:
            for u, counts in hits.items():
                mine = self._hits.setdefault(u, {})
                for o, c in counts.items():
                    if c > mine.get(o, 0):
                        mine[o] = min(c, HIT_CAP)
            for u, p in order.items():
                if p > self._order.get(u, p - 1):
                    self._order[u] = p
            self.version += 1

    def export(self, units: set[str] | None = None) -> tuple[dict[str, dict[int, int]], dict[str, int]]:
        """(hits, order) copies, limited to `units` when given (the live ones)."""
        with self._lock:
            keep = (lambda u: True) if units is None else units.__contains__
            hits = {u: dict(c) for u, c in self._hits.items() if c and keep(u)}
            order = {u: p for u, p in self._order.items() if keep(u)}
            return hits, order

    def read_records(self) -> int:
        """Records with at least one read not yet used up (what `stats` reports as hot)."""
        with self._lock:
            return sum(len(c) for c in self._hits.values())
