"""A per-directory change counter that processes of one host share through the page cache.

Several processes (the TP ranks of one SGLang server) append to one store directory. Listing the
directory to find each other's new records is slow (once per refresh interval) and costly, so each
writer also bumps a 16-byte file after every indexed write: word 0 changes on every write, word 1
whenever a segment is created or sealed (a new listing is needed). A reader's index thread compares
the two words with what it saw last (one 16-byte pread from the page cache, a few microseconds;
never on SGLang's threads) and only then catches up by scanning the grown segments (new bytes
only). pread/pwrite rather than mmap: a file truncated by someone else is then a short read, never
a SIGBUS. Every write stores a value unique to the writing process and its
sequence number, so no atomic increment is needed: any change is a signal, and a torn read is only
a spurious catch-up. Processes on other hosts (NFS) do not share the page cache; they still rely on
the listing refresh.
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import struct
import threading
from pathlib import Path

from ...fsio import DEFAULT_FILE_MODE, open_file

log = logging.getLogger(__name__)

CHANGES_NAME = ".lifeboat-changes"
_SIZE = 16
WRITES, SEGMENTS = 0, 8  # byte offsets of the two words
_WORD = struct.Struct("<Q")


class ChangeCounter:
    """The counter file of one store directory (see the module docstring)."""

    def __init__(self, directory: Path, *, create: bool, file_mode: int = DEFAULT_FILE_MODE) -> None:
        self.path = Path(directory) / CHANGES_NAME
        self._prefix = secrets.randbits(32) << 32
        self._seq = itertools.count(1)
        self._lock = threading.Lock()  # the fd is never closed under a pwrite (its number could be reused)
        self._fd: int | None = self._open(create, file_mode)

    def _open(self, create: bool, mode: int) -> int | None:
        flags = os.O_RDWR if create else os.O_RDONLY
        for _ in range(3):
            try:
                return open_file(self.path, flags)
            except FileNotFoundError:
                if not create:
                    return None
            try:
                return open_file(self.path, flags | os.O_CREAT, mode)
            except FileExistsError:
                continue  # another process created it meanwhile: open theirs
        return None

    @property
    def active(self) -> bool:
        return self._fd is not None

    def bump(self, word: int = WRITES) -> None:
        """Signal a change (a write: WRITES; a segment created or sealed: SEGMENTS and WRITES)."""
        fd = self._fd
        if fd is None:
            return
        value = _WORD.pack(self._prefix | (next(self._seq) & 0xFFFFFFFF))
        try:
            with self._lock:
                if self._fd is None:
                    return
                os.pwrite(fd, value + value if word == SEGMENTS else value, 0 if word == SEGMENTS else WRITES)
        except OSError:  # closed meanwhile, or a full disk: the listing refresh still finds the pages
            pass

    def only_mine(self, now: tuple[int, int], before: tuple[int, int]) -> bool:
        """Whether every word that changed from `before` to `now` holds a value this counter wrote: as far
        as the file tells, the change is this process's own. Another process's bump that ours overwrote
        is hidden, so a reader still catches up on such a change, only not at the busy pace."""
        mine = self._prefix >> 32
        return all(n >> 32 == mine for n, b in zip(now, before) if n != b)

    def read(self) -> tuple[int, int]:
        """(writes word, segments word); (0, 0) without a counter file or when it is short."""
        fd = self._fd
        if fd is None:
            return 0, 0
        try:
            with self._lock:
                if self._fd is None:
                    return 0, 0
                raw = os.pread(fd, _SIZE, 0)
        except OSError:
            return 0, 0
        if len(raw) < _SIZE:
            raw = raw.ljust(_SIZE, b"\0")
        return _WORD.unpack_from(raw, WRITES)[0], _WORD.unpack_from(raw, SEGMENTS)[0]

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
            if fd is not None:
                os.close(fd)
