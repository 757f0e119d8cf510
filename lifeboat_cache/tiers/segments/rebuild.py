"""Rebuilding a directory's index from its files: listing, scans, catch-up, batched inserts.

A refresh reconciles the unit table with the directory listing and indexes what is new: a sealed
segment from its trailer, an unsealed one (another writer's open segment, or one a crash left) by a
walk record by record (walk.py), which skips holes and bad records and resyncs on the next record.

Invariants: write, then index; a scan never overwrites a newer index entry (insert-if-absent); no
file with intact records after a damaged one is ever truncated.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable, Protocol

import numpy as np

from ...fsio import ForeignFile, open_file
from ...index import Index
from ...metrics import Counters
from ...records import framing, index_key
from .eviction import SharingPolicy
from .format import SEGMENT_SUFFIX, parse_name, process_alive, read_table
from ..base import Rank, settle_twins
from .quarantine import Quarantine
from .units import Unit, UnitTable
from .walk import Walk, walk

log = logging.getLogger(__name__)

BATCH_MIN = 1 << 16  # entries per bulk index insert during the initial rebuild (at least)
# ... and at most this many, or an eighth of what is indexed when that is more: a batch's columns
# (24 B an entry) are the rebuild's memory above the index. Measured on a 10M-page crash reopen (no
# snapshot): peak 48 -> 39 B/page resident, the same 2.7 s to the full index.
BATCH_MAX = 1 << 21
DAMAGE_HEAL_S = 30.0  # a hole younger than this may be a write in flight: rewalk from it


class ScanOwner(Protocol):
    """What a scan asks of the directory it indexes (SegmentDir)."""

    def own_names(self) -> set[str]: ...

    def after_refresh(self) -> None: ...

    def foreign(self, name: str, why: str) -> None: ...

    def log_once(self, key: str, msg: str, *args: object) -> bool: ...


class Scanner:
    """Indexes a directory's segments: listing, refresh, scan of one unit, orphan seal, batched inserts.

    `sharing` scans a unit that is neither ours nor sealed (SharingPolicy.scan; nfs probes another
    host's open segment instead) and seals an orphan (its trailer rule). `owner` is the directory:
    the names of its own open segments, what runs after every refresh (purge rules, capacity gc), and
    its reports of planted files and of trouble (once per key).
    """

    def __init__(self, table: UnitTable, index: Index, counters: Counters, quarantine: Quarantine, *,
                 read_only: bool, orphan_idle_s: float, sharing: SharingPolicy, owner: ScanOwner,
                 rank: Rank | None = None) -> None:
        self.table, self.index, self.counters, self.quarantine = table, index, counters, quarantine
        self.rank = rank  # settles twins (base.settle_twins): the copy of a page that opens is the one indexed
        self.path = table.path
        self.read_only, self.orphan_idle_s = read_only, orphan_idle_s
        self.sharing, self.owner = sharing, owner
        self._listed_sig: dict[str, tuple[int, int]] = {}  # segment name -> (size, st_mtime_ns) listed
        table.on_drop(lambda u: self._listed_sig.pop(u.name, None))
        # the initial rebuild batches index inserts (one merge per batch, not per segment): batches of
        # at least BATCH_MIN entries that double as the index grows, so the first hits come early,
        # up to BATCH_MAX (memory)
        self._batch_owner: int | None = None  # thread id of the rebuild while it batches
        self._batch: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self._batch_n = 0
        self.batched = 0  # entries indexed by bulk inserts so far (a loaded snapshot counts its own)

    # ------------------------------------------------------------------ listing
    def listed_sig(self, name: str) -> tuple[int, int] | None:
        """(size, st_mtime_ns) of segment `name` at the last listing."""
        return self._listed_sig.get(name)

    def list(self) -> dict[str, int]:
        """Segment files of the directory (name -> size); symlinks and non-files are skipped."""
        out: dict[str, int] = {}
        try:
            it = os.scandir(self.path)
        except FileNotFoundError:
            if self.read_only:
                return out  # stats of a store that was never written
            raise
        with it:
            for e in it:
                if not e.name.endswith(SEGMENT_SUFFIX):
                    continue
                try:
                    regular = e.is_file(follow_symlinks=False)
                    st = e.stat(follow_symlinks=False) if regular else None
                    size = st.st_size if st is not None else 0
                    if st is not None:
                        self._listed_sig[e.name] = (st.st_size, st.st_mtime_ns)
                except FileNotFoundError:
                    continue
                if not regular or parse_name(e.name) is None:
                    self.owner.foreign(e.name, "a symlink, a non-regular file or a file not named like a segment")
                    continue
                out[e.name] = size
        return out

    def refresh(self, initial: bool) -> None:
        """Reconcile the unit table with the directory listing and index what is new."""
        known = self.table.next_id  # a unit added after the listing began cannot be missing from it
        try:
            listing = self.list()
        except OSError as e:
            self.owner.log_once(f"list:{e.errno}", "lifeboat: cannot list %s: %s", self.path, e)
            return
        with self.table.lock:
            own_names = self.owner.own_names()
            gone = [u for u in self.table.live()
                    if u.name not in listing and u.name not in own_names and u.id < known]
        self.table.drop_many(gone)
        for name in sorted(listing):
            with self.table.lock:
                unit = self.table.named(name)
                if unit is None:
                    unit = self.table.add(name)
                if unit.own or unit.sealed:
                    continue
            if initial:
                self.adopt_if_orphan(unit)
            self.scan(unit)
        self.flush_batch()  # before eviction may drop a unit whose entries are still batched
        self.owner.after_refresh()

    def rescan_open(self, catches_up: Callable[[Unit], bool]) -> None:
        """Read the new bytes of the other processes' open segments already known (a catch-up)."""
        with self.table.lock:
            grown = [u for u in self.table.live() if not u.own and not u.sealed and catches_up(u)]
        for u in grown:
            self.scan(u)

    # ------------------------------------------------------------------ indexing
    def index_entries(self, unit: Unit, keys: np.ndarray, offs: np.ndarray, lens: np.ndarray) -> int:
        """Insert a unit's records (if absent), leaving out quarantined ones. Returns how many."""
        if self.quarantine and len(offs):
            bad = self.quarantine.offsets_in({unit.name})
            if bad:
                keep = ~np.isin(offs.astype(np.uint64), np.fromiter(bad, dtype=np.uint64, count=len(bad)))
                keys, offs, lens = keys[keep], offs[keep], lens[keep]
        if len(keys):
            self.insert(np.asarray(keys, np.int64), np.full(len(keys), unit.id, np.uint32),
                        np.asarray(offs, np.uint64), np.asarray(lens, np.uint32))
        return len(keys)

    def begin_batching(self) -> None:
        """From now on, inserts from this thread are batched (the initial rebuild) until end_batching."""
        self._batch_owner = threading.get_ident()

    def end_batching(self) -> None:
        try:
            self.flush_batch()
        finally:
            self._batch_owner = None

    def insert(self, keys: np.ndarray, units: np.ndarray, offs: np.ndarray, lens: np.ndarray) -> None:
        """Index entries if absent: at once, or batched while this thread runs the initial rebuild."""
        if self._batch_owner != threading.get_ident():
            self.index.insert_arrays(*settle_twins(self.index, self.rank, self.read_record, keys, units, offs, lens),
                                     if_absent=True)
            return
        pos = 0
        while pos < len(keys):  # a big input (a snapshot) goes in growing pieces too
            end = pos + max(1, self._batch_limit() - self._batch_n)
            # compact copies of trailer columns (strided views would keep whole 32 B/row tables alive)
            self._batch.append(tuple(np.ascontiguousarray(c[pos:end]) for c in (keys, units, offs, lens)))
            self._batch_n += len(self._batch[-1][0])
            pos = end
            if self._batch_n >= self._batch_limit():
                self.flush_batch()

    def read_record(self, unit_id: int, offset: int, length: int) -> bytes | None:
        """One record's bytes (a twin to rank), or None when its segment is gone or unreadable."""
        unit = self.table.get(unit_id)
        if unit is None:
            return None
        try:
            fd = self.table.acquire(unit)
        except OSError:
            return None
        try:
            return os.pread(fd, length, offset)
        except OSError:
            return None
        finally:
            self.table.release(unit)

    def _batch_limit(self) -> int:
        return min(max(BATCH_MIN, self.batched), max(BATCH_MAX, self.batched // 8))

    def flush_batch(self) -> None:
        """Index the batched entries in one bulk insert, leaving out units dropped meanwhile."""
        if not self._batch:
            return
        parts, self._batch, self._batch_n = [list(p) for p in self._batch], [], 0
        cols = []
        for i in range(4):  # column by column, each part's column freed once copied: one copy, not two
            cols.append(np.concatenate([p[i] for p in parts]))
            for p in parts:
                p[i] = None
        del parts
        keys, units, offs, lens = cols
        del cols
        with self.table.lock:  # unit ids are small: a table of the live ones, one gather per entry
            alive = np.zeros(max(self.table.next_id, int(units.max()) + 1), bool)
            alive[self.table.live_ids()] = True
        keep = alive[units]
        if not keep.all():
            keys, units, offs, lens = keys[keep], units[keep], offs[keep], lens[keep]
        keys, units, offs, lens = settle_twins(self.index, self.rank, self.read_record, keys, units, offs, lens)
        self.index.insert_arrays(keys, units, offs, lens, if_absent=True)
        self.batched += len(keys)

    def _index_walk(self, unit: Unit, w: Walk) -> None:
        if w.entries:
            keys = np.array([index_key(e[0]) for e in w.entries], np.int64)
            offs = np.array([e[1] for e in w.entries], np.uint64)
            lens = np.array([e[2] for e in w.entries], np.uint32)
            self.counters.add("scan_records", self.index_entries(unit, keys, offs, lens))
        new_damage = [d for d in w.damaged if d not in unit.damaged]
        if new_damage:
            self.counters.add("scan_torn", len(new_damage))
            self.counters.add("scan_damaged_bytes", sum(n for _, n in new_damage))
            unit.damaged.extend(new_damage)

    def _index_table(self, unit: Unit, table: np.ndarray, size: int) -> None:
        self.counters.add("scan_records", self.index_entries(unit, table["key"], table["offset"], table["length"]))
        unit.sealed_at(size, len(table))
        unit.damaged = []

    # ------------------------------------------------------------------ scanning
    def open_for_scan(self, unit: Unit, opener: Callable[[], int]) -> int | None:
        """opener() for a scan; a vanished or foreign file drops the unit, other errors are logged once."""
        try:
            return opener()
        except FileNotFoundError:
            self.table.drop(unit)
        except ForeignFile as e:
            self.owner.foreign(unit.name, str(e))
            self.table.drop(unit)
        except OSError as e:
            self.owner.log_once(f"open:{unit.name}", "lifeboat: cannot open %s: %s", unit.path, e)
        return None

    def scan(self, unit: Unit) -> None:
        """Index what is new in a unit (through the sharing policy when it is another writer's open one)."""
        if unit.own or unit.sealed:
            self.scan_local(unit)
        else:
            self.sharing.scan(unit, self.scan_local)

    def scan_local(self, unit: Unit) -> None:
        """Index a unit as on a local directory: its trailer, or a walk of its new bytes."""
        fd = self.open_for_scan(unit, lambda: self.table.acquire(unit))
        if fd is None:
            return
        try:
            size = os.fstat(fd).st_size
            unit.size = size
            if size == unit.walked:
                return
            if unit.scanned == 0 and unit.walked == -1:
                self.counters.add("scanned_segments")  # first read of this segment (not in the snapshot)
            table = read_table(fd, size)
            if table is not None:
                self._index_table(unit, table, size)
                return
            start = unit.scanned
            w = walk(fd, start, size)
            self._index_walk(unit, w)
            # damage may be a write in flight: walk it again while young, then walk past it
            now = time.monotonic()
            young = False
            for off, _ in w.damaged:
                young |= now - unit.damage_seen.setdefault(off, now) < DAMAGE_HEAL_S
            # young damage: rewalk on the next scan even if the size stays (the hole may be filled in place)
            unit.scanned, unit.walked = (w.resume_at if young else w.end), (-1 if young else size)
            # the headers walked up to where the next walk starts (records past it are walked again)
            walked = sum(1 for e in w.entries if e[1] < unit.scanned)
            unit.framing = (unit.framing if start else 0) + framing(walked, sealed=False)
        except OSError as e:
            self.owner.log_once(f"scan:{unit.name}", "lifeboat: scan of %s failed: %s", unit.path, e)
        finally:
            self.table.release(unit)

    def writer_dead_here(self, unit: Unit) -> bool:
        """Whether the unit's writer is a process of this host that no longer exists."""
        parsed = parse_name(unit.name)
        if parsed is None or parsed[0] != self.table.host or parsed[1] == os.getpid():
            return False
        return not process_alive(parsed[1])

    def adopt_if_orphan(self, unit: Unit) -> None:
        """Seal a segment left unsealed by a dead writer on this host.

        Every intact record is kept (holes and bad records stay where they are, unlisted); only
        bytes after the last intact record are cut before the trailer is written.
        """
        if self.read_only or not self.writer_dead_here(unit):
            return
        try:  # pids are per namespace: only a segment idle for a while is surely abandoned
            st = os.stat(unit.path, follow_symlinks=False)
            if time.time() - st.st_mtime < self.orphan_idle_s:
                return
        except OSError:
            return
        try:
            fd = open_file(unit.path, os.O_RDWR)
        except ForeignFile as e:
            self.owner.foreign(unit.name, str(e))
            return
        except OSError as e:
            self.owner.log_once(f"adopt:{unit.name}", "lifeboat: could not seal orphan segment %s: %s", unit.name, e)
            return
        try:
            size = os.fstat(fd).st_size
            if read_table(fd, size) is not None:
                return  # sealed after all; the scan reads its trailer
            w = walk(fd, 0, size)
            self._index_walk(unit, w)
            if size > w.end:
                os.ftruncate(fd, w.end)
            end = self.sharing.write_trailer(fd, w.end, w.entries)
            unit.sealed_at(end, len(w.entries))
            log.info("lifeboat: sealed orphan segment %s of dead writer pid %d (%d records, %d damaged "
                     "regions skipped)", unit.name, parse_name(unit.name)[1], len(w.entries),  # type: ignore[index]
                     len(w.damaged))
        except OSError as e:
            self.owner.log_once(f"adopt:{unit.name}", "lifeboat: could not seal orphan segment %s: %s", unit.name, e)
        finally:
            os.close(fd)
