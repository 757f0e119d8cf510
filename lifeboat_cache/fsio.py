"""Safe file access for every file the store touches: never through a link, owner-only, whole writes.

Every file the store opens goes through `open_file` (O_NOFOLLOW, O_EXCL for new files, regular files
only), so nothing planted in a store directory can redirect a write outside it. Cached KV derives from
users' prompts, so files and directories are owner-only unless configured. `pwritev_all` /
`preadv_all` move whole buffers (partial transfers resumed, at most IOV_MAX iovecs a call);
`reserve_space` holds disk blocks before a record is acknowledged; `WriteCallBound` sizes write calls
by what the machine's free memory makes cheap.
"""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
import stat
import threading
import time
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
# The largest single write call. Measured (docs/perf/write-calls.md, `lifeboat bench --only ceilings`):
# on Linux 6.18 / ext4 in a VM whose free memory is reported to its host, one write of 2 MiB or more
# into the page cache costs 6-20x the kernel time of the same bytes in calls of 1.5 MiB or less; reads
# are not affected. The segment writers go smaller while free memory is short (WriteCallBound), and a
# tier's `write_call_size` fixes the bound.
WRITE_CALL_BYTES = 1 << 20


class PartialWrite(OSError):
    """A write that failed after `written` bytes reached the file (a run keeps its records in them)."""

    def __init__(self, err: OSError, written: int) -> None:
        super().__init__(err.errno, err.strerror)
        self.written = written


def _transfer(call: Callable[[int, list, int], int], fd: int, bufs: Sequence[object], offset: int,
              max_bytes: int = 0) -> int:
    """`call` (os.pwritev / os.preadv) over all of bufs: at most IOV_MAX iovecs and `max_bytes` bytes a
    call (0: no byte bound; a buffer larger than the bound goes in slices), and after a short transfer
    it goes on from where it stopped. Byte views are made only for slices. Returns the bytes
    transferred, less than bufs hold only when a call transferred nothing (end of file)."""
    items = list(bufs)
    nd = np.ndarray  # a page's blocks are arrays: their size without a memoryview each (~4x cheaper)
    sizes = [b.nbytes if type(b) is nd else memoryview(b).nbytes for b in items]  # type: ignore[union-attr, arg-type]
    cap = max_bytes if max_bytes > 0 else max(sum(sizes), 1)
    done = k = skip = 0  # the next byte to move: `skip` bytes into items[k]
    while k < len(items):
        iov: list[object] = []
        want, j = 0, k
        while j < len(items) and len(iov) < IOV_MAX and want < cap:
            start = skip if j == k else 0
            take = min(sizes[j] - start, cap - want)
            whole = start == 0 and take == sizes[j]
            part = items[j] if whole else memoryview(items[j]).cast("B")[start:start + take]  # type: ignore[arg-type]
            iov.append(part)
            want += take
            if start + take < sizes[j]:
                break
            j += 1
        if not want:  # only empty buffers left in this stretch
            k, skip = j, 0
            continue
        n = call(fd, iov, offset + done)
        if n <= 0:
            return done
        done += n
        while n > 0:  # move the cursor past the n bytes this call moved
            rest = sizes[k] - skip
            if n < rest:
                skip += n
                break
            n -= rest
            k, skip = k + 1, 0
    return done


def pwritev_all(fd: int, bufs: Sequence[object], offset: int, max_call_bytes: int = WRITE_CALL_BYTES) -> None:
    """pwritev every byte of bufs at offset: at most IOV_MAX iovecs and `max_call_bytes` bytes a call
    (WRITE_CALL_BYTES: why), short writes finished.

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

    _transfer(call, fd, bufs, offset, max_call_bytes)


def preadv_all(fd: int, bufs: Sequence[memoryview], offset: int) -> int:
    """preadv into bufs from offset: at most IOV_MAX iovecs a call, short reads continued.

    Returns the bytes read: less than the buffers hold only at the end of the file. Raises OSError.
    """
    return _transfer(os.preadv, fd, bufs, offset)


# ------------------------------------------------------------------ write calls as large as is cheap
# A write call takes page-cache folios of about its own size (ext4 large folios), from the buddy
# allocator's free list of that order, splitting a larger free block when the list is empty. A VM with
# free page reporting (virtio_balloon: Firecracker, QEMU with `free-page-reporting=on`) hands its free
# blocks of the reporting order (9, 2 MiB, by default) and above back to the host, and the first touch
# of a page taken from such a block again is a host fault, which the guest sees as kernel time in the
# write: a write of 2 MiB or more, or a smaller one once its order's lists below the reporting order
# are empty, runs at a tenth of its speed (docs/perf/write-calls.md has the measurements). Calls of
# 1 MiB are the cheapest while free 1 MiB blocks last; 256 KiB calls cost about a tenth more but draw
# on the 256 KiB, 512 KiB and 1 MiB lists together, about three times the room (512 KiB calls would
# drain the 512 KiB list that 256 KiB calls need next, so there is no step between). So the bound
# follows the free lists: 1 MiB while its lists hold `ROOM_BYTES`, then 256 KiB; on a machine that
# reports nothing (bare metal, most VMs), 1 MiB.
CALL_SIZES = (WRITE_CALL_BYTES, 256 << 10)  # largest first; each a power of two: one folio order
ROOM_BYTES = 1 << 30   # free bytes below the reporting order a size must have left to be chosen
RECHECK_S = 0.5        # how often the free lists are read again (a put of 1 GiB takes ~0.3 s)
_PAGE = 4096          # the buddy allocator's order-0 block
_BALLOON = "0x0005"    # virtio device id of the memory balloon
_REPORTING_BIT = 5     # VIRTIO_BALLOON_F_REPORTING


def reporting_order(root: Path = Path("/sys")) -> int | None:
    """The buddy order from which free memory is reported to the host, or None where no balloon device
    reports free pages."""
    reporting = False
    for dev in (root / "bus/virtio/devices").glob("*"):
        try:
            if (dev / "device").read_text().strip() == _BALLOON:
                bits = (dev / "features").read_text().strip()
                reporting = reporting or (len(bits) > _REPORTING_BIT and bits[_REPORTING_BIT] == "1")
        except OSError:
            continue
    if not reporting:
        return None
    try:
        return int((root / "module/page_reporting/parameters/page_reporting_order").read_text())
    except (OSError, ValueError):
        return 9  # the kernel's default: the pageblock order


def free_bytes_by_order(buddyinfo: Path = Path("/proc/buddyinfo")) -> list[int]:
    """Free bytes in each buddy order (0, 1, ...), all zones together ([] where there is no buddyinfo)."""
    total: list[int] = []
    try:
        lines = buddyinfo.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        counts = [int(x) for x in line.split()[4:]]
        total += [0] * (len(counts) - len(total))
        for k, n in enumerate(counts):
            total[k] += n * (_PAGE << k)
    return total


def unreported_free_bytes() -> int | None:
    """Free bytes below the reporting order: what writes can take with no host fault. None where free
    memory is not reported (every free page is then as cheap as any other)."""
    order = reporting_order()
    return None if order is None else sum(free_bytes_by_order()[:order])


class WriteCallBound:
    """The largest single write call for the next run of records. `fixed` (a tier's `write_call_size`)
    wins; 0 follows the free lists as the comment above says, read at most every RECHECK_S."""

    def __init__(self, fixed: int = 0, sys_root: Path = Path("/sys"),
                 buddyinfo: Path = Path("/proc/buddyinfo")) -> None:
        self._order = None if fixed else reporting_order(sys_root)  # None: the bound never changes
        self._buddyinfo = buddyinfo
        self._bound = fixed or CALL_SIZES[0]
        self._checked = float("-inf")
        self._lock = threading.Lock()

    def __call__(self) -> int:
        if self._order is None:
            return self._bound
        now = time.monotonic()
        if now - self._checked >= RECHECK_S and self._lock.acquire(blocking=False):
            try:
                self._checked = now
                self._bound = choose(free_bytes_by_order(self._buddyinfo), self._order)
            finally:
                self._lock.release()
        return self._bound


def choose(free: list[int], order: int) -> int:
    """The largest CALL_SIZES entry whose folio order and the orders above it, up to the reporting order,
    hold ROOM_BYTES free; the smallest when none does (or when the free lists are unknown)."""
    for size in CALL_SIZES:
        k = (size // _PAGE).bit_length() - 1
        if sum(free[k:order]) >= ROOM_BYTES:
            return size
    return CALL_SIZES[-1]
