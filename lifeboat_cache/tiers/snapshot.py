"""Index snapshot of a segment directory: a hint that makes the first hits fast, never trusted.

Written by temp file and rename at close. On open it is parsed strictly (member names, dtypes,
shapes, sizes checked before any allocation, every unit named like a segment, ids mapped through
a dict so a huge id costs nothing), and anything that fails makes the whole snapshot unusable
(the directory is rescanned). Entries that pass are later checked against each segment's trailer
by the directory (see SegmentDir), so a structurally valid but wrong snapshot only costs a rescan.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..codec import HEADER_SIZE
from .segfile import DEFAULT_FILE_MODE, parse_name, read_small_file, write_new_file

SNAPSHOT_NAME = "index.snapshot.npz"
SNAPSHOT_VERSION = 1
MAX_SNAPSHOT_BYTES = 1 << 30  # ~24 B per page: room for tens of millions of pages
MAX_UNIT_ID = (1 << 32) - 2  # 2^32-1 is the index's dead-entry sentinel
_ARRAYS = {"keys": np.dtype("<i8"), "units": np.dtype("<u4"), "offsets": np.dtype("<u8"),
           "lengths": np.dtype("<u4"), "meta": np.dtype("u1")}


class SnapshotError(ValueError):
    """The snapshot is unusable; the directory is rebuilt from its segments."""


@dataclass(frozen=True)
class SnapshotUnit:
    name: str
    id: int
    scanned: int
    sealed: bool


@dataclass
class Snapshot:
    units: list[SnapshotUnit]
    keys: np.ndarray
    unit_ids: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    dropped: int = 0  # entries that failed validation


def _array(zf: zipfile.ZipFile, name: str, limit: int) -> np.ndarray:
    try:
        info = zf.getinfo(name + ".npy")
    except KeyError:
        raise SnapshotError(f"no {name} array") from None
    if info.compress_type != zipfile.ZIP_STORED or info.file_size > limit:
        raise SnapshotError(f"{name}: compressed or larger than the file")
    data = zf.read(info)
    buf = io.BytesIO(data)  # shares the bytes, no copy
    try:
        version = np.lib.format.read_magic(buf)
        reader = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
        if version not in reader:
            raise ValueError(f"npy version {version}")
        shape, fortran, dtype = reader[version](buf)
    except (ValueError, SyntaxError, TypeError, OverflowError, MemoryError) as e:
        raise SnapshotError(f"{name}: bad array header ({e})") from None
    if dtype != _ARRAYS[name] or fortran or len(shape) != 1 or not isinstance(shape[0], int):
        raise SnapshotError(f"{name}: expected a 1-D {_ARRAYS[name]} array, got {dtype} {shape}")
    start = buf.tell()
    if shape[0] < 0 or shape[0] * dtype.itemsize != len(data) - start:
        raise SnapshotError(f"{name}: length does not match its header")
    # a read-only view of the member's bytes (no copy): every consumer copies what it keeps
    return np.frombuffer(data, dtype=dtype, count=shape[0], offset=start)


def _units(meta: object) -> list[SnapshotUnit]:
    if not isinstance(meta, dict) or meta.get("version") != SNAPSHOT_VERSION:
        found = meta.get("version") if isinstance(meta, dict) else None
        raise SnapshotError(f"snapshot version {str(found)[:20]}, this build reads version {SNAPSHOT_VERSION}")
    raw = meta.get("units")
    if not isinstance(raw, list):
        raise SnapshotError("no unit list")
    out, names, ids = [], set(), set()
    for u in raw:
        if not isinstance(u, dict):
            raise SnapshotError("a unit is not a mapping")
        name, uid, scanned, sealed = u.get("name"), u.get("id"), u.get("scanned"), u.get("sealed")
        if not isinstance(name, str) or parse_name(name) is None:
            raise SnapshotError(f"unit name {name!r} is not a segment name")
        for v in (uid, scanned):
            if isinstance(v, bool) or not isinstance(v, int):
                raise SnapshotError(f"unit {name}: id and scanned must be integers")
        if not 1 <= uid <= MAX_UNIT_ID or not 0 <= scanned < (1 << 63) or not isinstance(sealed, bool):
            raise SnapshotError(f"unit {name}: id {uid} or size {scanned} out of range")
        if name in names or uid in ids:
            raise SnapshotError(f"unit {name} (id {uid}) listed twice")
        names.add(name)
        ids.add(uid)
        out.append(SnapshotUnit(name, uid, scanned, sealed))
    return out


def parse(data: bytes) -> Snapshot:
    """A validated snapshot from the file's bytes; raises SnapshotError only."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except Exception as e:  # BadZipFile, NotImplementedError (an unknown zip version), ValueError, ...
        raise SnapshotError(f"not a snapshot archive ({e})") from None
    try:
        with zf:
            if sorted(zf.namelist()) != sorted(n + ".npy" for n in _ARRAYS):
                raise SnapshotError(f"unexpected members {zf.namelist()[:8]}")
            arrays = {n: _array(zf, n, len(data)) for n in _ARRAYS}
    except SnapshotError:
        raise
    except Exception as e:  # zipfile raises many types on crafted archives
        raise SnapshotError(f"unreadable archive ({type(e).__name__}: {e})") from None
    try:
        meta = json.loads(arrays["meta"].tobytes().decode("utf-8"))
    except (ValueError, RecursionError) as e:
        raise SnapshotError(f"bad metadata ({e})") from None
    units = _units(meta)
    keys, uids, offs, lens = (arrays[n] for n in ("keys", "units", "offsets", "lengths"))
    if not len(keys) == len(uids) == len(offs) == len(lens):
        raise SnapshotError("arrays of different lengths")
    # an entry must name a listed unit and lie inside what that unit had when saved
    ids = np.array(sorted(u.id for u in units), dtype=np.int64)
    scanned = np.array([u.scanned for u in sorted(units, key=lambda u: u.id)], dtype=np.uint64)
    ok = np.zeros(len(uids), bool)
    if len(ids):
        runs = unit_runs(uids)
        if runs is not None:  # saved grouped by unit: look up each run's unit once, not each entry's
            starts, ends, vals = runs
            posc = np.minimum(np.searchsorted(ids, vals.astype(np.int64)), len(ids) - 1)
            ok = np.repeat(ids[posc] == vals.astype(np.int64), ends - starts)
            limit = np.repeat(scanned[posc], ends - starts)
        else:
            posc = np.minimum(np.searchsorted(ids, uids.astype(np.int64)), len(ids) - 1)
            ok = ids[posc] == uids.astype(np.int64)
            limit = scanned[posc]
        ok &= lens >= HEADER_SIZE
        ok &= (offs <= limit) & (lens.astype(np.uint64) <= limit - np.minimum(offs, limit))
    n_bad = int((~ok).sum())
    if not n_bad:  # the usual case: no copies
        return Snapshot(units, keys, uids, offs, lens)
    return Snapshot(units, keys[ok], uids[ok], offs[ok], lens[ok], dropped=n_bad)


def unit_runs(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(starts, ends, values) of the runs of equal ids when ids are sorted (as saved), else None."""
    if len(ids) and not bool((ids[1:] >= ids[:-1]).all()):
        return None
    cuts = np.flatnonzero(ids[1:] != ids[:-1]) + 1
    starts = np.concatenate(([0], cuts)).astype(np.int64)
    ends = np.concatenate((cuts, [len(ids)])).astype(np.int64)
    if not len(ids):
        starts = ends = np.empty(0, np.int64)
    return starts, ends, ids[starts]


def load(directory: Path) -> Snapshot | None:
    """The directory's snapshot, None when there is none; raises SnapshotError or OSError."""
    data = read_small_file(directory / SNAPSHOT_NAME, MAX_SNAPSHOT_BYTES)
    return None if data is None else parse(data)


def save(directory: Path, units: list[SnapshotUnit], arrays: dict[str, np.ndarray],
         mode: int = DEFAULT_FILE_MODE) -> None:
    """Persist units and index arrays (safe temp file, then rename); raises OSError."""
    meta = json.dumps({"version": SNAPSHOT_VERSION, "units": [u.__dict__ for u in units]}).encode()
    buf = io.BytesIO()
    np.savez(buf, meta=np.frombuffer(meta, dtype=np.uint8), keys=arrays["keys"].astype("<i8"),
             units=arrays["units"].astype("<u4"), offsets=arrays["offsets"].astype("<u8"),
             lengths=arrays["lengths"].astype("<u4"))
    write_new_file(directory / SNAPSHOT_NAME, buf.getvalue(), mode)
