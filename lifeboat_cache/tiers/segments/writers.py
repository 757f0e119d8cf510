"""This process's open segments: stripes, space reservation, runs of appends, sealing and trailer retry.

Each writing thread sticks to one stripe (one open segment: buffered writes to one file serialize on
its inode lock). A run of records reserves its room (and the room of a trailer listing every record
so far) before it is written, so a full disk never leaves a segment unsealable; a record is indexed
only after its bytes are written (write, then index). A segment is sealed once every write that
reserved room in it has returned; a trailer that cannot be written (full disk) is retried later.
Trailers are written, and fdatasync'ed on nfs, outside the unit table's lock, by the thread that made
the segment ready: an NFS commit of a segment's records can take a second or more, and every read and
write of the directory takes that lock (measured: warm reads beside 200 MB/s of backups on an nfs tier
waited up to 0.57 s for it, p99 0.25 s, against 12 ms on a local tier).
Records that retention keeps (reinsertion) go through one more open segment, the keeper lane, whose
name carries the age of the oldest record in it, so age rules (max_age, purge --older-than) still see
when a kept record was first written.

`pwritev_all` is looked up in this module at each write: tests patch `writers.pwritev_all` to hold
or fail a record write (the trailer writes are not affected).
"""

from __future__ import annotations

import bisect
import errno
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ...fsio import PartialWrite, WriteCallBound, open_file, pwritev_all, reserve_space
from ...index import Index, Loc
from ...metrics import Counters
from ...records import Entry, Record, raw_length, trailer_size
from .format import unit_ms
from .units import Unit, UnitTable

log = logging.getLogger(__name__)


@dataclass
class Writer:
    unit: Unit
    fd: int
    created: float
    reserved: int = 0
    inflight: int = 0
    count: int = 0  # records reserved (written or not)
    sealing: bool = False
    entries: list[Entry] = field(default_factory=list)


@dataclass
class Promise:
    """Room a run made in the capacity before it is written (directory.append_many). `projected_bytes`
    counts what is left of it until the run reserves it, so capacity gc run by another thread in
    between sees it: concurrent runs cannot each make room for themselves only and overshoot together."""

    left: int


class Writers:
    """The open segments of one directory (`stripes` of them), under the unit table's lock.

    `changed(segments)` tells the other processes of this host (the change counter); `write_trailer`
    commits a seal (nfs: fdatasync first); `log_once` logs a failure once per key.
    """

    def __init__(self, table: UnitTable, index: Index, counters: Counters, *, stripes: int, segment_bytes: int,
                 file_mode: int, fsync: bool, changed: Callable[[bool], None],
                 write_trailer: Callable[[int, int, Sequence[Entry]], int], log_once: Callable[..., bool],
                 write_call_bytes: int = 0) -> None:
        self.table, self.index, self.counters = table, index, counters
        self.segment_bytes = segment_bytes
        self.write_call_bound = WriteCallBound(write_call_bytes)  # the largest single write call: why there
        self.file_mode, self.fsync = file_mode, fsync
        self._changed, self._write_trailer, self._log_once = changed, write_trailer, log_once
        self._lock = table.lock
        self._writers: list[Writer | None] = [None] * (stripes + 1)  # the stripes, then the keeper lane
        self._keeper = stripes
        self._stripe = threading.local()
        self._stripe_next = 0
        self._sealing: list[Writer] = []  # waiting for in-flight writes before their trailer
        self._ready: list[Writer] = []  # every write returned: the trailer is next (`_seal_ready`)
        self._committing = 0  # trailers being written now, outside the lock
        self._committed = threading.Condition(self._lock)
        self._unsealed: list[tuple[Unit, list[Entry], int]] = []  # trailer write failed (full disk): retried
        self._promised = 0  # what is left of every run's Promise

    @property
    def stripes(self) -> int:
        return self._keeper

    def open(self) -> list[Writer]:
        """The open segments now (a copy; their fields are read under `table.lock`)."""
        with self._lock:
            return [w for w in self._writers if w is not None]

    def open_names(self) -> set[str]:
        with self._lock:
            return {w.unit.name for w in self._writers if w is not None}

    def projected_bytes(self) -> int:
        """Bytes on disk once every open segment is sealed: what the capacity must hold. An open segment
        counts what its writes reserved plus its trailer; each run makes room for itself before it is
        written (directory.append_many), so the bound holds without counting open segments full."""
        with self._lock:
            own = {w.unit.id: w.reserved + trailer_size(w.count) for w in self._writers[:self._keeper]
                   if w is not None}  # the keeper lane counts what it holds: it fills only inside an eviction
            return sum(own.get(u.id, u.size) for u in self.table.live()) + self._promised

    def promise(self, nbytes: int) -> Promise:
        """Count `nbytes` a run is about to write in `projected_bytes` until it reserves them."""
        with self._lock:
            self._promised += nbytes
            return Promise(nbytes)

    def release(self, promise: Promise) -> None:
        """Stop counting what a run promised and did not reserve (it ended, written or failed)."""
        with self._lock:
            self._promised -= promise.left
            promise.left = 0

    # ------------------------------------------------------------------ appends
    def would_roll(self, length: int) -> bool:
        """Whether this thread's next record of `length` bytes opens a new segment."""
        with self._lock:
            w = self._writers[self._my_stripe()]
            return w is None or (w.reserved + length > self.segment_bytes and w.reserved > 0)

    def append_part(self, records: Sequence[Record], first: int, *, kept_ms: int | None = None,
                    promise: Promise | None = None) -> tuple[list[Loc], bool, OSError | None]:
        """Write and index the records from `first` on that fit in this thread's open segment (at
        least one). Returns their locs, whether a segment was opened, and the error that stopped it.
        `kept_ms`: the records are kept by retention and were first written at kept_ms (the keeper lane).
        `promise`: what the run promised; the bytes reserved here are taken from it. Then seals the
        segments that are ready (one this run filled or ended, or one another thread left ready)."""
        try:
            return self._append_part(records, first, kept_ms, promise)
        finally:
            self._seal_ready()

    def _append_part(self, records: Sequence[Record], first: int, kept_ms: int | None,
                     promise: Promise | None) -> tuple[list[Loc], bool, OSError | None]:
        with self._lock:
            stripe = self._my_stripe() if kept_ms is None else self._keeper
            w = self._writer_for(stripe, records[first][3], kept_ms)
            rolled = w.reserved == 0
            before = 0 if rolled else w.reserved + trailer_size(w.count)
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
            if promise is not None:  # now counted as reserved: no longer as promised
                taken = min(promise.left, w.reserved + trailer - before)
                promise.left -= taken
                self._promised -= taken
        run = records[first:end]
        offs = np.cumsum([0] + [r[3] for r in run]).tolist()  # record k spans offs[k]..offs[k+1] from off
        err: OSError | None = None
        try:
            done = reserve_run(w.fd, off, offs, trailer)
            pwritev_all(w.fd, [b for r in run[:done] for b in r[2]], off, self.write_call_bound())
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
                self._ready_to_seal(w)
        locs = [Loc(w.unit.id, off + offs[k], r[3]) for k, r in enumerate(run[:done])]
        if locs:
            self.index.insert_many([r[0] for r in run[:done]], locs)
        return locs, rolled, err

    def _my_stripe(self) -> int:
        """Each writing thread sticks to one stripe (one open segment)."""
        s = getattr(self._stripe, "i", None)
        if s is None:
            s = self._stripe.i = self._stripe_next % self._keeper
            self._stripe_next += 1
        return s

    def _writer_for(self, stripe: int, length: int, kept_ms: int | None = None) -> Writer:
        w = self._writers[stripe]
        full = w is not None and w.reserved + length > self.segment_bytes and w.reserved > 0
        younger = w is not None and kept_ms is not None and unit_ms(w.unit.name) > kept_ms
        if w is not None and (full or younger):  # the keeper lane's name must not be younger than a record
            self._writers[stripe] = None
            self._start_seal(w)
            w = None
        if w is None:
            name = self.table.new_name(kept_ms)
            fd = open_file(self.table.path / name, os.O_RDWR | os.O_CREAT, self.file_mode)
            unit = self.table.add(name, own=True)
            w = self._writers[stripe] = Writer(unit, fd, time.monotonic())
            self._changed(True)
        return w

    # ------------------------------------------------------------------ sealing
    def _start_seal(self, w: Writer) -> None:
        """No more writes go to w (called under the lock); it is sealed once those in flight return."""
        w.sealing = True
        if w.inflight == 0:
            self._ready_to_seal(w)
        elif w not in self._sealing:
            self._sealing.append(w)

    def _ready_to_seal(self, w: Writer) -> None:
        """Every write to w returned (called under the lock): its trailer is next, outside the lock."""
        if w in self._sealing:
            self._sealing.remove(w)
        if w.fd >= 0 and w not in self._ready:
            self._ready.append(w)

    def _seal_ready(self) -> None:
        """Seal the segments that are ready, one at a time, without holding the lock for their I/O.
        Every method that can make a segment ready calls this after releasing the lock."""
        while True:
            with self._lock:
                if not self._ready:
                    return
                w = self._ready.pop()
                self._committing += 1
            try:
                self._seal(w)
            finally:
                with self._lock:
                    self._committing -= 1
                    self._committed.notify_all()

    def _seal(self, w: Writer) -> None:
        """Seal a segment whose writes have all returned; only this thread holds it now.

        The trailer lists every record that was written, holes left by failed writes included; only
        bytes after the last written record are cut. A segment that cannot be sealed (full disk) is
        marked sealed in memory so eviction can reclaim it, and one with no record is removed. Until
        the unit is marked sealed (under the lock, after the I/O) it counts as open: eviction, purge
        and compaction leave it alone, and readers read its records as before.
        """
        entries = sorted(w.entries, key=lambda e: e[1])
        end = max((e[1] + e[2] for e in entries), default=0)
        unit = w.unit
        size: int | None = None  # the sealed size, or where the records end after a failure
        err: OSError | None = None
        ok = False
        try:
            if not entries:
                os.unlink(unit.path)
            else:
                if os.fstat(w.fd).st_size > end:  # a failed write's partial bytes (same size: keep the reserved blocks)
                    os.ftruncate(w.fd, end)
                size = self._write_trailer(w.fd, end, entries)
                if self.fsync:
                    os.fdatasync(w.fd)
            ok = True
        except OSError as e:
            err, size = e, None
            if entries:
                try:
                    os.ftruncate(w.fd, end)  # drop a partial trailer; the records stay
                    size = end
                except OSError:
                    pass
        finally:
            with self._lock:
                try:
                    if ok and not entries:
                        self.table.drop(unit)
                    elif ok:
                        unit.size = unit.scanned = unit.walked = size  # type: ignore[assignment]
                        self.counters.add("sealed_segments")
                        self._changed(True)
                    else:
                        self.counters.add("seal_failures")
                        self._log_once(f"seal:{getattr(err, 'errno', None)}", "lifeboat: sealing %s failed (%s); its "
                                       "records stay indexed, the seal is retried (and the next open walks it)",
                                       unit.path, err)
                        unit.size = w.reserved if size is None else size
                        unit.scanned, unit.walked = 0, -1
                        if entries:
                            self._unsealed.append((unit, entries, end))
                finally:
                    unit.sealed = True  # no more writes: evictable
                    unit.own = False
                    os.close(w.fd)
                    w.fd = -1

    @property
    def has_unsealed(self) -> bool:
        """Whether a trailer failed earlier and waits for `retry_seals`."""
        return bool(self._unsealed)

    def retry_seals(self) -> None:
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
        """Seal the open segments now (flush / close / shared-FS visibility); those with a write in
        flight are sealed by the writing thread when it returns."""
        with self._lock:
            for i, w in enumerate(self._writers):
                self._writers[i] = None
                if w is not None:
                    self._start_seal(w)
        self._seal_ready()

    def seal_older(self, seal_after_s: float) -> None:
        """Seal the open segments that got their first record at least seal_after_s ago."""
        with self._lock:
            for i, w in enumerate(self._writers):
                if w is not None and w.reserved and time.monotonic() - w.created >= seal_after_s:
                    self._writers[i] = None
                    self._start_seal(w)
        self._seal_ready()

    def seal_idle(self) -> None:
        """Seal the open segments with records and no write in flight (gc: only they are left to evict)."""
        with self._lock:
            for i, w in enumerate(self._writers):
                if w is not None and w.inflight == 0 and w.reserved:
                    self._writers[i] = None
                    self._start_seal(w)
        self._seal_ready()

    def touch(self) -> None:
        """Update the mtime of every open segment (nfs heartbeat); a seal closes the fd under the same lock."""
        with self._lock:
            for w in self._writers:
                if w is not None and w.fd >= 0 and not w.sealing:
                    try:
                        os.utime(w.fd)
                    except OSError as e:
                        self._log_once(f"beat:{e.errno}", "lifeboat: cannot touch %s: %s", w.unit.path, e)

    def close(self) -> None:
        """Close every writer fd, a write still in flight included (call after `seal`), once the
        trailers other threads are writing are written."""
        self._seal_ready()
        with self._lock:
            self._committed.wait_for(lambda: self._committing == 0)
            for w in [*self._writers, *self._sealing]:
                if w is not None and w.fd >= 0:
                    os.close(w.fd)
                    w.fd = -1
            self._sealing.clear()


def reserve_run(fd: int, off: int, offs: list[int], trailer: int) -> int:
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
