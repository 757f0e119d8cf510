"""Log-structured segment files in one directory, shared by any number of writer processes.

Each process appends records to its own segment file (`<ms>-<host>-<pid>-<n>.seg`: one writer per
file, names sort by age), so nothing needs a cross-process or cross-host lock. A full segment is sealed
by appending a trailer (a table of every record's digest, offset and length, then a checksummed
footer), so a later scan reads one table instead of walking the records. Readers discover other
writers' segments by listing the directory; an unsealed segment is walked record by record, checking
each header and payload checksum, and the walk stops at the first incomplete record (the torn tail
of a killed writer, or a record still being written).

Invariants: write, then index; unit ids only grow; a scan never overwrites a newer index entry;
eviction unlinks whole oldest sealed segments.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import secrets
import shutil
import socket
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from ..codec import HEADER_SIZE, RecordError, payload_matches, raw_length, unpack_header
from ..index import Index, Loc

log = logging.getLogger(__name__)

SEGMENT_SUFFIX = ".seg"
TABLE_MAGIC = b"LBTB"
FOOTER_MAGIC = b"LBTR"
FOOTER = struct.Struct("<4sIQI")  # magic, count, table offset, table crc; then footer crc (u32)
FOOTER_SIZE = FOOTER.size + 4
TABLE_ENTRY = np.dtype([("key", "<i8"), ("digest_tail", "S8"), ("offset", "<u8"), ("length", "<u4"),
                        ("raw_length", "<u4")])
SNAPSHOT_NAME = "index.snapshot.npz"
SNAPSHOT_VERSION = 1
QUARANTINE_NAME = "quarantine.jsonl"
AUTO_CAPACITY_MAX_BYTES = 64 << 30
ORPHAN_IDLE_S = 60.0  # an unsealed segment of a dead local pid, idle this long, is sealed by the next open


@dataclass
class _Unit:
    id: int
    name: str
    path: Path
    own: bool = False
    scanned: int = 0  # bytes from the start known to hold complete, indexed records
    size: int = 0  # bytes on disk (own open segment: bytes reserved)
    sealed: bool = False
    fd: int | None = None
    readers: int = 0
    dropped: bool = False


@dataclass
class _Writer:
    unit: _Unit
    fd: int
    created: float
    reserved: int = 0
    inflight: int = 0
    sealing: bool = False
    entries: list[tuple[bytes, int, int, int]] = field(default_factory=list)


def trailer_size(count: int) -> int:
    """Bytes of the trailer (table + footer) of a unit holding `count` records."""
    return 4 + count * TABLE_ENTRY.itemsize + FOOTER_SIZE


def build_trailer(at: int, entries: Sequence[tuple[bytes, int, int, int]]) -> bytes:
    """Trailer for records (digest, offset, length, raw length) ending at byte `at`.

    Sealed segments and S3 objects share this layout, so one parser reads both.
    """
    arr = np.zeros(len(entries), dtype=TABLE_ENTRY)
    if entries:
        digests = np.frombuffer(b"".join(e[0] for e in entries), dtype="S16")
        raw = digests.view(np.uint8).reshape(-1, 16)
        arr["key"] = raw[:, :8].copy().view("<i8").reshape(-1)
        arr["digest_tail"] = raw[:, 8:].copy().view("S8").reshape(-1)
        arr["offset"] = [e[1] for e in entries]
        arr["length"] = [e[2] for e in entries]
        arr["raw_length"] = [e[3] for e in entries]
    table = TABLE_MAGIC + arr.tobytes()
    footer = FOOTER.pack(FOOTER_MAGIC, len(entries), at, zlib.crc32(table))
    return table + footer + struct.pack("<I", zlib.crc32(footer))


def parse_footer(raw: bytes | memoryview, size: int) -> tuple[int, int, int] | None:
    """(count, table offset, table crc) from the last FOOTER_SIZE bytes of a unit of `size` bytes.

    None when the unit has no valid footer (unsealed, torn or not ours).
    """
    raw = bytes(raw)
    if len(raw) != FOOTER_SIZE or raw[:4] != FOOTER_MAGIC:
        return None
    body = raw[: FOOTER.size]
    if zlib.crc32(body) != struct.unpack_from("<I", raw, FOOTER.size)[0]:
        return None
    _, count, table_off, table_crc = FOOTER.unpack(body)
    if table_off + trailer_size(count) != size:
        return None
    return count, table_off, table_crc


def parse_trailer(tail: bytes | memoryview, size: int) -> np.ndarray | None:
    """The record table from the last `len(tail)` bytes of a unit of `size` bytes.

    `tail` must hold at least the whole trailer. None unless footer and table checksums are valid
    and every record lies before the table: a unit without a valid trailer is never half-trusted.
    """
    tail = memoryview(tail).cast("B")
    if len(tail) < FOOTER_SIZE or len(tail) > size:
        return None
    parsed = parse_footer(tail[len(tail) - FOOTER_SIZE:], size)
    if parsed is None:
        return None
    count, table_off, table_crc = parsed
    start = len(tail) - (size - table_off)
    if start < 0:
        return None
    table = bytes(tail[start: len(tail) - FOOTER_SIZE])
    if table[:4] != TABLE_MAGIC or zlib.crc32(table) != table_crc:
        return None
    arr = np.frombuffer(table, dtype=TABLE_ENTRY, offset=4)
    if len(arr) and int((arr["offset"] + arr["length"]).max()) > table_off:
        return None
    return arr


def _writer_tag() -> str:
    host = socket.gethostname().replace("-", "_").replace("/", "_") or "host"
    return f"{host}-{os.getpid()}"


def _process_token() -> str:
    """Random per-process part of segment names: containers may share a hostname and a pid."""
    return secrets.token_hex(3)


def _parse_name(name: str) -> tuple[str, int] | None:
    """'<ms>-<host>-<pid>-<token><n>.seg' -> (host, pid)."""
    if not name.endswith(SEGMENT_SUFFIX):
        return None
    parts = name[: -len(SEGMENT_SUFFIX)].split("-")
    if len(parts) != 4 or not parts[2].isdigit():
        return None
    return parts[1], int(parts[2])


def _pwritev_all(fd: int, bufs: Sequence[object], offset: int) -> None:
    views = [memoryview(b).cast("B") for b in bufs]  # type: ignore[arg-type]
    total = sum(v.nbytes for v in views)
    n = os.pwritev(fd, views, offset)
    if n < total:  # short write: finish the rest the slow way
        rest = b"".join(bytes(v) for v in views)[n:]
        while rest:
            m = os.pwrite(fd, rest, offset + n)
            if m <= 0:
                raise OSError(errno.EIO, "short write")
            n += m
            rest = rest[m:]


class SegmentDir:
    """One store directory of segment files with its own in-memory index."""

    def __init__(
        self,
        path: Path,
        *,
        capacity_bytes: int | None,
        segment_bytes: int,
        refresh_interval_s: float = 1.0,
        seal_after_s: float | None = None,
        fsync: bool = False,
        name: str = "local",
        stripes: int = 1,
    ) -> None:
        self.path = Path(path)
        self.name = name
        self.segment_bytes = segment_bytes
        self.refresh_interval_s = refresh_interval_s
        self.seal_after_s = seal_after_s
        self.fsync = fsync
        self.index = Index()
        self._lock = threading.RLock()
        self._units: dict[int, _Unit] = {}
        self._by_name: dict[str, int] = {}
        self._next_unit = 1
        # several open segments: buffered writes to one file serialize on its inode lock
        self._writers: list[_Writer | None] = [None] * stripes
        self._stripe = threading.local()
        self._stripe_next = 0
        self._seq = 0
        self._tag = _writer_tag()
        self._token = _process_token()
        self._quarantine: set[tuple[str, int]] = set()
        self._closed = threading.Event()
        self._rebuilt = threading.Event()
        self._thread: threading.Thread | None = None
        self.counters: dict[str, int] = {"scan_records": 0, "scan_torn": 0, "evicted_segments": 0,
                                         "evicted_bytes": 0, "sealed_segments": 0, "rebuild_ms": 0}
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe = self.path / f".probe-{self._tag}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise OSError(e.errno, f"store directory {self.path} is not writable ({e.strerror}); "
                                   "fix the path in lifeboat.yaml (storage[].path) or its permissions") from None
        if capacity_bytes is None:
            capacity_bytes = min(AUTO_CAPACITY_MAX_BYTES, (shutil.disk_usage(self.path).free + self._disk_bytes()) // 2)
        self.capacity_bytes = capacity_bytes

    # ------------------------------------------------------------------ open / rebuild
    def open(self, background: bool = True) -> None:
        """Load the snapshot (instant), then scan what is newer in a background thread."""
        self._load_quarantine()
        self._load_snapshot()
        self._thread = threading.Thread(target=self._run, name=f"lifeboat-{self.name}-index", daemon=True)
        if background:
            self._thread.start()
        else:
            self._refresh(initial=True)
            self._rebuilt.set()
            self._thread.start()

    def wait_rebuilt(self, timeout: float | None = None) -> bool:
        return self._rebuilt.wait(timeout)

    @property
    def rebuilt(self) -> bool:
        return self._rebuilt.is_set()

    def _run(self) -> None:
        if not self._rebuilt.is_set():
            t0 = time.perf_counter()
            try:
                self._refresh(initial=True)
            except Exception:  # never let the index thread die on a bad directory
                log.exception("lifeboat: initial index rebuild of %s failed", self.path)
            self.counters["rebuild_ms"] = int((time.perf_counter() - t0) * 1000)
            self._rebuilt.set()
            log.info("lifeboat: %s index rebuilt: %d pages in %d ms", self.path, len(self.index),
                     self.counters["rebuild_ms"])
        while not self._closed.wait(self.refresh_interval_s):
            try:
                self._refresh(initial=False)
                self._maybe_time_seal()
            except Exception:
                log.exception("lifeboat: index refresh of %s failed", self.path)

    def _disk_bytes(self) -> int:
        total = 0
        try:
            with os.scandir(self.path) as it:
                for e in it:
                    if e.name.endswith(SEGMENT_SUFFIX):
                        total += e.stat().st_size
        except OSError:
            pass
        return total

    def _list(self) -> dict[str, int]:
        out = {}
        with os.scandir(self.path) as it:
            for e in it:
                if e.name.endswith(SEGMENT_SUFFIX):
                    try:
                        out[e.name] = e.stat().st_size
                    except FileNotFoundError:
                        continue
        return out

    def _refresh(self, initial: bool) -> None:
        """Reconcile the unit table with the directory listing and index what is new."""
        try:
            listing = self._list()
        except OSError as e:
            log.warning("lifeboat: cannot list %s: %s", self.path, e)
            return
        with self._lock:
            own_names = {w.unit.name for w in self._writers if w is not None}
            gone = [u for u in self._units.values() if u.name not in listing and u.name not in own_names]
        for u in gone:
            self._drop(u)
        for name in sorted(listing):
            with self._lock:
                uid = self._by_name.get(name)
                unit = self._units.get(uid) if uid else None
                if unit is None:
                    unit = self._add_unit(name)
                if unit.own or unit.sealed:
                    continue
            if initial:
                self._adopt_if_orphan(unit)
            self._scan(unit)
        self.gc()

    def _add_unit(self, name: str, own: bool = False) -> _Unit:
        uid = self._next_unit
        self._next_unit += 1
        unit = _Unit(uid, name, self.path / name, own=own)
        self._units[uid] = unit
        self._by_name[name] = uid
        return unit

    def _adopt_if_orphan(self, unit: _Unit) -> None:
        """Seal a segment left unsealed by a dead writer on this host (truncating its torn tail)."""
        parsed = _parse_name(unit.name)
        if parsed is None or parsed[0] != self._tag.split("-")[0]:
            return
        pid = parsed[1]
        if pid == os.getpid():
            return
        try:
            os.kill(pid, 0)
            return  # alive: not an orphan
        except ProcessLookupError:
            pass
        except PermissionError:
            return
        try:  # pids are per namespace: only a segment idle for a while is surely abandoned
            if time.time() - unit.path.stat().st_mtime < ORPHAN_IDLE_S:
                return
        except OSError:
            return
        self._scan(unit)
        if unit.sealed:
            return
        try:
            entries = self._entries_from_index(unit)
            fd = os.open(unit.path, os.O_RDWR)
            try:
                os.ftruncate(fd, unit.scanned)
                end = self._write_trailer(fd, unit.scanned, entries)
            finally:
                os.close(fd)
            unit.size = unit.scanned = end
            unit.sealed = True
            log.info("lifeboat: sealed orphan segment %s of dead writer pid %d (%d records)",
                     unit.name, pid, len(entries))
        except OSError as e:
            log.warning("lifeboat: could not seal orphan segment %s: %s", unit.name, e)

    def _entries_from_index(self, unit: _Unit) -> list[tuple[bytes, int, int, int]]:
        """(digest, offset, length, raw length) of unit's records, read back from their headers."""
        out = []
        fd = self._acquire(unit)
        try:
            pos = 0
            while pos < unit.scanned:
                h = unpack_header(os.pread(fd, HEADER_SIZE, pos))
                out.append((h.digest, pos, h.record_len, h.raw_len))
                pos += h.record_len
        finally:
            self._release(unit)
        return out

    # ------------------------------------------------------------------ scanning
    def _scan(self, unit: _Unit) -> None:
        try:
            fd = self._acquire(unit)
        except FileNotFoundError:
            self._drop(unit)
            return
        try:
            size = os.fstat(fd).st_size
            unit.size = size
            if size <= unit.scanned:
                return
            if self._scan_trailer(unit, fd, size):
                return
            self._walk(unit, fd, size)
        except OSError as e:
            log.warning("lifeboat: scan of %s failed: %s", unit.path, e)
        finally:
            self._release(unit)

    @staticmethod
    def _read_table(fd: int, size: int) -> np.ndarray | None:
        """The trailer table of a sealed segment, or None when there is no valid trailer."""
        if size < FOOTER_SIZE:
            return None
        parsed = parse_footer(os.pread(fd, FOOTER_SIZE, size - FOOTER_SIZE), size)
        if parsed is None:
            return None
        return parse_trailer(os.pread(fd, size - parsed[1], parsed[1]), size)

    def _scan_trailer(self, unit: _Unit, fd: int, size: int) -> bool:
        arr = self._read_table(fd, size)
        if arr is None:
            return False
        if unit.scanned:
            arr = arr[arr["offset"] >= unit.scanned]
        if self._quarantine:
            keep = np.array([(unit.name, int(o)) not in self._quarantine for o in arr["offset"]], dtype=bool)
            arr = arr[keep] if len(arr) else arr
        self.index.insert_arrays(arr["key"], np.full(len(arr), unit.id, np.uint32), arr["offset"],
                                 arr["length"], if_absent=True)
        self.counters["scan_records"] += len(arr)
        unit.scanned = size
        unit.sealed = True
        return True

    def _walk(self, unit: _Unit, fd: int, size: int) -> None:
        """Index complete records of an unsealed segment, verifying each payload checksum."""
        pos = unit.scanned
        keys, offs, lens = [], [], []
        while pos + HEADER_SIZE <= size:
            hdr = os.pread(fd, HEADER_SIZE, pos)
            if hdr[:4] == TABLE_MAGIC:
                break  # a trailer is being written; the next refresh reads it whole
            try:
                h = unpack_header(hdr)
            except RecordError:
                self.counters["scan_torn"] += 1
                break
            if pos + h.record_len > size:
                break  # incomplete: still being written, or the torn tail
            payload = os.pread(fd, h.stored_len, pos + HEADER_SIZE)
            if not payload_matches(h, payload):
                self.counters["scan_torn"] += 1
                break
            if (unit.name, pos) not in self._quarantine:
                keys.append(int.from_bytes(h.digest[:8], "little", signed=True))
                offs.append(pos)
                lens.append(h.record_len)
            pos += h.record_len
        if keys:
            self.index.insert_arrays(np.array(keys, np.int64), np.full(len(keys), unit.id, np.uint32),
                                     np.array(offs, np.uint64), np.array(lens, np.uint32), if_absent=True)
            self.counters["scan_records"] += len(keys)
        unit.scanned = pos

    # ------------------------------------------------------------------ fds
    def _acquire(self, unit: _Unit) -> int:
        with self._lock:
            if unit.dropped:
                raise FileNotFoundError(errno.ENOENT, "segment evicted", str(unit.path))
            if unit.fd is None:
                unit.fd = os.open(unit.path, os.O_RDONLY)
            unit.readers += 1
            return unit.fd

    def _release(self, unit: _Unit) -> None:
        with self._lock:
            unit.readers -= 1
            if unit.dropped and unit.readers == 0 and unit.fd is not None:
                os.close(unit.fd)
                unit.fd = None

    def _drop(self, unit: _Unit) -> None:
        with self._lock:
            if unit.dropped:
                return
            unit.dropped = True
            self._units.pop(unit.id, None)
            self._by_name.pop(unit.name, None)
            if unit.readers == 0 and unit.fd is not None:
                os.close(unit.fd)
                unit.fd = None
        self.index.drop_unit(unit.id)

    # ------------------------------------------------------------------ write path
    def append(self, ikey: int, digest: bytes, bufs: Sequence[object], length: int) -> Loc:
        """Append one record (header + payload parts) and index it. Raises OSError on I/O failure."""
        with self._lock:
            stripe = self._my_stripe()
            w = self._writer_for(stripe, length)
            rolled = w.reserved == 0
            off = w.reserved
            w.reserved += length
            w.unit.size = w.reserved
            w.inflight += 1
        try:
            _pwritev_all(w.fd, bufs, off)
        except OSError:
            with self._lock:
                w.inflight -= 1
                if self._writers[stripe] is w:  # abandon the segment: its tail now has a hole
                    self._writers[stripe] = None
                    self._start_seal(w)
            raise
        with self._lock:
            w.inflight -= 1
            w.entries.append((digest, off, length, raw_length(bufs[0])))
            if w.sealing and w.inflight == 0:
                self._finish_seal(w)
        loc = Loc(w.unit.id, off, length)
        self.index.insert(ikey, loc)
        if rolled:  # a segment was sealed for this one: enforce the capacity bound now
            self.gc()
        return loc

    def _my_stripe(self) -> int:
        """Each writing thread sticks to one stripe (one open segment)."""
        s = getattr(self._stripe, "i", None)
        if s is None:
            s = self._stripe.i = self._stripe_next % len(self._writers)
            self._stripe_next += 1
        return s

    def _writer_for(self, stripe: int, length: int) -> _Writer:
        w = self._writers[stripe]
        if w is not None and w.reserved + length > self.segment_bytes and w.reserved > 0:
            self._writers[stripe] = None
            self._start_seal(w)
            w = None
        if w is None:
            self._seq += 1
            name = f"{int(time.time() * 1000):013d}-{self._tag}-{self._token}{self._seq:06d}{SEGMENT_SUFFIX}"
            fd = os.open(self.path / name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            unit = self._add_unit(name, own=True)
            w = self._writers[stripe] = _Writer(unit, fd, time.monotonic())
        return w

    def _start_seal(self, w: _Writer) -> None:
        w.sealing = True
        if w.inflight == 0:
            self._finish_seal(w)

    def _finish_seal(self, w: _Writer) -> None:
        """Write the trailer of a segment whose records are all written; called under the lock."""
        try:
            entries = sorted(w.entries, key=lambda e: e[1])
            # only the contiguous prefix is trustworthy if a write failed and left a hole
            end = 0
            good = []
            for e in entries:
                if e[1] != end:
                    break
                good.append(e)
                end = e[1] + e[2]
            if end != w.reserved:
                os.ftruncate(w.fd, end)
            size = self._write_trailer(w.fd, end, good)
            if self.fsync:
                os.fdatasync(w.fd)
            w.unit.size = w.unit.scanned = size
            w.unit.sealed = True
            self.counters["sealed_segments"] += 1
        except OSError as e:
            log.warning("lifeboat: sealing %s failed (%s); it will be walked record by record", w.unit.path, e)
            w.unit.scanned = 0
        finally:
            os.close(w.fd)
            w.unit.own = False

    @staticmethod
    def _write_trailer(fd: int, at: int, entries: list[tuple[bytes, int, int, int]]) -> int:
        blob = build_trailer(at, entries)
        _pwritev_all(fd, [blob], at)
        return at + len(blob)

    def seal(self) -> None:
        """Seal the open segment now (flush / close / shared-FS visibility)."""
        with self._lock:
            for i, w in enumerate(self._writers):
                self._writers[i] = None
                if w is not None:
                    self._start_seal(w)

    def _maybe_time_seal(self) -> None:
        if self.seal_after_s is None:
            return
        with self._lock:
            for i, w in enumerate(self._writers):
                if w is not None and w.reserved and time.monotonic() - w.created >= self.seal_after_s:
                    self._writers[i] = None
                    self._start_seal(w)

    # ------------------------------------------------------------------ read path
    def read_into(self, loc: Loc, bufs: Sequence[memoryview]) -> bool:
        """Read the record at loc into bufs (which together hold loc.length bytes).

        Returns False when the location is stale (evicted/vanished segment, short file); raises
        OSError for real I/O errors so the store can enter its cooldown.
        """
        with self._lock:
            unit = self._units.get(loc.unit)
        if unit is None:
            return False
        try:
            fd = self._acquire(unit)
        except FileNotFoundError:
            self._drop(unit)
            return False
        try:
            n = os.preadv(fd, bufs, loc.offset)
        finally:
            self._release(unit)
        return n == loc.length

    def unit_name(self, unit_id: int) -> str | None:
        with self._lock:
            u = self._units.get(unit_id)
            return u.name if u else None

    # ------------------------------------------------------------------ capacity
    def usage_bytes(self) -> int:
        with self._lock:
            return sum(u.size for u in self._units.values())

    def units(self) -> list[tuple[str, int, bool]]:
        with self._lock:
            return [(u.name, u.size, u.sealed) for u in sorted(self._units.values(), key=lambda u: u.name)]

    def gc(self, target_bytes: int | None = None) -> int:
        """Evict whole oldest sealed segments until usage <= capacity (or target). Returns bytes freed."""
        limit = self.capacity_bytes if target_bytes is None else target_bytes
        freed = 0
        while True:
            with self._lock:
                used = sum(u.size for u in self._units.values())
                if used <= limit:
                    return freed
                victims = sorted((u for u in self._units.values() if u.sealed and not u.own),
                                 key=lambda u: u.name)
                if not victims:
                    return freed
                victim = victims[0]
            try:
                victim.path.unlink()
            except FileNotFoundError:
                pass
            except OSError as e:
                log.warning("lifeboat: cannot evict %s: %s", victim.path, e)
                return freed
            self._drop(victim)
            freed += victim.size
            self.counters["evicted_segments"] += 1
            self.counters["evicted_bytes"] += victim.size

    def describe(self) -> list[dict[str, int | str | bool]]:
        """Per segment: records, stored and raw bytes (from trailers, or headers when unsealed)."""
        out = []
        for name, size, sealed in self.units():
            with self._lock:
                unit = self._units.get(self._by_name.get(name, -1))
            if unit is None:
                continue
            recs = stored = raw = 0
            try:
                fd = self._acquire(unit)
            except FileNotFoundError:
                continue
            try:
                table = self._read_table(fd, os.fstat(fd).st_size) if sealed else None
                if table is not None:
                    recs, stored, raw = len(table), int(table["length"].sum()), int(table["raw_length"].sum())
                else:
                    pos = 0
                    while pos < unit.scanned:
                        h = unpack_header(os.pread(fd, HEADER_SIZE, pos))
                        recs, stored, raw, pos = recs + 1, stored + h.record_len, raw + h.raw_len, pos + h.record_len
            except (OSError, RecordError) as e:
                log.warning("lifeboat: cannot describe %s: %s", unit.path, e)
            finally:
                self._release(unit)
            out.append({"segment": name, "bytes": size, "sealed": sealed, "records": recs,
                        "stored_bytes": stored, "raw_bytes": raw})
        return out

    # ------------------------------------------------------------------ quarantine
    def _load_quarantine(self) -> None:
        p = self.path / QUARANTINE_NAME
        try:
            for line in p.read_text().splitlines():
                try:
                    rec = json.loads(line)
                    self._quarantine.add((rec["segment"], int(rec["offset"])))
                except (ValueError, KeyError, TypeError):
                    continue
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("lifeboat: cannot read %s: %s", p, e)

    def quarantine(self, ikey: int, loc: Loc, reason: str) -> None:
        """Drop a bad record from the index and remember it so no later scan brings it back."""
        self.index.remove_if_match(ikey, loc)
        name = self.unit_name(loc.unit)
        if name is None:
            return
        self._quarantine.add((name, loc.offset))
        try:
            with open(self.path / QUARANTINE_NAME, "a") as f:
                f.write(json.dumps({"segment": name, "offset": loc.offset, "length": loc.length,
                                    "reason": reason, "time": time.time()}) + "\n")
        except OSError as e:
            log.warning("lifeboat: cannot record quarantine in %s: %s", self.path, e)

    # ------------------------------------------------------------------ snapshot
    def save_snapshot(self) -> None:
        """Persist the index (temp file + rename) so the next open needs no full scan."""
        with self._lock:
            units = [{"name": u.name, "id": u.id, "scanned": u.scanned, "sealed": u.sealed}
                     for u in self._units.values() if u.sealed or not u.own]
            arrays = self.index.export()
        ids = np.array([u["id"] for u in units], dtype=np.uint32)
        keep = np.isin(arrays["units"], ids)
        meta = json.dumps({"version": SNAPSHOT_VERSION, "units": units}).encode()
        tmp = self.path / f".{SNAPSHOT_NAME}.{self._tag}.tmp"
        try:
            with open(tmp, "wb") as f:
                np.savez(f, meta=np.frombuffer(meta, dtype=np.uint8), keys=arrays["keys"][keep],
                         units=arrays["units"][keep], offsets=arrays["offsets"][keep],
                         lengths=arrays["lengths"][keep])
            os.replace(tmp, self.path / SNAPSHOT_NAME)
        except OSError as e:
            log.warning("lifeboat: cannot save index snapshot in %s: %s", self.path, e)
            tmp.unlink(missing_ok=True)

    def _load_snapshot(self) -> None:
        p = self.path / SNAPSHOT_NAME
        if not p.exists():
            return
        try:
            with np.load(p, allow_pickle=False) as z:
                meta = json.loads(bytes(z["meta"]).decode())
                if meta.get("version") != SNAPSHOT_VERSION:
                    raise ValueError(f"snapshot version {meta.get('version')}")
                keys, units, offs, lens = z["keys"], z["units"], z["offsets"], z["lengths"]
            listing = self._list()
        except Exception as e:  # a bad snapshot is only a slower start: discard it and rescan
            log.warning("lifeboat: ignoring index snapshot %s (%s); rescanning", p, e)
            return
        remap = np.full(int(units.max()) + 1 if len(units) else 1, 0, dtype=np.uint32)
        with self._lock:
            for u in meta["units"]:
                size = listing.get(u["name"])
                if size is None or size < u["scanned"] or u["id"] >= len(remap):
                    continue
                unit = self._add_unit(u["name"])
                unit.scanned, unit.sealed, unit.size = int(u["scanned"]), bool(u["sealed"]), size
                if unit.sealed and size != unit.scanned:
                    unit.sealed, unit.scanned = False, 0  # rewritten since: scan it again
                    continue
                remap[u["id"]] = unit.id
        new_units = remap[units] if len(units) else units
        ok = new_units != 0
        self.index.insert_arrays(keys[ok], new_units[ok], offs[ok], lens[ok], if_absent=True)
        log.info("lifeboat: %s: loaded index snapshot with %d pages", self.path, int(ok.sum()))

    # ------------------------------------------------------------------ verify / close
    def records(self) -> Iterator[tuple[int, Loc]]:
        return self.index.items()

    def flush(self) -> None:
        self.seal()

    def close(self) -> None:
        self._closed.set()
        self.seal()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=5)
        self.save_snapshot()
        with self._lock:
            for u in self._units.values():
                if u.fd is not None and u.readers == 0:
                    os.close(u.fd)
                    u.fd = None
