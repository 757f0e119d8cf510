"""Inspection of a segment directory: per-segment figures (`lifeboat stats`) and the file -> index
half of `verify`. Reads the files; changes nothing unless `audit(fix=True)`.

Kept apart from SegmentDir so the coordinator holds only what serving needs; it goes through
SegmentDir's small public surface (`units`, `reading`, `is_quarantined`, `index_found`, `quarantine_region`),
typed here as the `Inspected` protocol (SegmentDir calls this module, so it does not import it back).
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ...records import index_key
from . import compaction
from .format import read_table
from .walk import walk


@dataclass
class Records:
    """A segment's intact records (arrays in file order) and the regions a walk skipped."""

    keys: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    raw_lengths: np.ndarray
    damaged: list[tuple[int, int]] = field(default_factory=list)


class Inspected(compaction.Directory, Protocol):
    """The part of SegmentDir that inspection reads (and, for `audit(fix=True)`, changes)."""

    def units(self, *, own: bool = True) -> list[tuple[str, int, bool]]: ...

    def reading(self, name: str) -> AbstractContextManager[int | None]: ...

    def is_quarantined(self, name: str, offset: int) -> bool: ...

    def index_found(self, name: str, keys: np.ndarray, offs: np.ndarray, lens: np.ndarray) -> int: ...

    def quarantine_region(self, name: str, offset: int, length: int, reason: str) -> None: ...


def read_records(fd: int, *, check_payload: bool = True) -> Records:
    """Every record of an open segment file: from its trailer when sealed, else walked record by record
    (skipping damage; `check_payload=False` checks headers only). Raises OSError."""
    size = os.fstat(fd).st_size
    table = read_table(fd, size)
    if table is not None:
        return Records(np.asarray(table["key"], np.int64), np.asarray(table["offset"], np.uint64),
                       np.asarray(table["length"], np.uint32), np.asarray(table["raw_length"], np.uint64))
    w = walk(fd, 0, size, check_payload=check_payload)
    return Records(np.array([index_key(e[0]) for e in w.entries], np.int64),
                   np.array([e[1] for e in w.entries], np.uint64), np.array([e[2] for e in w.entries], np.uint32),
                   np.array([e[3] for e in w.entries], np.uint64), w.damaged)


def describe(d: Inspected) -> list[dict[str, int | str | bool]]:
    """Per segment: records, stored and raw bytes (from trailers, or record headers when unsealed)."""
    out = []
    for name, size, sealed in d.units():
        recs = stored = raw = 0
        with d.reading(name) as fd:
            if fd is None:
                continue
            try:
                r = read_records(fd, check_payload=False)
                recs, stored, raw = len(r.keys), int(r.lengths.sum()), int(r.raw_lengths.sum())
            except OSError as e:
                d.log_once(f"describe:{name}", "lifeboat: cannot describe %s: %s", d.path / name, e)
        out.append({"segment": name, "bytes": size, "sealed": sealed, "records": recs,
                    "stored_bytes": stored, "raw_bytes": raw})
    return out


def audit(d: Inspected, fix: bool = False) -> list[str]:
    """The file -> index half of verify: intact records missing from the index, damaged regions.

    With fix, missing records are indexed again and damaged regions are quarantined (so they
    are reported once).
    """
    problems: list[str] = []
    for name, _, _ in d.units(own=False):
        with d.reading(name) as fd:
            if fd is None:
                continue
            try:
                r = read_records(fd)
                entries = list(zip(r.keys.tolist(), r.offsets.tolist(), r.lengths.tolist()))
                # purged: not missing, only not yet compacted
                entries = compaction.unpurged(d, name, fd, entries)
            except OSError as e:
                problems.append(f"{name}: cannot read ({e})")
                continue
        missing = [(k, o, n) for k, o, n in entries if not d.is_quarantined(name, o) and d.index.get(k) is None]
        for k, o, n in missing:
            problems.append(f"{name}@{o}: intact record missing from the index")
        if fix and missing:
            d.index_found(name, np.array([m[0] for m in missing], np.int64),
                          np.array([m[1] for m in missing], np.uint64),
                          np.array([m[2] for m in missing], np.uint32))
        for off, n in r.damaged:
            if d.is_quarantined(name, off):
                continue
            problems.append(f"{name}@{off}: {n} bytes unreadable (torn or corrupt record) skipped")
            if fix:
                d.quarantine_region(name, off, n, "damaged")
    return problems
