"""A directory of log-structured segment files, shared by any number of writer processes.

Each process appends records to its own segment files (`<ms>-<host>-<pid>-<token><n>.seg`: one
writer per file, names sort by age), so nothing needs a cross-process or cross-host lock. A full
segment is sealed with a trailer (segfile.py), so a later scan reads one table. Readers discover
other writers' segments by listing the directory; an unsealed one is walked record by record by
recovery.py, which skips holes and bad records and resynchronises on the next valid record. This
module owns the files (writers, unit table, capacity, fds) and never parses a record itself.

Invariants: write, then index; unit ids only grow; a scan never overwrites a newer index entry;
eviction unlinks whole oldest sealed segments; no file with intact records after a damaged one is
ever truncated; bytes on disk (open segments included) stay within the capacity plus a small slack.
"""

from __future__ import annotations

import bisect
import errno
import logging
import os
import shutil
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from ..codec import raw_length
from ..cooldown import LogOnce
from ..index import DEAD, SHARDS, Index, Loc, trim_heap
from ..keys import index_key
from ..metrics import Counters
from . import compaction
from . import inspection
from . import quarantine as qlist
from . import recovery
from .changes import SEGMENTS, ChangeCounter
from . import snapshot as snap
from .segfile import (  # noqa: F401  (re-exported: s3.py and tests import the format from here)
    DEFAULT_DIR_MODE, DEFAULT_FILE_MODE, FOOTER_SIZE, SEGMENT_SUFFIX, TABLE_ENTRY, TABLE_MAGIC, Entry,
    ForeignFile, PartialWrite, build_trailer, make_dirs, open_file, parse_footer, parse_name, parse_trailer,
    preadv_all, process_token, pwritev_all, read_table, reserve_space, trailer_size, write_trailer, writer_tag)
from .snapshot import SNAPSHOT_NAME, entry_hash  # noqa: F401
from .quarantine import QUARANTINE_NAME  # noqa: F401

log = logging.getLogger(__name__)

_writer_tag, _process_token, _parse_name, _pwritev_all = writer_tag, process_token, parse_name, pwritev_all
AUTO_CAPACITY_MAX_BYTES = 64 << 30
Record = tuple[int, bytes, Sequence[object], int]  # (index key, digest, header + payload parts, length)
ORPHAN_IDLE_S = 60.0  # an unsealed segment of a dead local pid, idle this long, is sealed by the next open
OPEN_SHARE = 4  # open segments together may hold at most 1/OPEN_SHARE of the capacity
MIN_OPEN_SEGMENT_BYTES = 64 << 10
_HASH_BATCH = 16  # trailers hashed in one vectorized pass by the snapshot check (~2 MB: stays in cache)
_BATCH_MIN = 1 << 16  # entries per bulk index insert during the initial rebuild (at least)
# ... and at most this many, or an eighth of what is indexed when that is more: a batch's columns
# (24 B an entry) are the rebuild's memory above the index. Measured on a 10M-page crash reopen (no
# snapshot): peak 48 -> 39 B/page resident, the same 2.7 s to the full index.
_BATCH_MAX = 1 << 21
DAMAGE_HEAL_S = 30.0  # a hole younger than this may be a write in flight: rewalk from it
CHANGE_POLL_S = 0.005  # how often the index thread reads the change counter (one pread) while busy
CHANGE_POLL_IDLE_S = 0.02  # ... and after a second without any change (idle CPU: ~0.2% of a core per directory)
# periodic snapshots (a crash reopen then loads it and scans only what is newer): written by the index
# thread when sealed segments not in the last snapshot hold SNAPSHOT_CHANGED_SHARE of the bytes it
# covered (and at least SNAPSHOT_MIN_SEGMENTS of them), at most once per SNAPSHOT_INTERVAL_S per
# directory: a process skips its turn while the file on disk is younger (another process wrote it)
SNAPSHOT_INTERVAL_S = 60.0
SNAPSHOT_MIN_SEGMENTS = 4
SNAPSHOT_CHANGED_SHARE = 0.05


@dataclass
class _Unit:
    id: int
    name: str
    path: Path
    own: bool = False
    scanned: int = 0  # bytes from the start known to hold only complete, indexed records
    walked: int = -1  # file size at the last walk (a dead writer's file is not walked again)
    size: int = 0  # bytes on disk (own open segment: bytes reserved)
    sealed: bool = False
    fd: int | None = None
    readers: int = 0
    dropped: bool = False
    damaged: list[tuple[int, int]] = field(default_factory=list)  # skipped regions (counted once)
    damage_seen: dict[int, float] = field(default_factory=dict)  # damaged offset -> first seen (monotonic)


@dataclass
class _Writer:
    unit: _Unit
    fd: int
    created: float
    reserved: int = 0
    inflight: int = 0
    count: int = 0  # records reserved (written or not)
    sealing: bool = False
    entries: list[Entry] = field(default_factory=list)


class SegmentDir:
    """One store directory of segment files with its own in-memory index.

    `read_only`: never create, change or delete a file (stats, verify). `evict=False`: change files
    (quarantine, orphan seal) but never evict (verify --fix).
    """

    def __init__(
        self,
        path: Path,
        *,
        capacity_bytes: int | None,
        segment_bytes: int,
        refresh_interval_s: float = 1.0,
        seal_after_s: float | None = None,
        fsync: bool = False,
        name: str = "local",
        stripes: int = 1,
        read_only: bool = False,
        evict: bool = True,
        file_mode: int = DEFAULT_FILE_MODE,
        dir_mode: int = DEFAULT_DIR_MODE,
        orphan_idle_s: float = ORPHAN_IDLE_S,
        max_age_s: float | None = None,
    ) -> None:
        self.path = Path(path)
        self.name = name
        self.refresh_interval_s = refresh_interval_s
        self.seal_after_s = seal_after_s
        self.fsync = fsync
        self.read_only = read_only
        self.evict = evict and not read_only
        self.file_mode, self.dir_mode = file_mode, dir_mode
        self.orphan_idle_s = orphan_idle_s
        self.index = Index()
        self.purge = compaction.PurgeFilter(self.path, max_age_s)  # purge.list rules and max_age
        self._lock = threading.RLock()
        self._units: dict[int, _Unit] = {}
        self._by_name: dict[str, int] = {}
        self._next_unit = 1
        # several open segments: buffered writes to one file serialize on its inode lock
        self._writers: list[_Writer | None] = [None] * stripes
        self._stripe = threading.local()
        self._stripe_next = 0
        self._sealing: list[_Writer] = []  # waiting for in-flight writes before their trailer
        self._unsealed: list[tuple[_Unit, list[Entry], int]] = []  # trailer write failed (full disk): retried
        self._seq = 0
        self._tag = _writer_tag()  # module-level name: tests pretend to be another host
        self._token = process_token()
        self._quarantine: set[tuple[str, int]] = set()
        self._logged = LogOnce(log)
        self._closed = threading.Event()
        self._rebuilt = threading.Event()
        self._thread: threading.Thread | None = None
        self._listed_sig: dict[str, tuple[int, int]] = {}  # segment name -> (size, st_mtime_ns) listed
        self._changes: ChangeCounter | None = None
        self._seen_changes = (0, 0)
        self._last_change = 0.0  # monotonic time the counter last changed (the poll speeds up)
        # the initial rebuild batches index inserts (one merge per batch, not per segment): batches of
        # at least _BATCH_MIN entries that double as the index grows, so the first hits come early,
        # up to _BATCH_MAX (memory)
        self._batch_owner: int | None = None  # thread id of the rebuild while it batches
        self._batch: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self._batch_n = self._batched = 0
        # periodic snapshot: the segments the last one (written or loaded) covered, and when it was tried
        self.snapshot_interval_s = SNAPSHOT_INTERVAL_S
        self.snapshot_min_segments = SNAPSHOT_MIN_SEGMENTS
        self.snapshot_changed_share = SNAPSHOT_CHANGED_SHARE
        self._snap_covered: dict[str, int] = {}  # segment name -> bytes
        self._snap_tried = time.monotonic()
        self._snap_save = threading.Lock()  # close()'s save waits for a periodic one: the last view wins
        self.counters = Counters()  # updated from the index thread, writers and the store's io threads
        self.counters.declare(
            "change_catch_ups",
            "scan_records", "scan_torn", "scan_damaged_bytes", "evicted_segments",
            "evicted_bytes", "sealed_segments", "seal_failures", "rebuild_ms",
            "foreign_files", "quarantine_bad_lines", "snapshot_discarded",
            "snapshot_dropped_entries", "snapshot_mismatched_units", "snapshot_pages", "snapshot_segments",
            "scanned_segments", "snapshot_saves", "snapshot_save_failures", "snapshot_save_ms")
        if not read_only:
            self._check_writable()
            self._open_changes()  # a read-only open (stats, ls, verify) neither creates nor polls it
        if capacity_bytes is None:
            capacity_bytes = min(AUTO_CAPACITY_MAX_BYTES, (self._free_bytes() + self._disk_bytes()) // 2)
        self.capacity_bytes = capacity_bytes
        # open segments are sized so that, all full, they fit in a share of the capacity
        share = max(MIN_OPEN_SEGMENT_BYTES, capacity_bytes // (OPEN_SHARE * stripes))
        self.segment_bytes = min(segment_bytes, share)

    def _check_writable(self) -> None:
        try:
            make_dirs(self.path, self.dir_mode)
            probe = self.path / f".probe-{self._tag}-{self._token}"
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
            self._log_once("changes", "lifeboat: %s: no change counter (%s); other processes' pages appear "
                                      "on the listing refresh only", self.path, e)

    def _free_bytes(self) -> int:
        p = self.path
        while not p.exists() and p.parent != p:  # read-only open of a missing directory
            p = p.parent
        try:
            return shutil.disk_usage(p).free
        except OSError:
            return 0

    def _log_once(self, key: str, msg: str, *args: object) -> bool:
        return self._logged.log(key, msg, *args)

    # ------------------------------------------------------------------ open / rebuild
    def open(self, background: bool = True) -> None:
        """Start the index rebuild: snapshot (fast first hits), then the scan of what is newer.

        With background=True nothing here touches the disk; the caller gets the store at once.
        """
        self._thread = threading.Thread(target=self._run, name=f"lifeboat-{self.name}-index", daemon=True)
        if not background:
            self._rebuild()
        self._thread.start()

    def wait_rebuilt(self, timeout: float | None = None) -> bool:
        return self._rebuilt.wait(timeout)

    @property
    def rebuilt(self) -> bool:
        return self._rebuilt.is_set()

    def _rebuild(self) -> None:
        t0 = time.perf_counter()
        self._batch_owner = threading.get_ident()
        try:
            self._load_quarantine()
            self._load_snapshot()
            self._refresh(initial=True)
        except Exception:  # never let the index thread die on a bad directory
            log.exception("lifeboat: initial index rebuild of %s failed", self.path)
        finally:
            try:
                self._flush_batch()
            finally:
                self._batch_owner = None
        self.counters.set("rebuild_ms", int((time.perf_counter() - t0) * 1000))
        self._rebuilt.set()
        trim_heap()  # the rebuild's freed batches (10M pages, crash reopen: 38 -> 27 B/page resident)
        log.info("lifeboat: %s index rebuilt: %d pages in %d ms", self.path, len(self.index),
                 self.counters["rebuild_ms"])

    def _run(self) -> None:
        if not self._rebuilt.is_set():
            self._rebuild()
        polling = self._changes is not None and self._changes.active and not self.read_only
        next_refresh = time.monotonic() + self.refresh_interval_s
        wait = CHANGE_POLL_S if polling else self.refresh_interval_s
        while not self._closed.wait(wait):
            try:
                if time.monotonic() >= next_refresh:
                    if polling:
                        self._seen_changes = self._changes.read()  # type: ignore[union-attr]
                    self._refresh(initial=False)
                    self._maybe_time_seal()
                    self._maybe_snapshot()
                    next_refresh = time.monotonic() + self.refresh_interval_s
                elif polling:
                    self._catch_up()
                self._heartbeat()
            except Exception:
                log.exception("lifeboat: index refresh of %s failed", self.path)
            now = time.monotonic()
            left = max(0.0, next_refresh - now)
            poll = CHANGE_POLL_S if now - self._last_change < 1.0 else CHANGE_POLL_IDLE_S
            wait = min(poll, left) if polling else left

    def _catch_up(self) -> None:
        """Index what other processes of this host wrote since the counter last changed.

        A changed segments word (a segment created or sealed) costs one listing; a changed writes word
        only rescans the open segments of other processes already known, reading their new bytes.
        """
        now = self._changes.read() if self._changes is not None else (0, 0)
        if now == self._seen_changes:
            return
        listing = now[1] != self._seen_changes[1]
        self._seen_changes = now  # before scanning: a change during the scan is seen next time
        self._last_change = time.monotonic()
        self.counters.add("change_catch_ups")
        if listing:
            self._refresh(initial=False)
            return
        with self._lock:
            grown = [u for u in self._units.values()
                     if not u.own and not u.sealed and not u.dropped and self._catches_up(u)]
        for u in grown:
            self._scan(u)

    def _catches_up(self, unit: _Unit) -> bool:
        """Whether a catch-up rescans this open segment of another process (nfs: same host only)."""
        return True

    def _heartbeat(self) -> None:
        """Show other hosts that this process is alive (nfs); nothing to do on a local directory."""

    def _changed(self, segments: bool = False) -> None:
        if self._changes is not None:
            self._changes.bump(SEGMENTS if segments else 0)

    def _disk_bytes(self) -> int:
        try:
            return sum(self._list().values())
        except OSError:
            return 0

    def _list(self) -> dict[str, int]:
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
                    self._foreign(e.name, "a symlink, a non-regular file or a file not named like a segment")
                    continue
                out[e.name] = size
        return out

    def _foreign(self, name: str, why: str) -> None:
        if self._log_once(f"foreign:{name}", "lifeboat: %s: ignoring %s (%s)", self.path, name, why):
            self.counters.add("foreign_files")

    def _refresh(self, initial: bool) -> None:
        """Reconcile the unit table with the directory listing and index what is new."""
        with self._lock:
            known = self._next_unit  # a unit added after the listing began cannot be missing from it
        try:
            listing = self._list()
        except OSError as e:
            self._log_once(f"list:{e.errno}", "lifeboat: cannot list %s: %s", self.path, e)
            return
        with self._lock:
            own_names = {w.unit.name for w in self._writers if w is not None}
            gone = [u for u in self._units.values()
                    if u.name not in listing and u.name not in own_names and u.id < known]
        self._drop_many(gone)
        for name in sorted(listing):
            with self._lock:
                uid = self._by_name.get(name)
                unit = self._units.get(uid) if uid else None
                if unit is None:
                    unit = self._add_unit(name)
                if unit.own or unit.sealed:
                    continue
            if initial:
                self._adopt_if_orphan(unit)
            self._scan(unit)
        self._flush_batch()  # before eviction may drop a unit whose entries are still batched
        compaction.apply(self)  # purge rules, after the batched entries are in the index
        self._auto_gc()

    def _add_unit(self, name: str, own: bool = False) -> _Unit:
        uid = self._next_unit
        self._next_unit += 1
        unit = _Unit(uid, name, self.path / name, own=own)
        self._units[uid] = unit
        self._by_name[name] = uid
        return unit

    # ------------------------------------------------------------------ scanning
    def _index_entries(self, unit: _Unit, keys: np.ndarray, offs: np.ndarray, lens: np.ndarray) -> int:
        """Insert a unit's records (if absent), leaving out quarantined ones. Returns how many."""
        if self._quarantine and len(offs):
            bad = {o for n, o in self._quarantine if n == unit.name}
            if bad:
                keep = ~np.isin(offs.astype(np.uint64), np.fromiter(bad, dtype=np.uint64, count=len(bad)))
                keys, offs, lens = keys[keep], offs[keep], lens[keep]
        if len(keys):
            self._insert(np.asarray(keys, np.int64), np.full(len(keys), unit.id, np.uint32),
                         np.asarray(offs, np.uint64), np.asarray(lens, np.uint32))
        return len(keys)

    def _insert(self, keys: np.ndarray, units: np.ndarray, offs: np.ndarray, lens: np.ndarray) -> None:
        """Index entries if absent: at once, or batched while this thread runs the initial rebuild."""
        if self._batch_owner != threading.get_ident():
            self.index.insert_arrays(keys, units, offs, lens, if_absent=True)
            return
        pos = 0
        while pos < len(keys):  # a big input (a snapshot) goes in growing pieces too
            end = pos + max(1, self._batch_limit() - self._batch_n)
            # compact copies of trailer columns (strided views would keep whole 32 B/row tables alive)
            self._batch.append(tuple(np.ascontiguousarray(c[pos:end]) for c in (keys, units, offs, lens)))
            self._batch_n += len(self._batch[-1][0])
            pos = end
            if self._batch_n >= self._batch_limit():
                self._flush_batch()

    def _batch_limit(self) -> int:
        return min(max(_BATCH_MIN, self._batched), max(_BATCH_MAX, self._batched // 8))

    def _flush_batch(self) -> None:
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
        with self._lock:  # unit ids are small: a table of the live ones, one gather per entry
            alive = np.zeros(max(self._next_unit, int(units.max()) + 1), bool)
            alive[[uid for uid, u in self._units.items() if not u.dropped]] = True
        keep = alive[units]
        if not keep.all():
            keys, units, offs, lens = keys[keep], units[keep], offs[keep], lens[keep]
        self.index.insert_arrays(keys, units, offs, lens, if_absent=True)
        self._batched += len(keys)

    def _index_walk(self, unit: _Unit, w: recovery.Walk) -> None:
        if w.entries:
            keys = np.array([index_key(e[0]) for e in w.entries], np.int64)
            offs = np.array([e[1] for e in w.entries], np.uint64)
            lens = np.array([e[2] for e in w.entries], np.uint32)
            self.counters.add("scan_records", self._index_entries(unit, keys, offs, lens))
        new_damage = [d for d in w.damaged if d not in unit.damaged]
        if new_damage:
            self.counters.add("scan_torn", len(new_damage))
            self.counters.add("scan_damaged_bytes", sum(n for _, n in new_damage))
            unit.damaged.extend(new_damage)

    def _index_table(self, unit: _Unit, table: np.ndarray, size: int) -> None:
        self.counters.add("scan_records", self._index_entries(unit, table["key"], table["offset"], table["length"]))
        unit.scanned = unit.size = unit.walked = size
        unit.sealed = True
        unit.damaged = []

    def _open_for_scan(self, unit: _Unit, opener: Callable[[], int]) -> int | None:
        """opener() for a scan; a vanished or foreign file drops the unit, other errors are logged once."""
        try:
            return opener()
        except FileNotFoundError:
            self._drop(unit)
        except ForeignFile as e:
            self._foreign(unit.name, str(e))
            self._drop(unit)
        except OSError as e:
            self._log_once(f"open:{unit.name}", "lifeboat: cannot open %s: %s", unit.path, e)
        return None

    def _scan(self, unit: _Unit) -> None:
        fd = self._open_for_scan(unit, lambda: self._acquire(unit))
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
            w = recovery.walk(fd, unit.scanned, size)
            self._index_walk(unit, w)
            # damage may be a write still in flight: walk it again while young, then walk past it
            now = time.monotonic()
            young = False
            for off, _ in w.damaged:
                young |= now - unit.damage_seen.setdefault(off, now) < DAMAGE_HEAL_S
            # young damage: rewalk on the next scan even if the size stays (the hole may be filled in place)
            unit.scanned, unit.walked = (w.resume_at if young else w.end), (-1 if young else size)
        except OSError as e:
            self._log_once(f"scan:{unit.name}", "lifeboat: scan of %s failed: %s", unit.path, e)
        finally:
            self._release(unit)

    def _adopt_if_orphan(self, unit: _Unit) -> None:
        """Seal a segment left unsealed by a dead writer on this host.

        Every intact record is kept (holes and bad records stay where they are, unlisted); only
        bytes after the last intact record are cut before the trailer is written.
        """
        parsed = parse_name(unit.name)
        if self.read_only or parsed is None or parsed[0] != self._tag.split("-")[0]:
            return
        pid = parsed[1]
        if pid == os.getpid():
            return
        try:
            os.kill(pid, 0)
            return  # alive: not an orphan
        except ProcessLookupError:
            pass
        except PermissionError:
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
            self._foreign(unit.name, str(e))
            return
        except OSError as e:
            self._log_once(f"adopt:{unit.name}", "lifeboat: could not seal orphan segment %s: %s", unit.name, e)
            return
        try:
            size = os.fstat(fd).st_size
            if read_table(fd, size) is not None:
                return  # sealed after all; the scan reads its trailer
            w = recovery.walk(fd, 0, size)
            self._index_walk(unit, w)
            if size > w.end:
                os.ftruncate(fd, w.end)
            end = self._write_trailer(fd, w.end, w.entries)
            unit.size = unit.scanned = unit.walked = end
            unit.sealed = True
            log.info("lifeboat: sealed orphan segment %s of dead writer pid %d (%d records, %d damaged "
                     "regions skipped)", unit.name, pid, len(w.entries), len(w.damaged))
        except OSError as e:
            self._log_once(f"adopt:{unit.name}", "lifeboat: could not seal orphan segment %s: %s", unit.name, e)
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ fds
    def _acquire(self, unit: _Unit) -> int:
        with self._lock:
            if unit.dropped:
                raise FileNotFoundError(errno.ENOENT, "segment evicted", str(unit.path))
            if unit.fd is None:
                unit.fd = open_file(unit.path, os.O_RDONLY)
            unit.readers += 1
            return unit.fd

    def _release(self, unit: _Unit) -> None:
        with self._lock:
            unit.readers -= 1
            if unit.dropped and unit.readers == 0 and unit.fd is not None:
                os.close(unit.fd)
                unit.fd = None

    def _drop(self, unit: _Unit) -> None:
        self._drop_many([unit])

    def _drop_many(self, units: Sequence[_Unit]) -> None:
        """Forget units (evicted, vanished, a discarded snapshot's): one pass over the index for all."""
        ids = []
        with self._lock:
            for unit in units:
                if unit.dropped:
                    continue
                unit.dropped = True
                self._listed_sig.pop(unit.name, None)
                self._units.pop(unit.id, None)
                self._by_name.pop(unit.name, None)
                if unit.readers == 0 and unit.fd is not None:
                    os.close(unit.fd)
                    unit.fd = None
                ids.append(unit.id)
        if ids:
            self.index.drop_units(ids)

    # ------------------------------------------------------------------ write path
    def append(self, ikey: int, digest: bytes, bufs: Sequence[object], length: int) -> Loc:
        """Append one record (header + payload parts) and index it. Raises OSError on I/O failure."""
        locs, err = self.append_many([(ikey, digest, bufs, length)])
        if err is not None:
            raise err
        return locs[0]

    def append_many(self, records: Sequence[Record]) -> tuple[list[Loc], OSError | None]:
        """Append records (ikey, digest, bufs, length) in order and index them: (locs written, error).

        A run costs one reservation, one pwritev and one index insert per segment it lands in, and one
        change signal, not one of each per record. The rules of a single record hold for each: it is
        indexed only after its bytes are written; on a failure (full disk) the leading records that
        were written stay indexed, the rest are dropped (never indexed) and the error is returned, and
        the segment is sealed as after a failed single write. Raises OSError only when read-only.
        """
        if self.read_only:
            raise OSError(errno.EROFS, f"{self.path} is open read-only")
        locs: list[Loc] = []
        rolled = False
        err: OSError | None = None
        while len(locs) < len(records) and err is None:
            try:
                part, roll, err = self._append_part(records, len(locs))
            except OSError as e:  # no segment could be opened for the rest
                part, roll, err = [], False, e
            locs += part
            rolled |= roll
        if locs:
            self._changed()  # write, index, then tell the other processes of this host
        if rolled:  # a segment was opened for this run: enforce the capacity bound now
            self._auto_gc()
        return locs, err

    def _append_part(self, records: Sequence[Record], first: int) -> tuple[list[Loc], bool, OSError | None]:
        """Write and index the records from `first` on that fit in this thread's open segment (at
        least one). Returns their locs, whether a segment was opened, and the error that stopped it."""
        with self._lock:
            stripe = self._my_stripe()
            w = self._writer_for(stripe, records[first][3])
            rolled = w.reserved == 0
            off = w.reserved
            end, total = first, 0
            while end < len(records) and (end == first or off + total + records[end][3] <= self.segment_bytes):
                total += records[end][3]
                end += 1
            w.reserved += total
            w.count += end - first
            trailer = trailer_size(w.count)  # room for a trailer listing every record so far
            w.unit.size = w.reserved
            w.inflight += 1
        run = records[first:end]
        offs = np.cumsum([0] + [r[3] for r in run]).tolist()  # record k spans offs[k]..offs[k+1] from off
        err: OSError | None = None
        try:
            done = _reserve_run(w.fd, off, offs, trailer)
            pwritev_all(w.fd, [b for r in run[:done] for b in r[2]], off)
            if done < len(run):
                err = OSError(errno.ENOSPC, "no space left on device for the whole run", str(w.unit.path))
        except OSError as e:
            done, err = (bisect.bisect_right(offs, e.written) - 1 if isinstance(e, PartialWrite) else 0), e
        with self._lock:
            w.inflight -= 1
            w.entries += [(r[1], off + offs[k], r[3], raw_length(r[2][0])) for k, r in enumerate(run[:done])]
            if err is not None:
                if self._writers[stripe] is w:  # abandon the segment: its tail may hold a partial record
                    self._writers[stripe] = None
                self._start_seal(w)
            elif w.sealing and w.inflight == 0:
                self._finish_seal(w)
        locs = [Loc(w.unit.id, off + offs[k], r[3]) for k, r in enumerate(run[:done])]
        if locs:
            self.index.insert_many([r[0] for r in run[:done]], locs)
        return locs, rolled, err

    def _my_stripe(self) -> int:
        """Each writing thread sticks to one stripe (one open segment)."""
        s = getattr(self._stripe, "i", None)
        if s is None:
            s = self._stripe.i = self._stripe_next % len(self._writers)
            self._stripe_next += 1
        return s

    def _writer_for(self, stripe: int, length: int) -> _Writer:
        w = self._writers[stripe]
        if w is not None and w.reserved + length > self.segment_bytes and w.reserved > 0:
            self._writers[stripe] = None
            self._start_seal(w)
            w = None
        if w is None:
            self._seq += 1
            name = f"{int(time.time() * 1000):013d}-{self._tag}-{self._token}{self._seq:06d}{SEGMENT_SUFFIX}"
            fd = open_file(self.path / name, os.O_RDWR | os.O_CREAT, self.file_mode)
            unit = self._add_unit(name, own=True)
            w = self._writers[stripe] = _Writer(unit, fd, time.monotonic())
            self._changed(segments=True)
        return w

    def _start_seal(self, w: _Writer) -> None:
        w.sealing = True
        if w.inflight == 0:
            self._finish_seal(w)
        elif w not in self._sealing:
            self._sealing.append(w)

    def _finish_seal(self, w: _Writer) -> None:
        """Seal a segment whose writes have all returned (called under the lock).

        The trailer lists every record that was written, holes left by failed writes included; only
        bytes after the last written record are cut. A segment that cannot be sealed (full disk) is
        marked sealed in memory so eviction can reclaim it, and one with no record is removed.
        """
        if w in self._sealing:
            self._sealing.remove(w)
        if w.fd < 0:
            return
        entries = sorted(w.entries, key=lambda e: e[1])
        end = max((e[1] + e[2] for e in entries), default=0)
        unit = w.unit
        try:
            if not entries:
                os.unlink(unit.path)
                self._drop(unit)
                return
            if os.fstat(w.fd).st_size > end:  # a failed write's partial bytes (same size: keep the reserved blocks)
                os.ftruncate(w.fd, end)
            size = self._write_trailer(w.fd, end, entries)
            if self.fsync:
                os.fdatasync(w.fd)
            unit.size = unit.scanned = unit.walked = size
            self.counters.add("sealed_segments")
            self._changed(segments=True)
        except OSError as e:
            self.counters.add("seal_failures")
            self._log_once(f"seal:{e.errno}", "lifeboat: sealing %s failed (%s); its records stay indexed, the "
                                              "seal is retried (and the next open walks it)", unit.path, e)
            try:
                os.ftruncate(w.fd, end)  # drop a partial trailer; the records stay
                unit.size = end
            except OSError:
                unit.size = w.reserved
            unit.scanned, unit.walked = 0, -1
            self._unsealed.append((unit, entries, end))
        finally:
            unit.sealed = True  # no more writes: evictable
            unit.own = False
            os.close(w.fd)
            w.fd = -1

    def _write_trailer(self, fd: int, at: int, entries: Sequence[Entry]) -> int:
        return write_trailer(fd, at, entries)

    def _retry_seals(self) -> None:
        """Write the trailers that failed earlier (the disk may have room again)."""
        with self._lock:
            todo, self._unsealed = self._unsealed, []
            for unit, entries, end in todo:
                if unit.dropped:
                    continue
                try:
                    fd = open_file(unit.path, os.O_RDWR)
                except OSError:
                    continue  # evicted or replaced meanwhile
                try:
                    os.ftruncate(fd, end)
                    size = self._write_trailer(fd, end, entries)
                    unit.size = unit.scanned = unit.walked = size
                    self.counters.add("sealed_segments")
                except OSError:
                    try:
                        os.ftruncate(fd, end)
                    except OSError:
                        pass
                    self._unsealed.append((unit, entries, end))
                finally:
                    os.close(fd)

    def seal(self) -> None:
        """Seal the open segments now (flush / close / shared-FS visibility)."""
        with self._lock:
            for i, w in enumerate(self._writers):
                self._writers[i] = None
                if w is not None:
                    self._start_seal(w)

    def _maybe_time_seal(self) -> None:
        if self._unsealed:
            self._retry_seals()
        if self.seal_after_s is None:
            return
        with self._lock:
            for i, w in enumerate(self._writers):
                if w is not None and w.reserved and time.monotonic() - w.created >= self.seal_after_s:
                    self._writers[i] = None
                    self._start_seal(w)

    # ------------------------------------------------------------------ read path
    def read_into(self, loc: Loc, bufs: Sequence[memoryview]) -> bool:
        """Read the record at loc into bufs (which together hold loc.length bytes).

        Returns False when the location is stale (evicted/vanished segment, short file); raises
        OSError for real I/O errors so the store can enter its cooldown.
        """
        return self.read_run([loc], [bufs])[0]

    def read_run(self, locs: Sequence[Loc], bufs: Sequence[Sequence[memoryview]]) -> list[bool]:
        """Read records into their bufs (bufs[k] together hold locs[k].length bytes), as read_into does
        for one: one preadv (IOV_MAX iovecs a call) per stretch of adjacent records of one segment.

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
            self._read_stretch(locs, bufs, k, j, out)
            k = j
        return out

    def _read_stretch(self, locs: Sequence[Loc], bufs: Sequence[Sequence[memoryview]], k: int, j: int,
                      out: list[bool]) -> None:
        """Read the adjacent records locs[k:j] (one segment) in one go; mark those read whole in out."""
        with self._lock:
            unit = self._units.get(locs[k].unit)
        if unit is None:
            return
        try:
            fd = self._acquire(unit)
        except FileNotFoundError:
            self._drop(unit)
            return
        except ForeignFile as e:
            self._foreign(unit.name, str(e))
            self._drop(unit)
            return
        views = [b for r in range(k, j) for b in bufs[r]]
        try:
            n = preadv_all(fd, views, locs[k].offset)
        finally:
            self._release(unit)
        blocking = self.purge.active  # purged or expired: not served
        for r in range(k, j):
            whole = locs[r].offset + locs[r].length - locs[k].offset <= n
            out[r] = whole and not (blocking and self.purge.blocks(
                compaction.unit_ms(unit.name), bytes(bufs[r][0][compaction.NS_AT:compaction.NS_AT + 16])))

    def unit_name(self, unit_id: int) -> str | None:
        with self._lock:
            u = self._units.get(unit_id)
            return u.name if u else None

    # ------------------------------------------------------------------ capacity
    def usage_bytes(self) -> int:
        with self._lock:
            return sum(u.size for u in self._units.values())

    def units(self, *, own: bool = True) -> list[tuple[str, int, bool]]:
        """(name, bytes, sealed) of each segment, by name; own=False leaves out this process's open ones."""
        with self._lock:
            return [(u.name, u.size, u.sealed) for u in sorted(self._units.values(), key=lambda u: u.name)
                    if own or not u.own]

    def _projected_bytes(self) -> int:
        """Bytes on disk once every open segment is full: what the capacity must hold."""
        own = {w.unit.id: max(self.segment_bytes, w.reserved) for w in self._writers if w is not None}
        return sum(own.get(u.id, u.size) for u in self._units.values())

    def _auto_gc(self) -> None:
        """The capacity bound a serving process keeps; a maintenance open (evict=False) skips it."""
        if self.evict:
            self.gc()

    def gc(self, target_bytes: int | None = None) -> int:
        """Evict whole oldest sealed segments until the bytes on disk, open segments counted full, fit.

        Seals idle open segments early when only they are left to evict. Returns bytes freed
        (0 when open read-only). Called explicitly by `lifeboat gc`, and by serving processes.
        """
        if self.read_only:
            return 0
        limit = self.capacity_bytes if target_bytes is None else target_bytes
        freed = 0
        sealed_early = False
        while True:
            with self._lock:
                if self._projected_bytes() <= limit:
                    return freed
                victims = sorted((u for u in self._units.values() if self._evictable(u)), key=lambda u: u.name)
                if not victims:
                    if sealed_early:
                        return freed
                    sealed_early = True
                    for i, w in enumerate(self._writers):
                        if w is not None and w.inflight == 0 and w.reserved:
                            self._writers[i] = None
                            self._start_seal(w)
                    continue
                victim = victims[0]
            try:
                os.unlink(victim.path)
            except FileNotFoundError:
                pass
            except OSError as e:
                self._log_once(f"evict:{e.errno}", "lifeboat: cannot evict %s: %s", victim.path, e)
                return freed
            self._drop(victim)
            freed += victim.size
            self.counters.add("evicted_segments")
            self.counters.add("evicted_bytes", victim.size)

    def _evictable(self, unit: _Unit) -> bool:
        """Sealed segments only: another process's open segment is never unlinked (nfs widens this)."""
        return unit.sealed and not unit.own

    def describe(self) -> list[dict[str, int | str | bool]]:
        """Per segment: records, stored and raw bytes (see inspection.describe)."""
        return inspection.describe(self)

    def audit(self, fix: bool = False) -> list[str]:
        """The file -> index half of verify (see inspection.audit)."""
        return inspection.audit(self, fix)

    # ------------------------------------------------------------------ for inspection.py
    @contextmanager
    def reading(self, name: str) -> Iterator[int | None]:
        """The read fd of segment `name`, held open for the block; None when it is gone or cannot be opened."""
        with self._lock:
            unit = self._units.get(self._by_name.get(name, -1))
        try:
            fd = None if unit is None else self._acquire(unit)
        except OSError:
            fd = None
        if fd is None or unit is None:
            yield None
            return
        try:
            yield fd
        finally:
            self._release(unit)

    def is_quarantined(self, name: str, offset: int) -> bool:
        return (name, offset) in self._quarantine

    def index_found(self, name: str, keys: np.ndarray, offs: np.ndarray, lens: np.ndarray) -> int:
        """Index intact records that a scan missed (verify --fix); 0 when the segment is gone."""
        with self._lock:
            unit = self._units.get(self._by_name.get(name, -1))
        return 0 if unit is None else self._index_entries(unit, keys, offs, lens)

    def quarantine_region(self, name: str, offset: int, length: int, reason: str) -> None:
        """Remember a damaged region so it is reported once (verify --fix)."""
        self._record_quarantine(name, offset, length, reason)

    def log_once(self, key: str, msg: str, *args: object) -> None:
        self._log_once(key, msg, *args)

    # ------------------------------------------------------------------ quarantine
    def _load_quarantine(self) -> None:
        try:
            entries, bad = qlist.load(self.path)
        except ForeignFile as e:
            self._foreign(qlist.QUARANTINE_NAME, str(e))
            return
        except OSError as e:
            if not (self.read_only and e.errno == errno.ENOENT):
                self._log_once("quarantine-read", "lifeboat: cannot read the quarantine list of %s: %s", self.path, e)
            return
        self._quarantine |= entries
        if bad:
            self.counters.add("quarantine_bad_lines", bad)
            self._log_once("quarantine-bad", "lifeboat: %s: ignored %d bad line(s) of %s", self.path, bad,
                           qlist.QUARANTINE_NAME)

    def quarantine(self, ikey: int, loc: Loc, reason: str) -> None:
        """Drop a bad record from the index and remember it so no later scan brings it back."""
        self.index.remove_if_match(ikey, loc)
        name = self.unit_name(loc.unit)
        if name is not None:
            self._record_quarantine(name, loc.offset, loc.length, reason)

    def _record_quarantine(self, name: str, offset: int, length: int, reason: str) -> None:
        self._quarantine.add((name, offset))
        if self.read_only:
            return
        try:
            qlist.append(self.path, name, offset, length, reason, self.file_mode)
        except ForeignFile as e:
            self._foreign(qlist.QUARANTINE_NAME, str(e))
        except OSError as e:
            self._log_once("quarantine-write", "lifeboat: cannot record quarantine in %s: %s", self.path, e)

    # ------------------------------------------------------------------ snapshot
    def save_snapshot(self) -> bool:
        """Persist the index shard by shard (temp file, fsync where segments are fsync'd, rename) so
        the next open has its first hits at once. Only entries of sealed, fully scanned segments go
        in; memory: one shard.

        Returns whether it was written; a failure (full disk) is logged once and only costs a slower
        next open."""
        if self.read_only:
            return False
        with self._snap_save:
            return self._save_snapshot()

    def _save_snapshot(self) -> bool:
        t0 = time.perf_counter()
        units = [snap.SnapshotUnit(u.name, u.id, u.scanned, True) for u in self._snapshot_units()]
        ids = np.array(sorted(u.id for u in units), dtype=np.int64)
        eligible = np.zeros(int(ids[-1]) + 2 if len(ids) else 1, dtype=bool)
        eligible[ids] = True

        def shards() -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
            for sh, x, uids, offs, lens in self.index.export_shards():
                keep = eligible[np.minimum(uids, len(eligible) - 1)]
                yield (sh, x, uids, offs, lens) if keep.all() else (sh, x[keep], uids[keep], offs[keep], lens[keep])

        ok = False
        try:
            snap.save(self.path, units, shards(), self.file_mode, fsync=self.fsync)
            ok = True
        except OSError as e:
            self.counters.add("snapshot_save_failures")
            self._log_once("snapshot-save", "lifeboat: cannot save index snapshot in %s: %s (the next open "
                                            "scans more; serving goes on)", self.path, e)
        for name in snap.remove_stale(self.path):
            log.info("lifeboat: %s: removed %s (an old snapshot format or a crashed save)", self.path, name)
        if ok:
            self._snap_covered = {u.name: u.scanned for u in units}
            self.counters.add("snapshot_saves")
            self.counters.set("snapshot_save_ms", int((time.perf_counter() - t0) * 1000))
        return ok

    def _snapshot_units(self) -> list[_Unit]:
        """The units a snapshot may describe: sealed (none of our writers still appends), fully scanned."""
        with self._lock:
            return [u for u in self._units.values() if u.sealed and not u.own and u.scanned == u.size]

    def _snapshot_due(self) -> bool:
        """Enough sealed bytes outside the last snapshot: SNAPSHOT_CHANGED_SHARE of what it covered, in
        at least snapshot_min_segments segments."""
        covered = self._snap_covered
        new = [u.size for u in self._snapshot_units() if u.name not in covered]
        base = sum(covered.values())
        return len(new) >= self.snapshot_min_segments and sum(new) >= self.snapshot_changed_share * base

    def _maybe_snapshot(self) -> None:
        """Write a periodic snapshot from the index thread when one is due (see SNAPSHOT_INTERVAL_S)."""
        if self.read_only or self._closed.is_set():
            return
        now = time.monotonic()
        if now - self._snap_tried < self.snapshot_interval_s or not self._snapshot_due():
            return
        self._snap_tried = now
        try:  # another process wrote one lately: its turn (it covers the same sealed segments)
            age = time.time() - os.stat(self.path / SNAPSHOT_NAME).st_mtime
            if 0 <= age < self.snapshot_interval_s:
                return
        except OSError:
            pass
        if self.save_snapshot():
            log.info("lifeboat: %s: periodic index snapshot of %d segments in %d ms", self.path,
                     len(self._snap_covered), self.counters["snapshot_save_ms"])

    def _discard_snapshot(self, why: object) -> None:
        self.counters.add("snapshot_discarded", 1)
        self._log_once("snapshot", "lifeboat: ignoring index snapshot in %s (%s); rescanning", self.path, why)

    def _load_snapshot(self) -> None:
        """Index the snapshot's entries of unchanged sealed segments shard by shard (each shard answers
        lookups as soon as it is in), then check every segment's entries against its trailer."""
        if not self.read_only:
            for name in snap.remove_stale(self.path):
                if name in snap.OLD_SNAPSHOT_NAMES:
                    self._discard_snapshot(f"{name} is an older snapshot format; removed")
        try:
            reader, fd = snap.open_reader(self.path / SNAPSHOT_NAME)
        except FileNotFoundError:
            return
        except (snap.SnapshotError, OSError) as e:  # a bad snapshot is only a slower start
            self._discard_snapshot(e)
            return
        try:
            self._load_shards(reader)
        finally:
            os.close(fd)

    def _load_shards(self, reader: snap.Reader) -> None:
        try:
            listing = self._list()
        except OSError as e:
            self._discard_snapshot(e)
            return
        # position in reader.units -> the unit it names here (new id), 0: not usable (changed, unsealed)
        lut = np.zeros(len(reader.units) + 1, dtype=np.uint32)  # [-1]: an unlisted unit
        loaded: list[tuple[_Unit, int]] = []
        with self._lock:
            for i, su in enumerate(reader.units):
                if not su.sealed or listing.get(su.name) != su.scanned or su.name in self._by_name:
                    continue  # unsealed or changed since: scanned afresh
                unit = self._add_unit(su.name)
                unit.size = unit.scanned = su.scanned
                unit.sealed = True
                lut[i] = unit.id
                loaded.append((unit, i))
        bad_offs = np.fromiter({o for n, o in self._quarantine if n in {u.name for u, _ in loaded}}, dtype=np.uint64)
        counts = np.zeros(len(reader.units), dtype=np.int64)
        sums = np.zeros(len(reader.units), dtype=np.uint64)
        dropped = 0
        t0 = time.perf_counter()
        try:
            for sh in range(SHARDS):
                x, uids, offs, lens = reader.shard(sh)
                if not len(x):
                    continue
                pos = reader.unit_pos(uids)
                new = lut[pos]
                ok = reader.entries_ok(pos, offs, lens) & (new != 0)
                if len(bad_offs):
                    for i in np.flatnonzero(ok & np.isin(offs, bad_offs)).tolist():
                        ok[i] = (reader.units[pos[i]].name, int(offs[i])) not in self._quarantine
                n_ok = int(ok.sum())
                dropped += len(x) - n_ok
                if n_ok < len(x):
                    new = np.where(ok, new, DEAD).astype(np.uint32)
                self.index.insert_sorted_shard(sh, x, new, offs, lens, total_hint=reader.total)
                # per unit, for the trailer check: entries and the sum of their hashes
                p, h = (pos, entry_hash(x, offs, lens)) if n_ok == len(x) else \
                    (pos[ok], entry_hash(x[ok], offs[ok], lens[ok]))
                counts += np.bincount(p, minlength=len(counts))
                np.add.at(sums, p, h)
        except (snap.SnapshotError, ValueError, OSError) as e:  # shards already in: forget them, scan all
            self._drop_many([u for u, _ in loaded])
            self._discard_snapshot(e)
            return
        self.counters.add("snapshot_dropped_entries", dropped)
        # each bulk insert merges into every shard (cost ~ the index's size): the scan of the segments
        # newer than the snapshot goes in as one batch (up to the snapshot's size), not a doubling series
        self._batched = max(self._batched, reader.total - dropped)
        log.info("lifeboat: %s: loaded index snapshot with %d pages in %.0f ms", self.path,
                 reader.total - dropped, (time.perf_counter() - t0) * 1000)
        self._check_snapshot(loaded, counts, sums)

    def _check_snapshot(self, loaded: list[tuple[_Unit, int]], counts: np.ndarray, sums: np.ndarray) -> None:
        """Drop every unit whose snapshot entries are not all in its trailer, then index the trailers.

        Same count: the sums of entry_hash must match (the same entries). Fewer (keys written again
        elsewhere, quarantined): each entry the index holds for the unit must be a trailer row. Bad
        units are all dropped before any trailer is indexed, so a wrong entry can never keep a right
        one out (insert-if-absent)."""
        tables: dict[int, np.ndarray] = {}
        bad: list[_Unit] = []
        same: list[tuple[_Unit, int, np.ndarray]] = []  # as many entries as trailer rows: hashed in batches

        def check_same() -> None:
            sums_ok = snap.table_hash_sums([t for _, _, t in same], sums[[i for _, i, _ in same]])
            bad.extend(u for (u, _, _), ok in zip(same, sums_ok) if not ok)
            same.clear()

        for unit, i in loaded:
            try:
                fd = self._acquire(unit)
            except OSError:
                bad.append(unit)
                continue
            try:
                table = read_table(fd, os.fstat(fd).st_size)
            except OSError:
                table = None
            finally:
                self._release(unit)
            n = int(counts[i])
            if table is None or n > len(table):
                bad.append(unit)
            elif n == len(table):
                if n:
                    same.append((unit, i, table))
            else:
                if n:
                    found, u, o, ln = self.index.locate(table["key"])
                    match = found & (u == unit.id) & (o == table["offset"]) & (ln == table["length"])
                    if int(match.sum()) != n:
                        bad.append(unit)
                        continue
                tables[unit.id] = table
            if len(same) >= _HASH_BATCH:
                check_same()
        check_same()
        self._flush_batch()
        if bad:
            self.counters.add("snapshot_mismatched_units", len(bad))
            self.index.drop_units(u.id for u in bad)
            for unit in bad:
                unit.sealed, unit.scanned, unit.walked = False, 0, -1  # the refresh scans it afresh
            self._log_once("snapshot-bad", "lifeboat: %s: the index snapshot disagreed with %d segment(s); "
                                           "rescanning them", self.path, len(bad))
        bad_ids = {u.id for u in bad}
        kept = [u for u, _ in loaded if u.id not in bad_ids]
        self._snap_covered = {u.name: u.size for u in kept}
        self.counters.add("snapshot_segments", len(kept))
        self.counters.add("snapshot_pages", int(sum(int(counts[i]) for u, i in loaded if u.id not in bad_ids)))
        for unit, _ in loaded:
            if unit.id in tables:
                self._index_entries(unit, tables[unit.id]["key"], tables[unit.id]["offset"],
                                    tables[unit.id]["length"])

    # ------------------------------------------------------------------ verify / close
    def records(self) -> Iterator[tuple[int, Loc]]:
        return self.index.items()

    def flush(self) -> None:
        self.seal()

    def close(self) -> None:
        self._closed.set()
        self.seal()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=5)
        if self._unsealed:
            self._retry_seals()
        self.save_snapshot()
        with self._lock:
            for w in [*self._writers, *self._sealing]:  # a write still in flight: never leave its fd open
                if w is not None and w.fd >= 0:
                    os.close(w.fd)
                    w.fd = -1
            self._sealing.clear()
            for u in self._units.values():
                if u.fd is not None:
                    os.close(u.fd)
                    u.fd = None
        if self._changes is not None:
            self._changes.close()



def _reserve_run(fd: int, off: int, offs: list[int], trailer: int) -> int:
    """Reserve the blocks of a run's records (offsets `offs` from `off`) and of a trailer after them.

    Returns how many leading records got their room: on a full disk, as many as fit (halving), so a
    run loses only what did not fit. Raises OSError when not even the first fits.
    """
    n = len(offs) - 1
    while True:
        try:
            reserve_space(fd, off, offs[n] + trailer)
            return n
        except OSError as e:
            if e.errno != errno.ENOSPC or n <= 1:
                raise
            n //= 2
