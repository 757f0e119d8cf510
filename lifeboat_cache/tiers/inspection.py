"""Inspection of a segment directory: per-segment figures (`lifeboat stats`) and the file -> index
half of `verify`. Reads the files; changes nothing unless `audit(fix=True)`.

A friend of SegmentDir (uses its unit table and fd bookkeeping), kept apart so the directory module
holds only what serving needs.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from . import compaction, recovery
from .segfile import read_table

if TYPE_CHECKING:
    from .segment import SegmentDir


def _ikey(digest: bytes) -> int:
    return int.from_bytes(digest[:8], "little", signed=True)


def describe(d: "SegmentDir") -> list[dict[str, int | str | bool]]:
    """Per segment: records, stored and raw bytes (from trailers, or record headers when unsealed)."""
    out = []
    for name, size, sealed in d.units():
        with d._lock:
            unit = d._units.get(d._by_name.get(name, -1))
        if unit is None:
            continue
        recs = stored = raw = 0
        try:
            fd = d._acquire(unit)
        except OSError:
            continue
        try:
            fsize = os.fstat(fd).st_size
            table = read_table(fd, fsize)
            if table is not None:
                recs, stored, raw = len(table), int(table["length"].sum()), int(table["raw_length"].sum())
            else:
                w = recovery.walk(fd, 0, fsize, check_payload=False)
                recs = len(w.entries)
                stored, raw = sum(e[2] for e in w.entries), sum(e[3] for e in w.entries)
        except OSError as e:
            d._log_once(f"describe:{name}", "lifeboat: cannot describe %s: %s", unit.path, e)
        finally:
            d._release(unit)
        out.append({"segment": name, "bytes": size, "sealed": sealed, "records": recs,
                    "stored_bytes": stored, "raw_bytes": raw})
    return out

def audit(d: "SegmentDir", fix: bool = False) -> list[str]:
    """The file -> index half of verify: intact records missing from the index, damaged regions.

    With fix, missing records are indexed again and damaged regions are quarantined (so they
    are reported once).
    """
    problems: list[str] = []
    with d._lock:
        units = [u for u in d._units.values() if not u.own]
    for unit in sorted(units, key=lambda u: u.name):
        try:
            fd = d._acquire(unit)
        except OSError:
            continue
        try:
            size = os.fstat(fd).st_size
            table = read_table(fd, size)
            if table is not None:
                entries = [(int(k), int(o), int(n)) for k, o, n in
                           zip(table["key"].tolist(), table["offset"].tolist(), table["length"].tolist())]
                damaged: list[tuple[int, int]] = []
            else:
                w = recovery.walk(fd, 0, size)
                entries = [(_ikey(e[0]), e[1], e[2]) for e in w.entries]
                damaged = w.damaged
            entries = compaction.unpurged(d, unit.name, fd, entries)  # purged: not missing, only not yet compacted
        except OSError as e:
            problems.append(f"{unit.name}: cannot read ({e})")
            continue
        finally:
            d._release(unit)
        missing = [(k, o, n) for k, o, n in entries
                   if (unit.name, o) not in d._quarantine and d.index.get(k) is None]
        for k, o, n in missing:
            problems.append(f"{unit.name}@{o}: intact record missing from the index")
        if fix and missing:
            d._index_entries(unit, np.array([m[0] for m in missing], np.int64),
                                np.array([m[1] for m in missing], np.uint64),
                                np.array([m[2] for m in missing], np.uint32))
        for off, n in damaged:
            if (unit.name, off) in d._quarantine:
                continue
            problems.append(f"{unit.name}@{off}: {n} bytes unreadable (torn or corrupt record) skipped")
            if fix:
                d._record_quarantine(unit.name, off, n, "damaged")
    return problems
