"""A directory of log-structured segment files, shared by any number of writer processes (local, nfs).

Each process appends records to its own segment files (`<ms>-<host>-<pid>-<token><n>.seg`: one
writer per file, names sort by age), so nothing needs a cross-process or cross-host lock. A full
segment is sealed with the unit trailer (records/trailer.py), so a later scan reads one table.
Readers discover other writers' segments by listing the directory; an unsealed one is walked record
by record, skipping holes and bad records.

`SegmentDir` is the coordinator (CacheLib Navy's cut): it wires one directory's parts and runs its
index thread, and never parses a record or touches a unit's fields itself.

    directory.py      SegmentDir: the directory's public API (what tiers, purge and the CLI use)
    settings.py       DirSettings: capacity, segment size, refresh, sealing, modes, max age
    units.py          UnitTable: units, fds, add / drop, the lock (its only owner)
    writers.py        this process's open segments: stripes, reservation, appends
    seals.py          sealing them: trailers outside the lock (nfs: on a sealing thread), retries
    rebuild.py        Scanner: listing, scans, catch-up, batched inserts, orphan sealing
    walk.py           the walk of an unsealed segment, resynchronising past damage
    reads.py          the read path: adjacent records in one preadv, stale locations
    purge_filter.py   purge.list rules plus max_age, used by the read path, the index sweep and gc
    indexer.py        the index thread: initial rebuild, periodic refresh, change-counter catch-up
    snapshot_policy.py  when the index snapshot is loaded, checked and saved
    snapshot_file.py  the `index.snapshot` file: per-shard checksummed columns (format)
    capacity.py       capacity gc with retention: evict, keep whole or reinsert the unit at the queue's head
    access_files.py   each process's retention state file: publish, absorb the others', remove the dead's
    eviction.py       the EvictionPolicy / SharingPolicy a directory kind passes in
    shared_dir.py     NfsSharing: the policies of a directory other hosts write into (nfs)
    compaction.py     purge rules on the index, and `lifeboat gc`'s rewrite of purged segments
    inspection.py     per-segment figures (`lifeboat stats`) and the file -> index half of verify
    quarantine.py     records that failed verification (validated lines, O_APPEND, never via a link)
    changes.py        the change counter: other processes of the host see a write in ms
    format.py         segment names and ages, the trailer read and written through an fd

Invariants: write, then index; unit ids only grow; a scan never overwrites a newer index entry;
eviction unlinks whole sealed segments, a reinserted record written and indexed first; no file with
intact records after a damaged one is ever truncated; the pages' bytes on disk (open segments included;
their headers and trailers, records.framing, on top) stay within the capacity plus a small slack.
"""

from __future__ import annotations

from .compaction import DEFAULT_COMPACT_BELOW, compact
from .directory import SegmentDir
from .format import SEGMENT_SUFFIX, parse_name, unit_ms
from .settings import ORPHAN_IDLE_S, DirSettings
from .shared_dir import NfsSegmentDir
from .snapshot_file import SNAPSHOT_NAME

__all__ = [
    "DEFAULT_COMPACT_BELOW", "ORPHAN_IDLE_S", "SEGMENT_SUFFIX", "SNAPSHOT_NAME", "DirSettings", "NfsSegmentDir",
    "SegmentDir", "compact", "parse_name", "unit_ms",
]
