"""Purge rules applied to a segment directory, and compaction that removes purged bytes from disk.

Why: KV pages hold users' prompts, so deleting a tenant's data must stop every process serving it
and then remove its bytes. `lifeboat purge` appends rules to `purge.list` (purge.py); every process
reloads the list on its index refresh (`refresh_interval_s`), drops matching records from its index
(`sweep`) and refuses them on the read path (`PurgeFilter.blocks`, purge_filter.py). `compact` (run by `lifeboat gc`)
rewrites the live records of sealed segments that hold purged or mostly dead records into a new
segment, then unlinks the old one.

Record write time: a segment's name starts with its creation time in ms, and every record in it was
written at or after that time, so "segment created before T" covers every record written before T
(and may also cover a few written just after: those are purged too, a cache miss at worst).
A compacted segment keeps its source's time in its name, so ages survive compaction.

Crash safety of `compact`: the new segment is written under a hidden temporary name, sealed, fsynced
and renamed into place before the old one is unlinked; a crash leaves the old copy, or both (the
same records twice: either copy serves them; the next gc removes the duplicate).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Protocol

import numpy as np

from ...fsio import ForeignFile, open_file, pwritev_all
from ...index import Index, Loc
from ...records import HEADER_SIZE, NS_AT, Entry, RecordError, verify_record
from .format import parse_name, process_alive, read_table, unit_ms, write_trailer
from .purge_filter import PurgeFilter
from .units import Unit, UnitTable
from .writers import Writers

log = logging.getLogger(__name__)

TMP_PREFIX, TMP_SUFFIX = ".compact-", ".tmp"
DEFAULT_COMPACT_BELOW = 0.5  # rewrite a sealed segment whose live bytes are under this share


class Directory(Protocol):
    """What purge and compaction use of a segment directory (SegmentDir's public surface; typed here
    so this module, which SegmentDir calls on each refresh, does not import it back)."""

    path: Path
    read_only: bool
    evict: bool
    file_mode: int
    index: Index
    purge: PurgeFilter
    table: UnitTable
    writers: Writers

    def seal(self) -> None: ...

    def log_once(self, key: str, msg: str, *args: object) -> bool: ...


# ---------------------------------------------------------------------- serving processes
def apply(d: Directory) -> None:
    """On each index refresh: reload the rules; drop purged / expired records from the index.

    Whole segments older than the age cutoff are evicted (a process that may evict) or dropped from
    the index; for namespace rules, each record header of the segments a rule covers is read once.
    """
    f = d.purge
    changed = f.reload()
    if not f.active:
        return
    age_cut = f.age_cutoff_ms()
    ns_cut = max(f.rules.namespaces.values(), default=0)
    with d.table.lock:
        units = d.table.live()
        writers = d.writers.open()
    if not d.read_only:  # new writes must not land in a segment a rule already covers
        stale = changed and any(unit_ms(w.unit.name) < max(age_cut, ns_cut) for w in writers)
        if f.max_age_s is not None:
            half = int((time.time() - f.max_age_s / 2) * 1000)
            stale |= any(unit_ms(w.unit.name) < half for w in writers)
        if stale:
            d.seal()
    todo: list[Unit] = []
    for u in units:
        ms = unit_ms(u.name)
        mark = (u.size, u.sealed)
        if ms < age_cut:
            if d.evict and u.sealed and not u.own:
                _unlink_unit(d, u)
                f.evicted_aged += 1
            elif f.swept.get(u.id) != mark:
                f.purged_pages += d.index.drop_unit(u.id)
                f.swept[u.id] = mark
        elif ms < ns_cut and f.swept.get(u.id) != mark:
            todo.append(u)
    if todo:
        _sweep(d, todo)


def _sweep(d: Directory, units: list[Unit]) -> None:
    f = d.purge
    arrays = d.index.export()
    for u in units:
        mark = (u.size, u.sealed)
        sel = np.flatnonzero(arrays["units"] == u.id)
        ms = unit_ms(u.name)
        try:
            fd = d.table.acquire(u)
        except OSError:
            continue  # vanished: its entries go with it
        try:
            for i in sel.tolist():
                off, n = int(arrays["offsets"][i]), int(arrays["lengths"][i])
                try:
                    purged = purged_at(f, fd, ms, off)
                except OSError:
                    continue
                if purged:
                    if d.index.remove_if_match(int(arrays["keys"][i]), Loc(u.id, off, n)):
                        f.purged_pages += 1
        finally:
            d.table.release(u)
        f.swept[u.id] = mark


def purged_at(f: PurgeFilter, fd: int, ms: int, offset: int) -> bool:
    """Whether the record at offset, in a segment created at ms, is purged (reads its header's namespace)."""
    ns = os.pread(fd, HEADER_SIZE, offset)[NS_AT:NS_AT + 16]
    return len(ns) == 16 and f.blocks(ms, ns)


def unpurged(d: Directory, name: str, fd: int, entries: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """The (key, offset, length) rows of a segment that no purge rule covers (for `verify`)."""
    f = d.purge
    if not f.active or not entries:
        return entries
    ms = unit_ms(name)
    return [(k, o, n) for k, o, n in entries if not purged_at(f, fd, ms, o)]


def _unlink_unit(d: Directory, u: Unit) -> int:
    try:
        os.unlink(u.path)
    except FileNotFoundError:
        pass
    except OSError as e:
        d.log_once(f"purge-unlink:{e.errno}", "lifeboat: cannot remove %s: %s", u.path, e)
        return 0
    d.table.drop(u)
    return u.size


# ---------------------------------------------------------------------- compaction (lifeboat gc)
def _fsync_dir(path: os.PathLike[str] | str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_stale_temps(d: Directory) -> int:
    """Unlink temporary files of compactions whose process died (a crash mid-write)."""
    n = 0
    try:
        names = [e.name for e in os.scandir(d.path) if e.name.startswith(TMP_PREFIX) and e.name.endswith(TMP_SUFFIX)]
    except OSError:
        return 0
    for name in names:
        parsed = parse_name(name[len(TMP_PREFIX):-len(TMP_SUFFIX)])
        if parsed is None or parsed[0] != d.table.host:
            continue
        if parsed[1] != os.getpid() and process_alive(parsed[1]):
            continue  # its writer is alive
        try:
            os.unlink(d.path / name)
            n += 1
        except OSError:
            pass
    return n


def compact(d: Directory, below: float = DEFAULT_COMPACT_BELOW) -> dict[str, int]:
    """Rewrite sealed segments holding purged records, or whose live share is under `below`.

    Live = indexed at that place and not purged. Returns counts (segments rewritten / removed,
    bytes freed, records kept, unsealed segments skipped). A read-only directory does nothing.
    """
    out = {"rewritten": 0, "removed": 0, "freed_bytes": 0, "kept_records": 0, "skipped_unsealed": 0,
           "dropped_bad": 0}
    if d.read_only:
        return out
    apply(d)
    remove_stale_temps(d)
    units = sorted(d.table.live(), key=lambda u: u.name)
    for u in units:
        if u.own or not u.sealed:
            out["skipped_unsealed"] += 1
            continue
        try:
            _compact_one(d, u, below, out)
        except OSError as e:
            d.log_once(f"compact:{e.errno}", "lifeboat: compaction of %s failed (%s); it is kept", u.path, e)
    return out


def _compact_one(d: Directory, u: Unit, below: float, out: dict[str, int]) -> None:
    f = d.purge
    try:
        fd = d.table.acquire(u)
    except (FileNotFoundError, ForeignFile):
        return
    try:
        size = os.fstat(fd).st_size
        table = read_table(fd, size)
        if table is None:
            out["skipped_unsealed"] += 1
            return
        ms = unit_ms(u.name)
        locs = d.index.get_many(np.asarray(table["key"], np.int64)) if len(table) else []
        live = np.array([loc is not None and loc.unit == u.id and loc.offset == int(o) and loc.length == int(n)
                         for loc, o, n in zip(locs, table["offset"], table["length"])], dtype=bool)
        purged = np.zeros(len(table), dtype=bool)
        if f.active:
            for i in range(len(table)):
                purged[i] = purged_at(f, fd, ms, int(table["offset"][i]))
        live &= ~purged
        live_bytes = int(table["length"][live].sum())
        if not purged.any() and live_bytes >= below * max(size, 1):
            return
        if not live.any():
            out["freed_bytes"] += _unlink_unit(d, u)
            out["removed"] += 1
            return
        _rewrite(d, u, fd, table, live, ms, size, out)
    finally:
        d.table.release(u)


def _rewrite(d: Directory, u: Unit, fd: int, table: np.ndarray, live: np.ndarray, ms: int, size: int,
             out: dict[str, int]) -> None:
    name = d.table.new_name(ms, mark="c", width=5)
    tmp = d.path / f"{TMP_PREFIX}{name}{TMP_SUFFIX}"
    wfd = open_file(tmp, os.O_RDWR | os.O_CREAT, d.file_mode)
    moved: list[tuple[int, Loc, Loc]] = []
    try:
        entries: list[Entry] = []
        at = 0
        for i in np.flatnonzero(live).tolist():
            off, n = int(table["offset"][i]), int(table["length"][i])
            rec = os.pread(fd, n, off)
            try:  # never carry a damaged record into the new segment
                h = verify_record(memoryview(rec)[:HEADER_SIZE], memoryview(rec)[HEADER_SIZE:])
            except RecordError:
                out["dropped_bad"] += 1
                continue
            pwritev_all(wfd, [rec], at)
            entries.append((h.digest, at, n, h.raw_len))
            moved.append((int(table["key"][i]), Loc(u.id, off, n), Loc(0, at, n)))
            at += n
        new_size = write_trailer(wfd, at, entries)
        os.fsync(wfd)
    except BaseException:
        os.close(wfd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    os.close(wfd)
    os.rename(tmp, d.path / name)
    _fsync_dir(d.path)
    with d.table.lock:  # index the copy, then remove the original (write, then index)
        nu = d.table.add(name)
        nu.sealed_at(new_size, len(entries))
    now = d.index.get_many(np.array([m[0] for m in moved], np.int64)) if moved else []
    for (key, old, new), cur in zip(moved, now):
        if cur == old:  # not overwritten or dropped meanwhile
            d.index.insert(key, Loc(nu.id, new.offset, new.length))
    out["freed_bytes"] += _unlink_unit(d, u) - new_size
    _fsync_dir(d.path)
    out["rewritten"] += 1
    out["kept_records"] += len(moved)


