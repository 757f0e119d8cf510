"""The policies a directory kind passes in: which units capacity gc may free, and how the directory is shared.

`EvictionPolicy` decides which units capacity gc (capacity.py) may free; `SharingPolicy` holds what differs when
other hosts write into the same directory (which open segments a catch-up rescans, how a foreign
unsealed segment is scanned, how a trailer is committed, what a failed read means). The local
directory uses both as they are; a shared (nfs) directory passes one object implementing both (shared_dir.py) through
SegmentDir's constructor instead of overriding its methods.
"""

from __future__ import annotations

from typing import Callable, Sequence

from ...records import Entry
from .format import write_trailer
from .units import Unit


class EvictionPolicy:
    """Which units capacity gc may unlink."""

    def evictable(self, unit: Unit) -> bool:
        """Sealed segments only: another process's open segment is never unlinked (nfs widens this)."""
        return unit.sealed and not unit.own


class SharingPolicy:
    """Hooks of a directory other processes write into; the defaults are those of a local directory."""

    def attach(self, directory: object) -> None:
        """Called once by the directory (SegmentDir) when its parts are built; nothing to keep here."""

    def catches_up(self, unit: Unit) -> bool:
        """Whether a catch-up rescans this open segment of another process (nfs: same host only)."""
        return True

    def heartbeat(self) -> None:
        """Show other hosts that this process is alive (nfs); nothing to do on a local directory."""

    def scan(self, unit: Unit, scan: Callable[[Unit], None]) -> None:
        """Scan a unit that is not ours and not sealed yet; `scan` is the local scan."""
        scan(unit)

    def write_trailer(self, fd: int, at: int, entries: Sequence[Entry]) -> int:
        """Seal: write the trailer at `at`; returns the sealed size."""
        return write_trailer(fd, at, entries)

    def stale_read(self, err: OSError) -> bool:
        """Whether a read's OSError means the location is stale (a miss), not a tier failure."""
        return False

