"""Index snapshot of a segment directory (format 2): a hint that makes the first hits fast, never trusted.

File `index.snapshot`, written at close and periodically (temp file, rename: segments.format.replacing_file;
fsync'd first where the tier fsyncs its segments, i.e. NFS; on a local drive a power cut may leave a
torn or stale snapshot, which the checks below refuse or the trailer check corrects):

    header  magic "LBIXSNAP", version, shard count, the index's mix constant, metadata length, entries;
            per shard: entry count and xxh3-64 of its block; metadata (JSON: the units, i.e. segment
            name, id, bytes scanned, sealed); padding to 8 bytes; xxh3-64 of all of the header before it
    blocks  one per index shard, in shard order: mixed keys u64[n], offsets u64[n], units u32[n],
            lengths u32[n], in index order (sorted by mixed key), so a load needs no sort

A load (`Reader`) checks the header (magic, version, shard count, mix constant, checksum, the unit list
parsed strictly, the file size against the counts: a truncated file is refused before any block is
read), then each block as it is read (checksum, order, shard): one shard at a time, so the index can
publish each as soon as it is checked and memory holds one block, never a second copy. Entries that
name no listed unit or lie outside what their unit held when saved are left out (`entries_ok`); the
directory then checks every unit's entries against its trailer (`entry_hash`, see SegmentDir), so a
structurally valid but wrong snapshot only costs a rescan. Format 1 (`index.snapshot.npz`) is never
read: the directory removes it and scans.
"""

from __future__ import annotations

import json
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import xxhash

from ...fsio import DEFAULT_FILE_MODE, open_file, pwritev_all, replacing_file
from ...index import MIX_CONSTANT, SHARDS, SHARD_BITS, mix_keys, unmix_keys
from ...records import HEADER_SIZE
from .format import parse_name

SNAPSHOT_NAME = "index.snapshot"
OLD_SNAPSHOT_NAMES = ("index.snapshot.npz",)  # format 1: removed on open, never read
SNAPSHOT_VERSION = 2
MAGIC = b"LBIXSNAP"
MAX_UNIT_ID = (1 << 32) - 2  # 2^32-1 is the index's dead-entry sentinel
MAX_META_BYTES = 64 << 20     # the unit list: ~100 B per segment
MAX_ENTRIES = 1 << 36
ENTRY_BYTES = 24              # 8 key + 8 offset + 4 unit + 4 length
STALE_TEMP_S = 600.0          # a temp file this old is a crashed save: removed on open
_PRE = struct.Struct("<8sIIQQQ")  # magic, version, shards, mix constant, metadata bytes, entries in all
_SHARD = np.dtype([("count", "<u8"), ("xxh3", "<u8")])
_H1, _H2, _H3 = np.uint64(0xC2B2AE3D27D4EB4F), np.uint64(0x165667B19E3779F9), np.uint64(0xD6E8FEB86659FD93)


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
    """A whole snapshot in memory (`parse`: tools and tests; the directory reads shard by shard)."""

    units: list[SnapshotUnit]
    keys: np.ndarray
    unit_ids: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    dropped: int = 0  # entries that failed validation


def entry_hash(x: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each (mixed key, offset, length): per unit, the wrapping sum over its snapshot
    entries equals the sum over its trailer's rows when both hold the same entries."""
    h = x ^ (np.asarray(offsets, np.uint64) * _H1) ^ (np.asarray(lengths, np.uint64) * _H2)
    h ^= h >> np.uint64(31)
    h *= _H3
    h ^= h >> np.uint64(29)
    return h


def table_hash_sum(table: np.ndarray) -> int:
    """The wrapping sum of entry_hash over a trailer table's rows."""
    h = entry_hash(mix_keys(table["key"]), table["offset"], table["length"])
    return int(np.add.reduce(h, dtype=np.uint64)) if len(h) else 0


def table_hash_sums(tables: list[np.ndarray], want: np.ndarray) -> list[bool]:
    """Per non-empty trailer table, whether its rows' hash sum equals want[i] (one pass for all)."""
    if not tables:
        return []
    t = np.concatenate([x.view(np.uint8) for x in tables]).view(tables[0].dtype)  # bytes: ~30x a struct concat
    h = entry_hash(mix_keys(t["key"]), t["offset"], t["length"])
    starts = np.cumsum([0] + [len(x) for x in tables[:-1]])
    return (np.add.reduceat(h, starts, dtype=np.uint64) == want.astype(np.uint64)).tolist()


def _units(meta: object) -> list[SnapshotUnit]:
    if not isinstance(meta, dict):
        raise SnapshotError("metadata is not a mapping")
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


def _pad8(n: int) -> int:
    return (n + 7) & ~7


class Reader:
    """A snapshot read shard by shard, checked as it goes (raises SnapshotError or OSError only).

    `read(offset, n)` returns up to n bytes at offset; `size` is the file's. Use `open_reader` for a file.
    """

    def __init__(self, read: Callable[[int, int], bytes], size: int) -> None:
        self._read = read
        self.size = size
        pre = self._exact(0, _PRE.size, "header")
        magic, version, shards, mix, meta_len, total = _PRE.unpack(pre)
        if magic != MAGIC:
            raise SnapshotError("not a snapshot file (bad magic)")
        if version != SNAPSHOT_VERSION:
            raise SnapshotError(f"snapshot version {version}, this build reads version {SNAPSHOT_VERSION}")
        if shards != SHARDS or mix != MIX_CONSTANT:
            raise SnapshotError(f"snapshot of an index with {shards} shards / another key mix; this build "
                                f"has {SHARDS}")
        if meta_len > MAX_META_BYTES or total > MAX_ENTRIES:
            raise SnapshotError(f"header claims {meta_len} metadata bytes and {total} entries")
        body = _pad8(_PRE.size + SHARDS * _SHARD.itemsize + meta_len)
        self.data_at = body + 8
        head = self._exact(0, self.data_at, "header")
        (want,) = struct.unpack_from("<Q", head, body)
        if xxhash.xxh3_64_intdigest(head[:body]) != want:
            raise SnapshotError("header checksum mismatch")
        table = np.frombuffer(head, dtype=_SHARD, count=SHARDS, offset=_PRE.size)
        self.counts = [int(c) for c in table["count"]]
        self.checksums = [int(c) for c in table["xxh3"]]
        if sum(self.counts) != total:
            raise SnapshotError("shard counts do not add up to the total")
        self.total = total
        expect = self.data_at + ENTRY_BYTES * total
        if size != expect:
            raise SnapshotError(f"file is {size} bytes, its header says {expect} (truncated or extended)")
        meta_at = _PRE.size + SHARDS * _SHARD.itemsize
        try:
            meta = json.loads(head[meta_at:meta_at + meta_len].decode("utf-8"))
        except (ValueError, RecursionError) as e:
            raise SnapshotError(f"bad metadata ({e})") from None
        self.units = sorted(_units(meta), key=lambda u: u.id)
        self._ids = np.array([u.id for u in self.units], dtype=np.int64)
        self._scanned = np.array([u.scanned for u in self.units] + [0], dtype=np.uint64)
        top = int(self._ids[-1]) if len(self._ids) else 0
        self._lut = None  # unit id -> position, when ids are small enough for a table
        if top < max(1 << 16, 8 * len(self._ids)):
            self._lut = np.full(top + 2, -1, dtype=np.int64)
            self._lut[self._ids] = np.arange(len(self._ids))
        self._starts = np.concatenate(([0], np.cumsum(self.counts))).tolist()

    def _exact(self, at: int, n: int, what: str) -> bytes:
        if at + n > self.size:
            raise SnapshotError(f"{what}: file too short (truncated)")
        data = self._read(at, n)
        if len(data) != n:
            raise SnapshotError(f"{what}: file too short (truncated)")
        return data

    def shard(self, s: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Shard s as (mixed keys, unit ids, offsets, lengths), checked: checksum, order, shard."""
        n = self.counts[s]
        if not n:
            return (np.empty(0, np.uint64), np.empty(0, np.uint32), np.empty(0, np.uint64), np.empty(0, np.uint32))
        data = self._exact(self.data_at + ENTRY_BYTES * self._starts[s], ENTRY_BYTES * n, f"shard {s}")
        if xxhash.xxh3_64_intdigest(data) != self.checksums[s]:
            raise SnapshotError(f"shard {s}: checksum mismatch")
        x = np.frombuffer(data, dtype="<u8", count=n)
        offs = np.frombuffer(data, dtype="<u8", count=n, offset=8 * n)
        units = np.frombuffer(data, dtype="<u4", count=n, offset=16 * n)
        lens = np.frombuffer(data, dtype="<u4", count=n, offset=20 * n)
        top = x >> np.uint64(64 - SHARD_BITS)
        if int(top[0]) != s or int(top[-1]) != s or (n > 1 and not bool((x[1:] > x[:-1]).all())):
            raise SnapshotError(f"shard {s}: entries out of order or of another shard")
        return x, units, offs, lens

    def unit_pos(self, unit_ids: np.ndarray) -> np.ndarray:
        """Position in `units` of each entry's unit id; -1 for an id the snapshot does not list."""
        if self._lut is not None:
            return self._lut[np.minimum(unit_ids, len(self._lut) - 1)]
        if not len(self._ids):
            return np.full(len(unit_ids), -1, dtype=np.int64)
        ids = unit_ids.astype(np.int64)
        pos = np.minimum(np.searchsorted(self._ids, ids), len(self._ids) - 1)
        return np.where(self._ids[pos] == ids, pos, -1)

    def entries_ok(self, pos: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Entries that name a listed unit and lie inside what that unit held when saved."""
        limit = self._scanned[pos]  # pos -1: the 0 appended last
        ok = (pos >= 0) & (lengths >= HEADER_SIZE)
        ok &= (offsets <= limit) & (lengths.astype(np.uint64) <= limit - np.minimum(offsets, limit))
        return ok


def open_reader(path: Path) -> tuple[Reader, int]:
    """(Reader, fd) of a snapshot file; FileNotFoundError when there is none. The caller closes fd."""
    fd = open_file(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size

        def read(at: int, n: int) -> bytes:
            parts, got = [], 0
            while got < n:
                b = os.pread(fd, n - got, at + got)
                if not b:
                    break
                parts.append(b)
                got += len(b)
            return parts[0] if len(parts) == 1 else b"".join(parts)

        return Reader(read, size), fd
    except BaseException:
        os.close(fd)
        raise


def parse(data: bytes) -> Snapshot:
    """A whole snapshot from bytes, every check applied, keys unmixed; raises SnapshotError only."""
    try:
        r = Reader(lambda at, n: data[at:at + n], len(data))
        parts: list[list[np.ndarray]] = [[], [], [], []]
        dropped = 0
        for s in range(SHARDS):
            x, units, offs, lens = r.shard(s)
            ok = r.entries_ok(r.unit_pos(units), offs, lens)
            dropped += int((~ok).sum())
            for p, c in zip(parts, (unmix_keys(x), units, offs, lens)):
                p.append(c[ok])
    except SnapshotError:
        raise
    except (struct.error, ValueError, OverflowError) as e:
        raise SnapshotError(f"unreadable snapshot ({type(e).__name__}: {e})") from None
    keys, uids, offs, lens = (np.concatenate(p) for p in parts)
    return Snapshot(r.units, keys, uids, offs, lens, dropped)


def _write(write: Callable[[list[object], int], None], units: list[SnapshotUnit],
           shards: Iterable[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]) -> int:
    meta = json.dumps({"version": SNAPSHOT_VERSION, "units": [u.__dict__ for u in units]}).encode()
    body = _pad8(_PRE.size + SHARDS * _SHARD.itemsize + len(meta))
    at = body + 8
    table = np.zeros(SHARDS, dtype=_SHARD)
    last = -1
    for s, x, uids, offs, lens in shards:
        if s <= last or not 0 <= s < SHARDS:
            raise ValueError(f"snapshot shards must come in order, once each (got {s} after {last})")
        last = s
        cols = [np.ascontiguousarray(x, "<u8"), np.ascontiguousarray(offs, "<u8"),
                np.ascontiguousarray(uids, "<u4"), np.ascontiguousarray(lens, "<u4")]
        h = xxhash.xxh3_64()
        for c in cols:
            h.update(c)
        table[s] = (len(x), h.intdigest())
        if len(x):
            write(cols, at)
        at += ENTRY_BYTES * len(x)
    total = int(table["count"].sum())
    head = _PRE.pack(MAGIC, SNAPSHOT_VERSION, SHARDS, MIX_CONSTANT, len(meta), total) + table.tobytes() + meta
    head += bytes(body - len(head))
    write([head + struct.pack("<Q", xxhash.xxh3_64_intdigest(head))], 0)
    return total


def save(directory: Path, units: list[SnapshotUnit],
         shards: Iterable[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
         mode: int = DEFAULT_FILE_MODE, fsync: bool = True) -> int:
    """Persist units and the index's shards (Index.export_shards, filtered) one shard at a time: temp
    file, fsync (when asked), rename. Returns the entries written; raises OSError.

    A local tier passes fsync=False, as for its segments: on ext4 an fsync commits the journal, which
    waits for the writeback of every segment written just before (a close took 0.47 s instead of 4 ms
    after 192 MB of pages), and a snapshot is a hint that is checked, never trusted."""
    with replacing_file(directory / SNAPSHOT_NAME, mode, fsync=fsync) as fd:
        return _write(lambda bufs, at: pwritev_all(fd, bufs, at), units, shards)


def shards_of(keys: np.ndarray, unit_ids: np.ndarray, offsets: np.ndarray,
              lengths: np.ndarray) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Entries in any order (unique keys) as shards in index order (tools, tests)."""
    x = mix_keys(keys)
    order = np.argsort(x)
    x, cols = x[order], [np.asarray(c)[order] for c in (unit_ids, offsets, lengths)]
    cuts = np.searchsorted(x >> np.uint64(64 - SHARD_BITS), np.arange(SHARDS + 1, dtype=np.uint64))
    for s in range(SHARDS):
        a, b = int(cuts[s]), int(cuts[s + 1])
        yield s, x[a:b], cols[0][a:b], cols[1][a:b], cols[2][a:b]


def encode(units: list[SnapshotUnit], keys: np.ndarray, unit_ids: np.ndarray, offsets: np.ndarray,
           lengths: np.ndarray) -> bytes:
    """A snapshot file's bytes for entries in any order (tools, tests)."""
    out = bytearray()

    def write(bufs: list[object], at: int) -> None:
        data = b"".join(bytes(memoryview(b).cast("B")) for b in bufs)  # type: ignore[arg-type]
        if len(out) < at + len(data):
            out.extend(bytes(at + len(data) - len(out)))
        out[at:at + len(data)] = data

    _write(write, units, shards_of(keys, unit_ids, offsets, lengths))
    return bytes(out)


def remove_stale(directory: Path, now: float | None = None) -> list[str]:
    """Remove format-1 snapshots and temp files of saves that crashed (older than STALE_TEMP_S).

    Returns what was removed. A temp file younger than that may be another process's save in flight."""
    removed = []
    now = time.time() if now is None else now
    prefixes = tuple(f".{n}." for n in (SNAPSHOT_NAME, *OLD_SNAPSHOT_NAMES))
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for e in entries:
        stale_tmp = e.name.startswith(prefixes) and e.name.endswith(".tmp")
        if e.name not in OLD_SNAPSHOT_NAMES and not stale_tmp:
            continue
        try:
            if stale_tmp and now - e.stat(follow_symlinks=False).st_mtime < STALE_TEMP_S:
                continue
            os.unlink(e.path)  # a symlink: the link itself, never its target
            removed.append(e.name)
        except OSError:
            continue
    return removed
