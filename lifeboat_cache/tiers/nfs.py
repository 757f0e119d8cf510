"""`type: nfs`: a segment directory on a shared file system (NFS, NetApp ONTAP NFS exports).

Same segment layout as `local`; several processes on several hosts write into one directory, one
writer per segment file (host and pid in its name), and nothing relies on cross-host locks.

What differs from `local`, and why:
* Close-to-open. NFS only promises that a reader sees what a writer wrote if the reader opens the
  file after the writer closed it. So another host's segment is indexed only once it is sealed
  (trailer written, fdatasync'ed, closed), and it is opened afresh after the seal is seen; an
  unsealed segment of another host is only probed (open, stat, read the footer, close), never
  walked. A writer seals after `seal_after_s` (default 2 s), so pages reach other hosts within
  about `seal_after_s + refresh_interval_s`; the writer itself sees them at once. Processes of the
  same host (same host name in the segment name) share one NFS client page cache: their open
  segments are walked as on `local`, prompted by the change counter (changes.py) within ms.
* Commit order. Records are fdatasync'ed before the trailer is written, so a valid trailer can
  never be visible on the server ahead of the records it lists.
* Crashed or paused writers. A segment on this host whose writer pid is dead is sealed at open (as
  for `local`). A writer touches its open segments every `HEARTBEAT_S` (their mtime changes, even
  when idle); a foreign unsealed segment whose (size, mtime) has not changed for `ABANDON_AFTER_S`,
  timed on the reader's own monotonic clock, is abandoned: walked record by record (each
  CRC-checked, stopping at the torn tail) and served. Both are protocol constants, never settings,
  so hosts with different `seal_after_s` / `refresh_interval_s` or skewed clocks agree. An abandoned
  segment is still probed (only when the listing shows a new size or mtime): if it grows, gets a
  heartbeat or a trailer (a writer resumed after SIGSTOP, a long GC pause), it is live again and its
  new pages are indexed like any other. Capacity gc unlinks a foreign unsealed segment only after
  `EVICT_ABANDONED_S` without any change, so a live host's open segment is never evicted.
* Same-host processes. The change counter (changes.py) tells the other processes of this host at
  once when a segment is sealed or created here, so they list without waiting for the refresh.
* Eviction races. Another host may evict (unlink) a segment this host has open; a read then fails
  with ESTALE, which is a stale location (a miss), not a tier failure.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from .local import LocalTier
from .segments import SegmentDir
from .segments.eviction import EvictionPolicy, SharingPolicy
from .segments.format import FOOTER_SIZE, Entry, open_file, parse_footer, parse_name, write_trailer
from .segments.units import Unit

log = logging.getLogger(__name__)

# protocol constants, identical on every host (never derived from settings other hosts may not share)
HEARTBEAT_S = 5.0  # a writer touches its open segments this often
ABANDON_AFTER_S = 60.0  # no size/mtime change this long (12 missed heartbeats): walk and serve it
EVICT_ABANDONED_S = 900.0  # no change this long: capacity gc may unlink it


class NfsSharing(SharingPolicy, EvictionPolicy):
    """The policies of a directory that writers on other hosts share (see the module docstring).

    Made before its directory and passed to it as both `sharing` and `eviction`; `attach` then gives
    it the directory's parts (its hooks are first called once the directory is open)."""

    def __init__(self, stale_unsealed_s: float | None = None) -> None:
        self.stale_unsealed_s = ABANDON_AFTER_S if stale_unsealed_s is None else stale_unsealed_s
        self.evict_abandoned_s = max(EVICT_ABANDONED_S, self.stale_unsealed_s)
        # foreign unsealed: ((size, mtime_ns), monotonic time first seen with it)
        self._seen: dict[str, tuple[tuple[int, int], float]] = {}
        self._abandoned: set[str] = set()
        self._last_beat = 0.0

    def attach(self, d: SegmentDir) -> None:
        self.dir = d
        d.counters.declare("foreign_unsealed", "foreign_abandoned", "foreign_revived", "stale_handles")
        d.table.on_drop(self._forget)

    def _forget(self, unit: Unit) -> None:
        self._seen.pop(unit.name, None)
        self._abandoned.discard(unit.name)

    def _same_host(self, unit: Unit) -> bool:
        parsed = parse_name(unit.name)
        return parsed is not None and parsed[0] == self.dir.table.host

    def catches_up(self, unit: Unit) -> bool:
        return self._same_host(unit)  # another host's writes never bump this host's counter

    def heartbeat(self) -> None:
        """Touch this process's open segments so readers never abandon a live writer's idle segment."""
        now = time.monotonic()
        if self.dir.read_only or now - self._last_beat < HEARTBEAT_S:
            return
        self._last_beat = now
        self.dir.writers.touch()

    def evictable(self, unit: Unit) -> bool:
        if super().evictable(unit):
            return True
        seen = self._seen.get(unit.name)
        return (unit.name in self._abandoned and seen is not None
                and time.monotonic() - seen[1] >= self.evict_abandoned_s)

    def scan(self, unit: Unit, scan: Callable[[Unit], None]) -> None:
        """Another writer's open segment: walked when of this host, else probed (close-to-open)."""
        if self._same_host(unit):
            return scan(unit)  # same host: one page cache, walked as on a local directory
        d = self.dir
        seen = self._seen.get(unit.name)
        if (unit.name in self._abandoned and seen is not None
                and seen[0] == d.scanner.listed_sig(unit.name)):
            return  # abandoned and the listing shows no change: no probe
        # probe with a fresh open (close-to-open revalidation), never a cached fd
        fd = d.scanner.open_for_scan(unit, lambda: open_file(unit.path, os.O_RDONLY))
        if fd is None:
            return
        try:
            st = os.fstat(fd)
            size = st.st_size
            sealed = size >= FOOTER_SIZE and parse_footer(os.pread(fd, FOOTER_SIZE, size - FOOTER_SIZE),
                                                          size) is not None
        except OSError as e:
            log.warning("lifeboat: cannot probe %s: %s", unit.path, e)
            return
        finally:
            os.close(fd)
        unit.size = size
        sig = (size, st.st_mtime_ns)
        if sealed:
            self._seen.pop(unit.name, None)
            self._revive(unit, "was sealed by its writer")
            return scan(unit)
        now = time.monotonic()
        prev = self._seen.get(unit.name)
        if prev is None or prev[0] != sig:  # grew or got a heartbeat: its writer is alive
            self._seen[unit.name] = prev = (sig, now)
            self._revive(unit, "changed again")
        if unit.name in self._abandoned:
            return
        abandoned = now - prev[1] >= self.stale_unsealed_s
        if not (abandoned or d.scanner.writer_dead_here(unit)):
            d.counters.add("foreign_unsealed")
            return
        d.table.close_cached_fd(unit)  # close-to-open: the walk sees the new bytes
        scan(unit)  # CRC-checked walk up to the torn tail
        if abandoned and not unit.sealed:
            self._abandoned.add(unit.name)  # probed again only when the listing shows a change
            d.counters.add("foreign_abandoned")
            log.info("lifeboat: %s: segment %s unchanged for %.0f s, unsealed; serving it up to byte %d",
                     d.path, unit.name, now - prev[1], unit.scanned)

    def _revive(self, unit: Unit, why: str) -> None:
        """An abandoned segment whose writer came back (SIGSTOP, a long pause): index its new pages."""
        if unit.name not in self._abandoned:
            return
        self._abandoned.discard(unit.name)
        self.dir.table.close_cached_fd(unit)
        unit.walked = -1  # what it has now is read afresh (trailer, or a walk once abandoned again)
        self.dir.counters.add("foreign_revived")
        log.info("lifeboat: %s: abandoned segment %s %s; indexing its new pages", self.dir.path, unit.name, why)

    def write_trailer(self, fd: int, at: int, entries: Sequence[Entry]) -> int:
        os.fdatasync(fd)  # the records reach the server before the trailer that publishes them
        return write_trailer(fd, at, entries)

    def stale_read(self, err: OSError) -> bool:
        return err.errno == errno.ESTALE  # evicted by another host while open here: a stale location


class NfsSegmentDir(SegmentDir):
    """A SegmentDir with the NFS policies (NfsSharing) passed in."""

    def __init__(self, path: Path, *, stale_unsealed_s: float | None = None, **kw: Any) -> None:
        self.nfs = NfsSharing(stale_unsealed_s)
        super().__init__(path, eviction=self.nfs, sharing=self.nfs, **kw)
        self.nfs.attach(self)


class NfsTier(LocalTier):
    kind = "nfs"
    shared = True
    fsync = True
    segment_dir_cls = NfsSegmentDir
