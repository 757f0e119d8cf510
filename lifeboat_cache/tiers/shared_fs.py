"""`type: nfs`: a segment directory on a shared file system (NFS, NetApp ONTAP NFS exports).

Same segment layout as `local`; several processes on several hosts write into one directory, one
writer per segment file (host and pid in its name), and nothing relies on cross-host locks.

What differs from `local`, and why:
* Close-to-open. NFS only promises that a reader sees what a writer wrote if the reader opens the
  file after the writer closed it. So another writer's segment is indexed only once it is sealed
  (trailer written, fdatasync'ed, closed), and it is opened afresh after the seal is seen; an
  unsealed foreign segment is only probed (open, stat, read the footer, close), never walked.
  A writer seals after `seal_after_s` (default 2 s), so pages reach other hosts within about
  `seal_after_s + refresh_interval_s`; the writer itself sees them at once.
* Commit order. Records are fdatasync'ed before the trailer is written, so a valid trailer can
  never be visible on the server ahead of the records it lists.
* Crashed writers. A segment on this host whose writer pid is dead is sealed at open (as for
  `local`). A foreign segment that has stopped growing for `stale_unsealed_s` is walked record by
  record (each CRC-checked, stopping at the torn tail) and then treated as sealed, so its pages
  are served and the segment can be evicted.
* Eviction races. Another host may evict (unlink) a segment this host has open; a read then fails
  with ESTALE, which is a stale location (a miss), not a tier failure.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from typing import Any, Sequence

from ..index import Loc
from .local import LocalTier
from .segfile import FOOTER_SIZE, Entry, ForeignFile, open_file, parse_footer, parse_name, write_trailer
from .segment import SegmentDir, _Unit

log = logging.getLogger(__name__)

MIN_STALE_UNSEALED_S = 60.0


class SharedSegmentDir(SegmentDir):
    """A segment directory that writers on other hosts share (see the module docstring)."""

    def __init__(self, *args: Any, stale_unsealed_s: float | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        seal_s = self.seal_after_s if self.seal_after_s is not None else 2.0
        # a live writer seals within seal_after_s + one refresh; far longer without growth = crashed
        self.stale_unsealed_s = (stale_unsealed_s if stale_unsealed_s is not None
                                 else max(MIN_STALE_UNSEALED_S, 10 * (seal_s + self.refresh_interval_s)))
        self._seen: dict[str, tuple[int, float]] = {}  # foreign unsealed: (size, when first seen at it)
        self.counters.update(foreign_unsealed=0, foreign_abandoned=0, stale_handles=0)

    def _writer_dead_here(self, unit: _Unit) -> bool:
        parsed = parse_name(unit.name)
        if parsed is None or parsed[0] != self._tag.split("-")[0] or parsed[1] == os.getpid():
            return False
        try:
            os.kill(parsed[1], 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def _scan(self, unit: _Unit) -> None:
        if unit.own or unit.sealed:
            return super()._scan(unit)
        try:  # probe with a fresh open (close-to-open revalidation), never a cached fd
            fd = open_file(unit.path, os.O_RDONLY)
        except FileNotFoundError:
            self._drop(unit)
            return
        except ForeignFile as e:
            self._foreign(unit.name, str(e))
            self._drop(unit)
            return
        except OSError as e:
            log.warning("lifeboat: cannot open %s: %s", unit.path, e)
            return
        try:
            size = os.fstat(fd).st_size
            sealed = size >= FOOTER_SIZE and parse_footer(os.pread(fd, FOOTER_SIZE, size - FOOTER_SIZE),
                                                          size) is not None
        except OSError as e:
            log.warning("lifeboat: cannot probe %s: %s", unit.path, e)
            return
        finally:
            os.close(fd)
        unit.size = size
        if sealed:
            self._seen.pop(unit.name, None)
            return super()._scan(unit)
        now = time.monotonic()
        prev = self._seen.get(unit.name)
        if prev is None or prev[0] != size:
            self._seen[unit.name] = (size, now)
            prev = (size, now)
        abandoned = now - prev[1] >= self.stale_unsealed_s
        if not (abandoned or self._writer_dead_here(unit)):
            self.counters["foreign_unsealed"] += 1
            return
        super()._scan(unit)  # CRC-checked walk up to the torn tail
        if abandoned and not unit.sealed:
            unit.sealed = True  # no longer growing: stop rescanning, let eviction reclaim it
            self._seen.pop(unit.name, None)
            self.counters["foreign_abandoned"] += 1
            log.info("lifeboat: %s: segment %s stopped growing %.0f s ago unsealed; served up to byte %d",
                     self.path, unit.name, now - prev[1], unit.scanned)

    def _write_trailer(self, fd: int, at: int, entries: Sequence[Entry]) -> int:
        os.fdatasync(fd)  # the records reach the server before the trailer that publishes them
        return write_trailer(fd, at, entries)

    def read_into(self, loc: Loc, bufs: Sequence[memoryview]) -> bool:
        try:
            return super().read_into(loc, bufs)
        except OSError as e:
            if e.errno != errno.ESTALE:
                raise
        with self._lock:  # evicted by another host while open here: a stale location
            unit = self._units.get(loc.unit)
        if unit is not None:
            self._drop(unit)
        self.counters["stale_handles"] += 1
        return False


class SharedFsTier(LocalTier):
    kind = "nfs"
    shared = True
    fsync = True
    segment_dir_cls = SharedSegmentDir
