"""The read path of a segment directory: adjacent records of one segment in one preadv.

A location is stale (False, a miss) when its segment was evicted or vanished, the file is short, or a
purge rule covers the record; a real I/O error raises OSError so the store can enter its cooldown.
`preadv_all` is looked up in this module at each read: tests patch `reads.preadv_all` to hold a read.
"""

from __future__ import annotations

from typing import Callable, Sequence

from ...fsio import ForeignFile, preadv_all
from ...index import Loc
from ...metrics import Counters
from ...records import NS_AT
from ...retention import AccessTable
from .eviction import SharingPolicy
from .format import unit_ms
from .purge_filter import PurgeFilter
from .units import UnitTable


class Reader:
    """Reads records of one directory's units (see the module docstring)."""

    def __init__(self, table: UnitTable, purge: PurgeFilter, sharing: SharingPolicy, counters: Counters,
                 foreign: Callable[[str, str], None], access: AccessTable) -> None:
        self.table, self.purge, self.sharing, self.counters = table, purge, sharing, counters
        self.access = access  # each record read whole counts as a read for retention
        self._foreign = foreign

    def read_run(self, locs: Sequence[Loc], bufs: Sequence[Sequence[memoryview]]) -> list[bool]:
        """Read records into their bufs (bufs[k] together hold locs[k].length bytes): one preadv (IOV_MAX
        iovecs a call) per stretch of adjacent records of one segment.

        Per record: True when read whole, False when its location is stale. Raises OSError for real
        I/O errors (the store's cooldown).
        """
        out = [False] * len(locs)
        k = 0
        while k < len(locs):
            j = k + 1
            while (j < len(locs) and locs[j].unit == locs[k].unit
                   and locs[j].offset == locs[j - 1].offset + locs[j - 1].length):
                j += 1
            try:
                self._read_stretch(locs, bufs, k, j, out)
            except OSError as e:
                if not self.sharing.stale_read(e):
                    raise
                unit = self.table.get(locs[k].unit)  # evicted by another host while open here
                if unit is not None:
                    self.table.drop(unit)
                self.counters.add("stale_handles")
            k = j
        return out

    def _read_stretch(self, locs: Sequence[Loc], bufs: Sequence[Sequence[memoryview]], k: int, j: int,
                      out: list[bool]) -> None:
        """Read the adjacent records locs[k:j] (one segment) in one go; mark those read whole in out."""
        unit = self.table.get(locs[k].unit)
        if unit is None:
            return
        try:
            fd = self.table.acquire(unit)
        except FileNotFoundError:
            self.table.drop(unit)
            return
        except ForeignFile as e:
            self._foreign(unit.name, str(e))
            self.table.drop(unit)
            return
        views = [b for r in range(k, j) for b in bufs[r]]
        try:
            n = preadv_all(fd, views, locs[k].offset)
        finally:
            self.table.release(unit)
        blocking = self.purge.active  # purged or expired: not served
        for r in range(k, j):
            whole = locs[r].offset + locs[r].length - locs[k].offset <= n
            out[r] = whole and not (blocking and self.purge.blocks(
                unit_ms(unit.name), bytes(bufs[r][0][NS_AT:NS_AT + 16])))
            if out[r]:
                self.access.hit(unit.name, locs[r].offset)
