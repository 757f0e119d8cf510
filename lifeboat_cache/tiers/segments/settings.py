"""DirSettings: how one segment directory is run, decided by its tier (local.py) from `storage[]`."""

from __future__ import annotations

from dataclasses import dataclass

from ...fsio import DEFAULT_DIR_MODE, DEFAULT_FILE_MODE

ORPHAN_IDLE_S = 60.0  # an unsealed segment of a dead local pid, idle this long, is sealed by the next open


@dataclass(frozen=True)
class DirSettings:
    """`capacity_bytes` None: half of what the disk holds (at most AUTO_CAPACITY_MAX_BYTES).
    `seal_after_s`: seal an open segment this old (nfs: so other hosts see its pages). `fsync`: records
    reach the disk before the trailer that lists them (nfs). `stripes`: open segments written in
    parallel. `max_age_s`: records older than this are never served and gc removes them.
    `write_call_bytes`: the largest single write call; 0: chosen by free memory (fsio.WriteCallBound says why)."""

    capacity_bytes: int | None
    segment_bytes: int
    refresh_interval_s: float = 1.0
    seal_after_s: float | None = None
    fsync: bool = False
    stripes: int = 1
    file_mode: int = DEFAULT_FILE_MODE
    dir_mode: int = DEFAULT_DIR_MODE
    orphan_idle_s: float = ORPHAN_IDLE_S
    max_age_s: float | None = None
    write_call_bytes: int = 0
