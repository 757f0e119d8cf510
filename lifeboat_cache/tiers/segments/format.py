"""Segment file format and safe file access: names, the sealing trailer, writes that never follow links.

A segment is a run of self-describing records (see codec.py), then, once sealed, a trailer: a table
of every record's digest, offset and length and a checksummed footer. S3 objects share the trailer
layout. Every file the store opens goes through `open_file` (O_NOFOLLOW, O_EXCL for new files,
regular files only) so nothing planted in a store directory can redirect a write outside it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
import socket
import stat
import struct
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

SEGMENT_SUFFIX = ".seg"
TABLE_MAGIC = b"LBTB"
FOOTER_MAGIC = b"LBTR"
FOOTER = struct.Struct("<4sIQI")  # magic, count, table offset, table crc; then footer crc (u32)
FOOTER_SIZE = FOOTER.size + 4
TABLE_ENTRY = np.dtype([("key", "<i8"), ("digest_tail", "S8"), ("offset", "<u8"), ("length", "<u4"),
                        ("raw_length", "<u4")])
DEFAULT_FILE_MODE = 0o600  # cached KV derives from users' prompts: owner-only unless configured
DEFAULT_DIR_MODE = 0o700

Entry = tuple[bytes, int, int, int]  # (digest, offset, length, raw length) of one record


class ForeignFile(OSError):
    """A symlink or non-regular file where a store file should be: never read or written through."""


def trailer_size(count: int) -> int:
    """Bytes of the trailer (table + footer) of a unit holding `count` records."""
    return 4 + count * TABLE_ENTRY.itemsize + FOOTER_SIZE


def build_trailer(at: int, entries: Sequence[Entry]) -> bytes:
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


def read_table(fd: int, size: int) -> np.ndarray | None:
    """The trailer table of a sealed segment open as fd, or None when there is no valid trailer."""
    if size < FOOTER_SIZE:
        return None
    parsed = parse_footer(os.pread(fd, FOOTER_SIZE, size - FOOTER_SIZE), size)
    if parsed is None:
        return None
    return parse_trailer(os.pread(fd, size - parsed[1], parsed[1]), size)


def write_trailer(fd: int, at: int, entries: Sequence[Entry]) -> int:
    """Write the trailer at byte `at`; returns the sealed file's size."""
    blob = build_trailer(at, entries)
    pwritev_all(fd, [blob], at)
    return at + len(blob)


# ---------------------------------------------------------------- names
def writer_tag() -> str:
    host = socket.gethostname().replace("-", "_").replace("/", "_") or "host"
    return f"{host}-{os.getpid()}"


def process_token() -> str:
    """Random per-process part of segment names: containers may share a hostname and a pid."""
    return secrets.token_hex(3)


def parse_name(name: str) -> tuple[str, int] | None:
    """'<ms>-<host>-<pid>-<token><n>.seg' -> (host, pid); None for anything else."""
    if not name.endswith(SEGMENT_SUFFIX) or "/" in name or name.startswith("."):
        return None
    parts = name[: -len(SEGMENT_SUFFIX)].split("-")
    if len(parts) != 4 or not parts[0].isdigit() or not parts[2].isdigit():
        return None
    return parts[1], int(parts[2])


# ---------------------------------------------------------------- safe file access
def open_file(path: Path | str, flags: int, mode: int = DEFAULT_FILE_MODE) -> int:
    """os.open that never follows a symlink and only returns an fd of a regular file.

    New files (O_CREAT) are always created exclusively and get `mode` whatever the umask.
    Raises ForeignFile for a symlink or a non-regular file, OSError otherwise.
    """
    flags |= os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    if flags & os.O_CREAT:
        flags |= os.O_EXCL
    else:
        flags |= getattr(os, "O_NONBLOCK", 0)  # a planted FIFO must not block the open
    try:
        fd = os.open(path, flags, mode)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK):
            raise ForeignFile(e.errno, "a symlink where a store file should be", str(path)) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ForeignFile(errno.EINVAL, "not a regular file", str(path))
        if flags & os.O_CREAT:
            os.fchmod(fd, mode)  # the umask must not widen or narrow the configured mode
        elif flags & getattr(os, "O_NONBLOCK", 0):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_small_file(path: Path | str, limit_bytes: int) -> bytes | None:
    """A whole metadata file (at most limit_bytes), or None when it does not exist."""
    try:
        fd = open_file(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size > limit_bytes:
            raise OSError(errno.EFBIG, f"{size} bytes, more than the {limit_bytes} a store metadata file may hold",
                          str(path))
        chunks, got = [], 0
        while got < size:
            b = os.pread(fd, size - got, got)
            if not b:
                break
            chunks.append(b)
            got += len(b)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_new_file(path: Path, data: bytes, mode: int = DEFAULT_FILE_MODE, fsync: bool = False) -> None:
    """Write `data` to a fresh temp file (O_EXCL, random name) in path's directory, then rename over path."""
    with replacing_file(path, mode, fsync) as fd:
        pwritev_all(fd, [data], 0)


@contextmanager
def replacing_file(path: Path, mode: int = DEFAULT_FILE_MODE, fsync: bool = False) -> Iterator[int]:
    """An fd of a fresh temp file (O_EXCL, random name `.<name>.<hex>.tmp`) that replaces `path` when the
    block ends without an error (after fdatasync if asked); on an error the temp file is removed.

    A crash leaves only the temp file behind: `path` is either the old file or the whole new one."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = open_file(tmp, os.O_WRONLY | os.O_CREAT, mode)
    try:
        try:
            yield fd
            if fsync:
                os.fdatasync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)  # replaces a planted symlink itself, never its target
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def make_dirs(path: Path, mode: int = DEFAULT_DIR_MODE) -> None:
    """Create path and missing parents with `mode` whatever the umask; existing ones are left alone."""
    missing = []
    p = Path(path)
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, mode)
        except FileExistsError:
            continue
        os.chmod(d, mode)


_FALLOC_FL_KEEP_SIZE = 1
_libc_fallocate = getattr(ctypes.CDLL(None, use_errno=True), "fallocate", None) if os.name == "posix" else None
if _libc_fallocate is not None:
    _libc_fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    _libc_fallocate.restype = ctypes.c_int


def reserve_space(fd: int, offset: int, length: int) -> None:
    """Allocate disk blocks for [offset, offset+length) without changing the file size.

    A record write then cannot fail half-way with ENOSPC, and the room its segment's trailer needs
    is held before the record is acknowledged, so a full disk never leaves a segment unsealable.
    A file system without fallocate (some NFS servers) is simply not reserved on. Raises OSError.
    """
    if _libc_fallocate is None or length <= 0:
        return
    if _libc_fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, length) != 0:
        err = ctypes.get_errno()
        if err in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.ENODEV):
            return
        raise OSError(err, os.strerror(err))


IOV_MAX = 1024  # Linux's limit on iovecs per pwritev / preadv call (a layer_first run has thousands)


class PartialWrite(OSError):
    """A write that failed after `written` bytes reached the file (a run keeps its records in them)."""

    def __init__(self, err: OSError, written: int) -> None:
        super().__init__(err.errno, err.strerror)
        self.written = written


def _advance(views: list[memoryview], n: int) -> list[memoryview]:
    """The views left after the first n bytes of them were transferred (no copy)."""
    k = 0
    while k < len(views) and n >= views[k].nbytes:
        n -= views[k].nbytes
        k += 1
    rest = views[k:]
    if rest and n:
        rest[0] = rest[0][n:]
    return rest


def _transfer(call: Callable[[int, list, int], int], fd: int, bufs: Sequence[object], offset: int) -> int:
    """`call` (os.pwritev / os.preadv) over all of bufs, IOV_MAX iovecs a call; after a short transfer
    it goes on from where it stopped (byte views are made only then). Returns the bytes transferred,
    less than bufs hold only when a call transferred nothing (end of file)."""
    items = list(bufs)
    nd = np.ndarray  # a page's blocks are arrays: their size without a memoryview each (~4x cheaper)
    sizes = [b.nbytes if type(b) is nd else memoryview(b).nbytes for b in items]  # type: ignore[union-attr, arg-type]
    done = k = 0
    while k < len(items):
        want = sum(sizes[k:k + IOV_MAX])
        n = call(fd, items[k:k + IOV_MAX], offset + done) if want else 0
        done += n
        if n == want:
            k += IOV_MAX
            continue
        if n <= 0:
            return done
        items = _advance([memoryview(b).cast("B") for b in items[k:]], n)  # type: ignore[arg-type]
        sizes = [v.nbytes for v in items]
        k = 0
    return done


def pwritev_all(fd: int, bufs: Sequence[object], offset: int) -> None:
    """pwritev every byte of bufs at offset: at most IOV_MAX iovecs a call, short writes finished.

    Raises OSError; PartialWrite (with .written) when some bytes were written before the failure.
    """
    def call(f: int, items: list, at: int) -> int:
        try:
            n = os.pwritev(f, items, at)
            if n <= 0:
                raise OSError(errno.EIO, "short write")
        except OSError as e:
            if at > offset:
                raise PartialWrite(e, at - offset) from e
            raise
        return n

    _transfer(call, fd, bufs, offset)


def preadv_all(fd: int, bufs: Sequence[memoryview], offset: int) -> int:
    """preadv into bufs from offset: at most IOV_MAX iovecs a call, short reads continued.

    Returns the bytes read: less than the buffers hold only at the end of the file. Raises OSError.
    """
    return _transfer(os.preadv, fd, bufs, offset)
