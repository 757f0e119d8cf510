"""Safe file access for every file the store touches: never through a link, owner-only, whole writes.

Every file the store opens goes through `open_file` (O_NOFOLLOW, O_EXCL for new files, regular files
only), so nothing planted in a store directory can redirect a write outside it. Cached KV derives from
users' prompts, so files and directories are owner-only unless configured. `pwritev_all` /
`preadv_all` move whole buffers (partial transfers resumed, at most IOV_MAX iovecs a call);
`reserve_space` holds disk blocks before a record is acknowledged.
"""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

DEFAULT_FILE_MODE = 0o600  # cached KV derives from users' prompts: owner-only unless configured
DEFAULT_DIR_MODE = 0o700


class ForeignFile(OSError):
    """A symlink or non-regular file where a store file should be: never read or written through."""


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
