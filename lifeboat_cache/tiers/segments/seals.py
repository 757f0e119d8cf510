"""Sealing this process's segments: a trailer once every write to a segment has returned, and its retry.

A segment is sealed once every write that reserved room in it has returned; a trailer that cannot be
written (full disk) is retried later. Trailers are written, and fdatasync'ed on nfs, outside the unit
table's lock: an NFS commit of a segment's records can take a second or more, and every read and write
of the directory takes that lock (`lifeboat bench --only busy_tier`, beside 200 MB/s of backups on an nfs
tier: read p99 148 ms before, 12 ms since; docs/storage.md). A segment a write filled or ended is sealed
by that writing thread on a local tier (a trailer write), and by a short-lived sealing thread where seals
fdatasync, so no put waits for an NFS commit (put p99 156 ms before, 22 ms since). A seal that is asked
for (flush, close, seal_after_s, capacity gc) is done before the call returns. A trailer that failed
is retried outside the lock too (`retry`), and on nfs it is fdatasync'ed as a first seal is.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ...fsio import open_file
from ...metrics import Counters
from ...records import Entry, framing
from .units import Unit, UnitTable

log = logging.getLogger(__name__)


@dataclass
class Writer:
    """An open segment this process appends to (its fields are read and changed under `table.lock`)."""

    unit: Unit
    fd: int
    created: float
    reserved: int = 0
    inflight: int = 0
    count: int = 0  # records reserved (written or not)
    sealing: bool = False
    entries: list[Entry] = field(default_factory=list)


class Seals:
    """The segments of one directory on their way to being sealed, under the unit table's lock.

    `write_trailer` commits a seal (nfs: fdatasync first); `fsync`: fdatasync after the trailer too, and
    seal on a sealing thread after a write; `changed(segments)` tells the other processes of this host;
    `log_once` logs a failure once per key.
    """

    def __init__(self, table: UnitTable, counters: Counters, *, fsync: bool,
                 write_trailer: Callable[[int, int, Sequence[Entry]], int], changed: Callable[[bool], None],
                 log_once: Callable[..., bool]) -> None:
        self.table, self.counters, self.fsync = table, counters, fsync
        self._write_trailer, self._changed, self._log_once = write_trailer, changed, log_once
        self._lock = table.lock
        self._sealing: list[Writer] = []  # waiting for in-flight writes before their trailer
        self._ready: list[Writer] = []  # every write returned: the trailer is next (`seal_ready`)
        self._committing = 0  # trailers being written now, outside the lock
        self._committed = threading.Condition(self._lock)
        self._sealer = False  # a sealing thread is running (`_in_background`)
        self._unsealed: list[tuple[Unit, list[Entry], int]] = []  # trailer write failed (full disk): retried

    def after_write(self) -> None:
        """After a write returned: seal what is ready, on a sealing thread where seals fdatasync."""
        if self.fsync:
            self._in_background()
        else:
            self.seal_ready()

    def start(self, w: Writer) -> None:
        """No more writes go to w (called under the lock); it is sealed once those in flight return."""
        w.sealing = True
        if w.inflight == 0:
            self.ready(w)
        elif w not in self._sealing:
            self._sealing.append(w)

    def ready(self, w: Writer) -> None:
        """Every write to w returned (called under the lock): its trailer is next, outside the lock."""
        if w in self._sealing:
            self._sealing.remove(w)
        if w.fd >= 0 and w not in self._ready:
            self._ready.append(w)

    def seal_ready(self) -> None:
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

    def _in_background(self) -> None:
        """Seal the ready segments on a sealing thread (one at a time), unless one is running: it seals
        what becomes ready while it runs, and the last check before it ends starts another."""
        with self._lock:
            if self._sealer or not self._ready:
                return
            self._sealer = True
        threading.Thread(target=self._thread, name="lifeboat-seal", daemon=True).start()

    def _thread(self) -> None:
        try:
            self.seal_ready()
        except Exception:  # never let a seal kill the thread silently
            log.exception("lifeboat: sealing a segment failed")
        finally:
            with self._lock:
                self._sealer = False
        self._in_background()  # one made ready after this thread's last look

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
                size = self._commit(w.fd, end, entries)
            ok = True
        except OSError as e:
            err = e
            size = end if entries and self._cut_back(w.fd, end) else None
        finally:
            with self._lock:
                try:
                    if ok and not entries:
                        self.table.drop(unit)
                    elif ok:
                        self._mark_sealed(unit, size, len(entries))  # type: ignore[arg-type]
                    else:
                        self.counters.add("seal_failures")
                        self._log_once(f"seal:{getattr(err, 'errno', None)}", "lifeboat: sealing %s failed (%s); its "
                                       "records stay indexed, the seal is retried (and the next open walks it)",
                                       unit.path, err)
                        unit.size = w.reserved if size is None else size
                        unit.framing = framing(w.count if size is None else len(entries), sealed=False)
                        unit.scanned, unit.walked = 0, -1
                        if entries:
                            self._unsealed.append((unit, entries, end))
                finally:
                    unit.sealed = True  # no more writes: evictable
                    unit.own = False
                    fd, w.fd = w.fd, -1
            os.close(fd)  # outside the lock: an NFSv4 close is a round trip

    def _commit(self, fd: int, end: int, entries: Sequence[Entry]) -> int:
        """Write the trailer after the records ending at `end` (bytes past them cut first: a failed
        write's partial bytes), fdatasync'ed where seals are; returns the sealed size. Raises OSError."""
        if os.fstat(fd).st_size > end:  # same size: keep the reserved blocks
            os.ftruncate(fd, end)
        size = self._write_trailer(fd, end, entries)
        if self.fsync:
            os.fdatasync(fd)
        return size

    @staticmethod
    def _cut_back(fd: int, end: int) -> bool:
        """After a failed commit: drop a partial trailer (the records stay); whether that worked."""
        try:
            os.ftruncate(fd, end)
            return True
        except OSError:
            return False

    def _mark_sealed(self, unit: Unit, size: int, records: int) -> None:
        """A committed seal (called under the lock): the unit's sealed size, counted, told to this host."""
        unit.sealed_at(size, records)
        self.counters.add("sealed_segments")
        self._changed(True)

    @property
    def has_unsealed(self) -> bool:
        """Whether a trailer failed earlier and waits for `retry`."""
        return bool(self._unsealed)

    def retry(self) -> None:
        """Write the trailers that failed earlier (the disk may have room again), outside the lock as a
        first seal is: the unit is already evictable, so one evicted meanwhile only loses its trailer."""
        with self._lock:
            todo, self._unsealed = self._unsealed, []
        failed: list[tuple[Unit, list[Entry], int]] = []
        for unit, entries, end in todo:
            if unit.dropped:
                continue
            try:
                fd = open_file(unit.path, os.O_RDWR)
            except OSError:
                continue  # evicted or replaced meanwhile
            size: int | None = None
            try:
                size = self._commit(fd, end, entries)
            except OSError:
                self._cut_back(fd, end)
                failed.append((unit, entries, end))
            finally:
                os.close(fd)
            if size is not None:
                with self._lock:
                    if not unit.dropped:
                        self._mark_sealed(unit, size, len(entries))
        if failed:
            with self._lock:
                self._unsealed.extend(failed)

    def close(self) -> None:
        """Seal what is ready, wait for the seals in progress, then close the fds of segments whose
        writes are still in flight (the directory is closing)."""
        self.seal_ready()
        with self._lock:
            self._committed.wait_for(lambda: self._committing == 0)
            for w in self._sealing:
                if w.fd >= 0:
                    os.close(w.fd)
                    w.fd = -1
            self._sealing.clear()


__all__ = ["Seals", "Writer"]
