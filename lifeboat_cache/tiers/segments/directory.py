"""SegmentDir: one segment directory, the coordinator of its parts (see the folder's docstring).

It wires the unit table, writers, scanner, reader, snapshots and index thread of one directory, runs
capacity gc and the purge rules after each refresh, and is what tiers, purge and the CLI call.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from ...cooldown import LogOnce
from ...fsio import make_dirs, open_file
from ...index import Index, Loc
from ...metrics import Counters
from ...records import Record, framing
from ...retention import HEAD, AccessTable, RewriteBudget, offsets_by_unit
from ..base import Rank
from . import compaction, inspection
from .access_files import AccessFiles
from .capacity import COUNTERS as EVICTION_COUNTERS, Evictor
from .format import unit_ms
from .changes import SEGMENTS, ChangeCounter
from .eviction import EvictionPolicy, SharingPolicy
from .indexer import IndexThread
from .purge_filter import PurgeFilter
from .quarantine import Quarantine
from .reads import Reader
from .rebuild import Scanner
from .settings import DirSettings
from .snapshot_policy import Snapshots
from .units import UnitTable
from .writers import Writers

log = logging.getLogger(__name__)

AUTO_CAPACITY_MAX_BYTES = 64 << 30
OPEN_SHARE = 64  # open segments together may hold at most 1/OPEN_SHARE of the capacity: eviction goes
# by whole segments, so a small store needs small ones to keep close to LRU (docs/perf/retention.md:
# multi-turn chats at 25% of their working set 0.845 against 0.825 with 1/16, Zipf 25% 0.653 vs 0.650)
MIN_OPEN_SEGMENT_BYTES = 64 << 10


class SegmentDir:
    """One store directory of segment files with its own in-memory index.

    `read_only`: never create, change or delete a file (stats, verify). `evict=False`: change files
    (quarantine, orphan seal) but never evict (verify --fix). `eviction` / `sharing`: the policies of
    a directory other hosts share (shared_dir.py); the defaults are a local directory's. `rank`:
    which copy of a page a scan keeps when it meets the page twice (base.settle_twins).
    """

    def __init__(self, path: Path, settings: DirSettings, *, name: str = "local", read_only: bool = False,
                 evict: bool = True, eviction: EvictionPolicy | None = None,
                 sharing: SharingPolicy | None = None, rank: Rank | None = None) -> None:
        self.path = Path(path)
        self.name = name
        self.settings = settings
        self.read_only = read_only
        self.evict = evict and not read_only
        self.file_mode, self.dir_mode = settings.file_mode, settings.dir_mode
        self.eviction = eviction or EvictionPolicy()
        self.sharing = sharing or SharingPolicy()
        self.index = Index()
        self.purge = PurgeFilter(self.path, settings.max_age_s)  # purge.list rules and max_age
        self.table = UnitTable(self.path, self.index)
        self._logged = LogOnce(log)
        self._closed = threading.Event()
        self._changes: ChangeCounter | None = None
        self.counters = Counters()  # updated from the index thread, writers and the store's io threads
        self.counters.declare(
            "change_catch_ups", "scan_records", "scan_torn", "scan_damaged_bytes", *EVICTION_COUNTERS,
            "sealed_segments", "seal_failures", "rebuild_ms",
            "foreign_files", "quarantine_bad_lines", "snapshot_discarded",
            "snapshot_dropped_entries", "snapshot_mismatched_units", "snapshot_pages", "snapshot_segments",
            "scanned_segments", "snapshot_saves", "snapshot_save_failures", "snapshot_save_ms")
        self.quarantined = Quarantine(self.path, file_mode=self.file_mode, read_only=read_only, counters=self.counters,
                                      log_once=self.log_once, foreign=self.foreign)
        self.scanner = Scanner(self.table, self.index, self.counters, self.quarantined, read_only=read_only,
                               orphan_idle_s=settings.orphan_idle_s, sharing=self.sharing, owner=self, rank=rank)
        self.snapshots = Snapshots(self.table, self.index, self.counters, self.scanner, self.quarantined,
                                   file_mode=self.file_mode, fsync=settings.fsync, read_only=read_only,
                                   closed=self._closed.is_set, log_once=self.log_once)
        self.access = AccessTable()  # reads per record: what capacity gc keeps (retention/)
        self.table.on_drop(lambda unit: self.access.forget([unit.name]))
        self.access_files = AccessFiles(self.path, self.table, self.access, file_mode=self.file_mode,
                                        read_only=read_only, log_once=self.log_once)
        self.reader = Reader(self.table, self.purge, self.sharing, self.counters, self.foreign, self.access)
        if not read_only:
            self._check_writable()
            self._open_changes()  # a read-only open (stats, ls, verify) neither creates nor polls it
        capacity_bytes = settings.capacity_bytes
        if capacity_bytes is None:
            capacity_bytes = min(AUTO_CAPACITY_MAX_BYTES, (self._free_bytes() + self._disk_bytes()) // 2)
        self.capacity_bytes = capacity_bytes
        # open segments are sized so that, all full, they fit in a share of the capacity
        share = max(MIN_OPEN_SEGMENT_BYTES, capacity_bytes // (OPEN_SHARE * settings.stripes))
        self.writers = Writers(self.table, self.index, self.counters, stripes=settings.stripes,
                               segment_bytes=min(settings.segment_bytes, share), file_mode=self.file_mode,
                               fsync=settings.fsync, write_call_bytes=settings.write_call_bytes,
                               changed=self._changed, write_trailer=self.sharing.write_trailer,
                               log_once=self.log_once)
        self.budget = RewriteBudget(slack_bytes=self.writers.segment_bytes)
        self.evictor = Evictor(self.table, self.writers, self.index, self.eviction, self.access, self.budget,
                               self.counters, self.log_once)
        self.indexer = IndexThread(name, self.index, self.counters, self.scanner, self.snapshots, self.quarantined,
                                   self.sharing, self._changes, refresh_interval_s=settings.refresh_interval_s,
                                   read_only=read_only, closed=self._closed, periodic=self._maybe_time_seal)
        self.sharing.attach(self)  # a shared directory's policy works with the parts built above

    @property
    def segment_bytes(self) -> int:
        return self.writers.segment_bytes

    @property
    def orphan_idle_s(self) -> float:
        return self.scanner.orphan_idle_s

    @property
    def change_counter(self) -> ChangeCounter | None:
        """The directory's change counter (changes.py); None when read-only or it could not be mapped."""
        return self._changes

    def _check_writable(self) -> None:
        try:
            make_dirs(self.path, self.dir_mode)
            probe = self.path / f".probe-{self.table.tag}-{self.table.token}"
            os.close(open_file(probe, os.O_WRONLY | os.O_CREAT, self.file_mode))
            os.unlink(probe)
        except OSError as e:
            raise OSError(e.errno, f"store directory {self.path} is not writable ({e.strerror}); "
                                   "fix the path in lifeboat.yaml (storage[].path) or its permissions") from None

    def _open_changes(self) -> None:
        """Map the directory's change counter (changes.py); without it, only the listing refresh finds pages."""
        try:
            self._changes = ChangeCounter(self.path, create=True, file_mode=self.file_mode)
        except (OSError, ValueError) as e:
            self._changes = None
            self.log_once("changes", "lifeboat: %s: no change counter (%s); other processes' pages appear "
                                     "on the listing refresh only", self.path, e)

    def _free_bytes(self) -> int:
        p = self.path
        while not p.exists() and p.parent != p:  # read-only open of a missing directory
            p = p.parent
        try:
            return shutil.disk_usage(p).free
        except OSError:
            return 0

    def _disk_bytes(self) -> int:
        try:
            return sum(self.scanner.list().values())
        except OSError:
            return 0

    def log_once(self, key: str, msg: str, *args: object) -> bool:
        return self._logged.log(key, msg, *args)

    def foreign(self, name: str, why: str) -> None:
        """Report a symlink or non-regular file where a store file should be (once per name)."""
        if self.log_once(f"foreign:{name}", "lifeboat: %s: ignoring %s (%s)", self.path, name, why):
            self.counters.add("foreign_files")

    def _changed(self, segments: bool = False) -> None:
        if self._changes is not None:
            self._changes.bump(SEGMENTS if segments else 0)

    # ------------------------------------------------------------------ open / index thread
    def open(self, background: bool = True) -> None:
        """Start the index rebuild: snapshot (fast first hits), then the scan of what is newer.

        With background=True nothing here touches the disk; the caller gets the store at once.
        """
        self.indexer.start(background)

    def wait_rebuilt(self, timeout: float | None = None) -> bool:
        return self.indexer.rebuilt.wait(timeout)

    @property
    def rebuilt(self) -> bool:
        return self.indexer.rebuilt.is_set()

    def stop_refresh(self) -> None:
        """Stop the index thread's refreshes and periodic snapshots (close() does it first)."""
        self._closed.set()

    def own_names(self) -> set[str]:
        """Names of this process's open segments (a scan never walks them: their writer is here)."""
        return self.writers.open_names()

    def after_refresh(self) -> None:
        """After each scan's batched inserts: apply the purge rules, share what was read, then capacity gc."""
        compaction.apply(self)  # purge rules, after the batched entries are in the index
        self.sync_access()
        self._auto_gc()

    def sync_access(self, force: bool = False) -> None:
        """Absorb the other processes' retention state, then publish ours (each at most every PUBLISH_S)."""
        self.access_files.absorb_due(force)
        self.access_files.publish(force=force)

    # ------------------------------------------------------------------ write path
    def append(self, ikey: int, digest: bytes, bufs: Sequence[object], length: int) -> Loc:
        """Append one record (header + payload parts) and index it. Raises OSError on I/O failure."""
        locs, err = self.append_many([(ikey, digest, bufs, length)])
        if err is not None:
            raise err
        return locs[0]

    def append_many(self, records: Sequence[Record]) -> tuple[list[Loc], OSError | None]:
        """Append records (ikey, digest, bufs, length) in order and index them: (locs written, error).

        A run costs one reservation, pwritev calls of at most `write_call_size` bytes and one index insert
        per segment it lands in, and one change signal, not one of each per record. The rules of a single
        record hold for each: it is indexed only after its bytes are written; on a failure (full disk) the
        leading records that were written stay indexed, the rest are dropped (never indexed) and the error
        is returned, and the segment is sealed as after a failed single write. Raises OSError only when
        read-only.
        """
        if self.read_only:
            raise OSError(errno.EROFS, f"{self.path} is open read-only")
        locs: list[Loc] = []
        rolled = False
        err: OSError | None = None
        # make room for this run before it is written, counting the other threads' runs that made theirs
        # and are not written yet: the store never holds more than capacity
        promise = self.writers.promise(self._run_bytes(records)) if self.evict else None
        try:
            if self.evict:
                self.evictor.evict(self.capacity_bytes)
            averse = self.evict and self.evictor.ghost.averse(int(records[0][0]), self.index.held())
            while len(locs) < len(records) and err is None:
                try:
                    part, roll, err = self.writers.append_part(records, len(locs), promise=promise)
                except OSError as e:  # no segment could be opened for the rest
                    part, roll, err = [], False, e
                if part:
                    self._queue(part[0].unit, averse, roll)
                locs += part
                rolled |= roll
        finally:
            if promise is not None:
                self.writers.release(promise)
        if locs:
            self._changed()  # write, index, then tell the other processes of this host
            self.budget.wrote(sum(loc.length for loc in locs))
        if rolled:  # a segment was opened for this run: enforce the capacity bound now
            self._auto_gc()
        return locs, err

    def _queue(self, unit_id: int, averse: bool, fresh: bool) -> None:
        """Where a run's segment goes in the retention queue: a fresh segment of a cache-averse run (its
        first page was evicted long ago, retention/ghost.py) at the head; a segment sent there that
        then takes a run of other pages back to its age."""
        name = self.unit_name(unit_id)
        if name is None:
            return
        if averse and fresh:
            self.access.to_head(name)
        elif not averse and self.access.position(name, -1) == HEAD:
            self.access.place(name, unit_ms(name))

    def _run_bytes(self, records: Sequence[Record]) -> int:
        """What a run adds to the capacity's count: its records less their headers (records.framing)."""
        return sum(r[3] for r in records) - framing(len(records), sealed=False)

    def seal(self) -> None:
        """Seal the open segments now (flush / close / shared-FS visibility)."""
        self.writers.seal()

    def _maybe_time_seal(self) -> None:
        if self.writers.seals.has_unsealed:
            self.writers.seals.retry()
        if self.settings.seal_after_s is not None:
            self.writers.seal_older(self.settings.seal_after_s)

    # ------------------------------------------------------------------ read path
    def read_into(self, loc: Loc, bufs: Sequence[memoryview]) -> bool:
        """Read the record at loc into bufs (which together hold loc.length bytes).

        Returns False when the location is stale (evicted/vanished segment, short file); raises
        OSError for real I/O errors so the store can enter its cooldown.
        """
        return self.read_run([loc], [bufs])[0]

    def read_run(self, locs: Sequence[Loc], bufs: Sequence[Sequence[memoryview]]) -> list[bool]:
        """`read_into` for many records: adjacent records of one segment in one preadv (see reads.py)."""
        return self.reader.read_run(locs, bufs)

    def touch(self, ikeys: np.ndarray) -> None:
        """Count a use of the records of these keys held here (written again while stored, or about to be
        read): vector index lookups, one name lookup per unit, one lock (batch_exists's path)."""
        self.access.hit_many(offsets_by_unit(self.index, ikeys, self.unit_name))

    def unit_name(self, unit_id: int) -> str | None:
        u = self.table.get(unit_id)
        return u.name if u else None

    # ------------------------------------------------------------------ capacity
    def usage_bytes(self) -> int:
        """What the capacity counts: the pages' bytes on disk (each segment less its framing)."""
        with self.table.lock:
            return sum(u.size - u.framing for u in self.table.live())

    def units(self, *, own: bool = True) -> list[tuple[str, int, bool]]:
        """(name, bytes, sealed) of each segment, by name; own=False leaves out this process's open ones."""
        with self.table.lock:
            return [(u.name, u.size, u.sealed) for u in sorted(self.table.live(), key=lambda u: u.name)
                    if own or not u.own]

    def _auto_gc(self) -> None:
        """The capacity bound a serving process keeps; a maintenance open (evict=False) skips it."""
        if self.evict:
            self.evictor.evict(self.capacity_bytes)

    def gc(self, target_bytes: int | None = None) -> int:
        """Free sealed segments, as retention decides (capacity.py), until the pages' bytes on disk (open
        segments included) fit. Seals idle open segments early when only they are left. Returns
        bytes freed (0 when open read-only). Called by `lifeboat gc` (after reading every process's
        retention state); serving processes run the same after writes and refreshes."""
        if self.read_only:
            return 0
        self.access_files.absorb_due(force=True)
        limit = self.capacity_bytes if target_bytes is None else target_bytes
        return self.evictor.evict(limit)

    # ------------------------------------------------------------------ inspection, verify, quarantine
    def purge_figures(self) -> dict[str, int]:
        """What the purge rules did here since open: pages dropped from the index, segments removed."""
        return {"purged_pages": self.purge.purged_pages, "segments_evicted": self.purge.evicted_aged}

    def describe(self) -> list[dict[str, int | str | bool]]:
        """Per segment: records, stored and raw bytes (see inspection.describe)."""
        return inspection.describe(self)

    def audit(self, fix: bool = False) -> list[str]:
        """The file -> index half of verify (see inspection.audit)."""
        return inspection.audit(self, fix)

    def reading(self, name: str) -> AbstractContextManager[int | None]:
        """The read fd of segment `name`, held open for the block; None when it is gone or cannot be opened."""
        return self.table.reading(name)

    def is_quarantined(self, name: str, offset: int) -> bool:
        return (name, offset) in self.quarantined

    def index_found(self, name: str, keys: np.ndarray, offs: np.ndarray, lens: np.ndarray) -> int:
        """Index intact records that a scan missed (verify --fix); 0 when the segment is gone."""
        unit = self.table.named(name)
        return 0 if unit is None else self.scanner.index_entries(unit, keys, offs, lens)

    def quarantine_region(self, name: str, offset: int, length: int, reason: str) -> None:
        """Remember a damaged region so it is reported once (verify --fix)."""
        self.quarantined.record(name, offset, length, reason)

    def quarantine(self, ikey: int, loc: Loc, reason: str) -> None:
        """Drop a bad record from the index and remember it so no later scan brings it back."""
        self.index.remove_if_match(ikey, loc)
        name = self.unit_name(loc.unit)
        if name is not None:
            self.quarantined.record(name, loc.offset, loc.length, reason)

    def save_snapshot(self) -> bool:
        """Persist the index now (see Snapshots.save); False when read-only or the write failed."""
        return self.snapshots.save()

    # ------------------------------------------------------------------ close
    def records(self) -> Iterator[tuple[int, Loc]]:
        return self.index.items()

    def flush(self) -> None:
        self.seal()

    def close(self) -> None:
        self._closed.set()
        self.seal()
        self.indexer.join(timeout=5)
        if self.writers.seals.has_unsealed:
            self.writers.seals.retry()
        self.save_snapshot()
        self.access_files.publish(force=True)
        self.writers.close()  # a write still in flight: never leave its fd open
        self.table.close_fds()
        if self._changes is not None:
            self._changes.close()


__all__ = ["SegmentDir"]
