"""NfsSharing: the policies of a segment directory that writers on other hosts share (`type: nfs`).

Close-to-open: another host's segment is indexed once sealed and opened afresh; an unsealed one is
probed, and walked only when abandoned (unchanged for ABANDON_AFTER_S on this host's clock) or when
its writer is this host's and dead. Heartbeats keep a live writer's idle segment from being
abandoned; eviction leaves another host's open segment alone until EVICT_ABANDONED_S. The tier's
module (tiers/nfs.py) says why each rule exists.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from ...fsio import open_file
from ...records import FOOTER_SIZE, Entry, parse_footer
from .directory import SegmentDir
from .eviction import EvictionPolicy, SharingPolicy
from .format import parse_name, write_trailer
from .settings import DirSettings
from .units import Unit

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
        """Keep the directory's parts this policy works with (the unit table, the scanner, this
        process's writers, the counters); they are used once the directory is open."""
        self.path, self.read_only = d.path, d.read_only
        self.table, self.scanner, self.writers, self.counters = d.table, d.scanner, d.writers, d.counters
        self.counters.declare("foreign_unsealed", "foreign_abandoned", "foreign_revived", "stale_handles")
        self.table.on_drop(self._forget)

    def _forget(self, unit: Unit) -> None:
        self._seen.pop(unit.name, None)
        self._abandoned.discard(unit.name)

    def _same_host(self, unit: Unit) -> bool:
        parsed = parse_name(unit.name)
        return parsed is not None and parsed[0] == self.table.host

    def catches_up(self, unit: Unit) -> bool:
        return self._same_host(unit)  # another host's writes never bump this host's counter

    def heartbeat(self) -> None:
        """Touch this process's open segments so readers never abandon a live writer's idle segment."""
        now = time.monotonic()
        if self.read_only or now - self._last_beat < HEARTBEAT_S:
            return
        self._last_beat = now
        self.writers.touch()

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
        seen = self._seen.get(unit.name)
        if (unit.name in self._abandoned and seen is not None
                and seen[0] == self.scanner.listed_sig(unit.name)):
            return  # abandoned and the listing shows no change: no probe
        # probe with a fresh open (close-to-open revalidation), never a cached fd
        fd = self.scanner.open_for_scan(unit, lambda: open_file(unit.path, os.O_RDONLY))
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
        if not (abandoned or self.scanner.writer_dead_here(unit)):
            self.counters.add("foreign_unsealed")
            return
        self.table.close_cached_fd(unit)  # close-to-open: the walk sees the new bytes
        scan(unit)  # CRC-checked walk up to the torn tail
        if abandoned and not unit.sealed:
            self._abandoned.add(unit.name)  # probed again only when the listing shows a change
            self.counters.add("foreign_abandoned")
            log.info("lifeboat: %s: segment %s unchanged for %.0f s, unsealed; serving it up to byte %d",
                     self.path, unit.name, now - prev[1], unit.scanned)

    def _revive(self, unit: Unit, why: str) -> None:
        """An abandoned segment whose writer came back (SIGSTOP, a long pause): index its new pages."""
        if unit.name not in self._abandoned:
            return
        self._abandoned.discard(unit.name)
        self.table.close_cached_fd(unit)
        unit.walked = -1  # what it has now is read afresh (trailer, or a walk once abandoned again)
        self.counters.add("foreign_revived")
        log.info("lifeboat: %s: abandoned segment %s %s; indexing its new pages", self.path, unit.name, why)

    def write_trailer(self, fd: int, at: int, entries: Sequence[Entry]) -> int:
        os.fdatasync(fd)  # the records reach the server before the trailer that publishes them
        return write_trailer(fd, at, entries)

    def stale_read(self, err: OSError) -> bool:
        return err.errno == errno.ESTALE  # evicted by another host while open here: a stale location


class NfsSegmentDir(SegmentDir):
    """A SegmentDir with the NFS policies (NfsSharing) passed in as both `eviction` and `sharing`."""

    def __init__(self, path: Path, settings: DirSettings, *, stale_unsealed_s: float | None = None,
                 **kw: Any) -> None:
        self.nfs = NfsSharing(stale_unsealed_s)
        super().__init__(path, settings, eviction=self.nfs, sharing=self.nfs, **kw)
