"""This process's open segments: stripes, space reservation, runs of appends (seals.py seals them).

Each writing thread sticks to one stripe (one open segment: buffered writes to one file serialize on
its inode lock). A run of records reserves its room (and the room of a trailer listing every record
so far) before it is written, so a full disk never leaves a segment unsealable; a record is indexed
only after its bytes are written (write, then index).
Records that retention keeps (reinsertion) go through one more open segment, the keeper lane, whose
name carries the age of the oldest record in it, so age rules (max_age, purge --older-than) still see
when a kept record was first written.

`pwritev_all` is looked up in this module at each write: tests patch `writers.pwritev_all` to hold
or fail a record write (the trailer writes are not affected).
"""

from __future__ import annotations

import bisect
import errno
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ...fsio import PartialWrite, WriteCallBound, open_file, pwritev_all, reserve_space
from ...index import Index, Loc
from ...metrics import Counters
from ...records import Entry, Record, framing, raw_length, trailer_size
from .format import unit_ms
from .seals import Seals, Writer
from .units import UnitTable


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
        self.file_mode = file_mode
        self._changed, self._log_once = changed, log_once
        self.seals = Seals(table, counters, fsync=fsync, write_trailer=write_trailer, changed=changed,
                           log_once=log_once)
        self._lock = table.lock
        self._writers: list[Writer | None] = [None] * (stripes + 1)  # the stripes, then the keeper lane
        self._keeper = stripes
        self._stripe = threading.local()
        self._stripe_next = 0
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
        """The pages' bytes on disk once every open segment is sealed: what the capacity must hold (each
        unit's size less its framing, records.framing). An open segment counts what its writes reserved;
        each run makes room for itself before it is written (directory.append_many), so the bound holds
        without counting open segments full. A run's promise counts its pages until they are reserved."""
        with self._lock:
            return sum(u.size - u.framing for u in self.table.live()) + self._promised

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
            self.seals.after_write()

    def _append_part(self, records: Sequence[Record], first: int, kept_ms: int | None,
                     promise: Promise | None) -> tuple[list[Loc], bool, OSError | None]:
        fresh: tuple[str, int] | None = None  # a segment file created for this run, outside the lock
        while True:
            with self._lock:
                stripe = self._my_stripe() if kept_ms is None else self._keeper
                w = self._writer_for(stripe, records[first][3], kept_ms, fresh)
                if w is not None:
                    if fresh is not None and w.fd == fresh[1]:
                        fresh = None  # installed
                    rolled, off, end, trailer = self._reserve(w, records, first, promise)
                    break
            fresh = self._create(kept_ms)  # an NFS create is a round trip: never under the lock
        if fresh is not None:  # another thread of this stripe opened a segment first: ours goes unused
            self._discard(*fresh)
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
                self.seals.start(w)
            elif w.sealing and w.inflight == 0:
                self.seals.ready(w)
        locs = [Loc(w.unit.id, off + offs[k], r[3]) for k, r in enumerate(run[:done])]
        if locs:
            self.index.insert_many([r[0] for r in run[:done]], locs)
        return locs, rolled, err

    def _reserve(self, w: Writer, records: Sequence[Record], first: int,
                 promise: Promise | None) -> tuple[bool, int, int, int]:
        """Reserve room in w for the records from `first` on that fit (at least one), under the lock:
        (whether w was empty, the offset, the end of the run, the trailer's size after it)."""
        rolled = w.reserved == 0
        before = w.unit.size - w.unit.framing  # what projected_bytes counts of it
        off = w.reserved
        end, total = first, 0
        while end < len(records) and (end == first or off + total + records[end][3] <= self.segment_bytes):
            total += records[end][3]
            end += 1
        w.reserved += total
        w.count += end - first
        trailer = trailer_size(w.count)  # room for a trailer listing every record so far
        w.unit.size, w.unit.framing = w.reserved, framing(w.count, sealed=False)
        w.inflight += 1
        if promise is not None:  # now counted as reserved: no longer as promised
            taken = min(promise.left, w.unit.size - w.unit.framing - before)
            promise.left -= taken
            self._promised -= taken
        return rolled, off, end, trailer

    def _my_stripe(self) -> int:
        """Each writing thread sticks to one stripe (one open segment)."""
        s = getattr(self._stripe, "i", None)
        if s is None:
            s = self._stripe.i = self._stripe_next % self._keeper
            self._stripe_next += 1
        return s

    def _writer_for(self, stripe: int, length: int, kept_ms: int | None,
                    fresh: tuple[str, int] | None) -> Writer | None:
        """The stripe's open segment for a record of `length` (called under the lock): a full one (or,
        in the keeper lane, one younger than kept_ms) is sealed and replaced by `fresh`, the (name, fd)
        of a file `_create`d for it; None when a new one is needed and there is no fresh file yet."""
        w = self._writers[stripe]
        full = w is not None and w.reserved + length > self.segment_bytes and w.reserved > 0
        younger = w is not None and kept_ms is not None and unit_ms(w.unit.name) > kept_ms
        if w is not None and (full or younger):  # the keeper lane's name must not be younger than a record
            self._writers[stripe] = None
            self.seals.start(w)
            w = None
        if w is None:
            if fresh is None:
                return None
            name, fd = fresh
            unit = self.table.named(name) or self.table.add(name, own=True)  # a refresh may have listed it
            unit.own = True
            w = self._writers[stripe] = Writer(unit, fd, time.monotonic())
            self._changed(True)
        return w

    def _create(self, kept_ms: int | None) -> tuple[str, int]:
        """A new segment file of this process: (name, fd). Raises OSError."""
        name = self.table.new_name(kept_ms)
        return name, open_file(self.table.path / name, os.O_RDWR | os.O_CREAT, self.file_mode)

    def _discard(self, name: str, fd: int) -> None:
        """Remove a segment file created and never written (another thread's came first)."""
        os.close(fd)
        try:
            os.unlink(self.table.path / name)
        except OSError:
            pass  # an empty file of this process: the next open removes it

    def seal(self) -> None:
        """Seal the open segments now (flush / close / shared-FS visibility); those with a write in
        flight are sealed once it returns (seals.after_write)."""
        with self._lock:
            for i, w in enumerate(self._writers):
                self._writers[i] = None
                if w is not None:
                    self.seals.start(w)
        self.seals.seal_ready()

    def seal_older(self, seal_after_s: float) -> None:
        """Seal the open segments that got their first record at least seal_after_s ago."""
        with self._lock:
            for i, w in enumerate(self._writers):
                if w is not None and w.reserved and time.monotonic() - w.created >= seal_after_s:
                    self._writers[i] = None
                    self.seals.start(w)
        self.seals.seal_ready()

    def seal_idle(self) -> None:
        """Seal the open segments with records and no write in flight (gc: only they are left to evict)."""
        with self._lock:
            for i, w in enumerate(self._writers):
                if w is not None and w.inflight == 0 and w.reserved:
                    self._writers[i] = None
                    self.seals.start(w)
        self.seals.seal_ready()

    def touch(self) -> None:
        """Update the mtime of every open segment (nfs heartbeat). Each utime is a round trip to the
        filer, so it runs outside the lock, by path: a segment sealed meanwhile only gets a newer mtime."""
        with self._lock:
            paths = [w.unit.path for w in self._writers if w is not None and w.fd >= 0 and not w.sealing]
        for path in paths:
            try:
                os.utime(path)
            except FileNotFoundError:
                pass  # evicted since (an empty segment sealed away)
            except OSError as e:
                self._log_once(f"beat:{e.errno}", "lifeboat: cannot touch %s: %s", path, e)

    def close(self) -> None:
        """Close every writer fd, a write still in flight included (call after `seal`), once the
        trailers other threads are writing are written."""
        self.seals.close()
        with self._lock:
            for w in self._writers:
                if w is not None and w.fd >= 0:
                    os.close(w.fd)
                    w.fd = -1


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
