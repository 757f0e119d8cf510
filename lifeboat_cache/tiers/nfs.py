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
from typing import Any, Sequence

from ..index import Loc
from .local import LocalTier
from .segfile import FOOTER_SIZE, Entry, open_file, parse_footer, parse_name, write_trailer
from .segment import SegmentDir, _Unit

log = logging.getLogger(__name__)

# protocol constants, identical on every host (never derived from settings other hosts may not share)
HEARTBEAT_S = 5.0  # a writer touches its open segments this often
ABANDON_AFTER_S = 60.0  # no size/mtime change this long (12 missed heartbeats): walk and serve it
EVICT_ABANDONED_S = 900.0  # no change this long: capacity gc may unlink it


class NfsSegmentDir(SegmentDir):
    """A segment directory that writers on other hosts share (see the module docstring)."""

    def __init__(self, *args: Any, stale_unsealed_s: float | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.stale_unsealed_s = ABANDON_AFTER_S if stale_unsealed_s is None else stale_unsealed_s
        self.evict_abandoned_s = max(EVICT_ABANDONED_S, self.stale_unsealed_s)
        # foreign unsealed: ((size, mtime_ns), monotonic time first seen with it)
        self._seen: dict[str, tuple[tuple[int, int], float]] = {}
        self._abandoned: set[str] = set()
        self._last_beat = 0.0
        self.counters.declare("foreign_unsealed", "foreign_abandoned", "foreign_revived", "stale_handles")

    def _same_host(self, unit: _Unit) -> bool:
        parsed = parse_name(unit.name)
        return parsed is not None and parsed[0] == self._tag.split("-")[0]

    def _catches_up(self, unit: _Unit) -> bool:
        return self._same_host(unit)  # another host's writes never bump this host's counter

    def _heartbeat(self) -> None:
        """Touch this process's open segments so readers never abandon a live writer's idle segment."""
        now = time.monotonic()
        if self.read_only or now - self._last_beat < HEARTBEAT_S:
            return
        self._last_beat = now
        with self._lock:  # a seal closes the fd under the same lock
            for w in self._writers:
                if w is not None and w.fd >= 0 and not w.sealing:
                    try:
                        os.utime(w.fd)
                    except OSError as e:
                        self._log_once(f"beat:{e.errno}", "lifeboat: cannot touch %s: %s", w.unit.path, e)

    def _evictable(self, unit: _Unit) -> bool:
        if super()._evictable(unit):
            return True
        seen = self._seen.get(unit.name)
        return (unit.name in self._abandoned and seen is not None
                and time.monotonic() - seen[1] >= self.evict_abandoned_s)

    def _fresh_fd(self, unit: _Unit) -> None:
        """Close the cached fd so the next read opens afresh (close-to-open: see the new bytes)."""
        with self._lock:
            if unit.fd is not None and unit.readers == 0:
                os.close(unit.fd)
                unit.fd = None

    def _drop_many(self, units: Sequence[_Unit]) -> None:
        for unit in units:
            self._seen.pop(unit.name, None)
            self._abandoned.discard(unit.name)
        super()._drop_many(units)

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
        if unit.own or unit.sealed or self._same_host(unit):
            return super()._scan(unit)  # same host: one page cache, walked as on a local directory
        seen = self._seen.get(unit.name)
        if (unit.name in self._abandoned and seen is not None
                and seen[0] == self._listed_sig.get(unit.name)):
            return  # abandoned and the listing shows no change: no probe
        # probe with a fresh open (close-to-open revalidation), never a cached fd
        fd = self._open_for_scan(unit, lambda: open_file(unit.path, os.O_RDONLY))
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
            return super()._scan(unit)
        now = time.monotonic()
        prev = self._seen.get(unit.name)
        if prev is None or prev[0] != sig:  # grew or got a heartbeat: its writer is alive
            self._seen[unit.name] = prev = (sig, now)
            self._revive(unit, "changed again")
        if unit.name in self._abandoned:
            return
        abandoned = now - prev[1] >= self.stale_unsealed_s
        if not (abandoned or self._writer_dead_here(unit)):
            self.counters.add("foreign_unsealed")
            return
        self._fresh_fd(unit)
        super()._scan(unit)  # CRC-checked walk up to the torn tail
        if abandoned and not unit.sealed:
            self._abandoned.add(unit.name)  # probed again only when the listing shows a change
            self.counters.add("foreign_abandoned")
            log.info("lifeboat: %s: segment %s unchanged for %.0f s, unsealed; serving it up to byte %d",
                     self.path, unit.name, now - prev[1], unit.scanned)

    def _revive(self, unit: _Unit, why: str) -> None:
        """An abandoned segment whose writer came back (SIGSTOP, a long pause): index its new pages."""
        if unit.name not in self._abandoned:
            return
        self._abandoned.discard(unit.name)
        self._fresh_fd(unit)
        unit.walked = -1  # what it has now is read afresh (trailer, or a walk once abandoned again)
        self.counters.add("foreign_revived")
        log.info("lifeboat: %s: abandoned segment %s %s; indexing its new pages", self.path, unit.name, why)

    def _write_trailer(self, fd: int, at: int, entries: Sequence[Entry]) -> int:
        os.fdatasync(fd)  # the records reach the server before the trailer that publishes them
        return write_trailer(fd, at, entries)

    def _read_stretch(self, locs: Sequence[Loc], bufs: Sequence[Sequence[memoryview]], k: int, j: int,
                      out: list[bool]) -> None:
        try:
            return super()._read_stretch(locs, bufs, k, j, out)
        except OSError as e:
            if e.errno != errno.ESTALE:
                raise
        with self._lock:  # evicted by another host while open here: a stale location
            unit = self._units.get(locs[k].unit)
        if unit is not None:
            self._drop(unit)
        self.counters.add("stale_handles")


class NfsTier(LocalTier):
    kind = "nfs"
    shared = True
    fsync = True
    segment_dir_cls = NfsSegmentDir
