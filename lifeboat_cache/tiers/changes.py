"""A per-directory change counter that processes of one host share through mmap.

Several processes (the TP ranks of one SGLang server) append to one store directory. Listing the
directory to find each other's new records is slow (once per refresh interval) and costly, so each
writer also bumps a 16-byte mmap'ed file after every indexed write: word 0 changes on every write,
word 1 whenever a segment is created or sealed (a new listing is needed). A reader compares the two
words with what it saw last, a memory read and no syscall, and only then catches up by scanning the
grown segments (new bytes only). Every write stores a value unique to the writing process and its
sequence number, so no atomic increment is needed: any change is a signal, and a torn read is only
a spurious catch-up. Processes on other hosts (NFS) do not share the page cache; they still rely on
the listing refresh.
"""

from __future__ import annotations

import itertools
import logging
import mmap
import os
import secrets
import struct
from pathlib import Path

from .segfile import DEFAULT_FILE_MODE, open_file

log = logging.getLogger(__name__)

CHANGES_NAME = ".lifeboat-changes"
_SIZE = 16
WRITES, SEGMENTS = 0, 8  # byte offsets of the two words
_WORD = struct.Struct("<Q")


class ChangeCounter:
    """The mmap'ed counter file of one store directory (see the module docstring)."""

    def __init__(self, directory: Path, *, create: bool, file_mode: int = DEFAULT_FILE_MODE) -> None:
        self.path = Path(directory) / CHANGES_NAME
        self._prefix = secrets.randbits(32) << 32
        self._seq = itertools.count(1)
        self._map: mmap.mmap | None = None
        fd = self._open(create, file_mode)
        if fd is None:
            return
        try:
            if os.fstat(fd).st_size < _SIZE:
                if not create:
                    return
                os.ftruncate(fd, _SIZE)  # only ever grows: a racing creator truncates to the same size
            self._map = mmap.mmap(fd, _SIZE, access=mmap.ACCESS_WRITE if create else mmap.ACCESS_READ)
        finally:
            os.close(fd)

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
        return self._map is not None

    def bump(self, word: int = WRITES) -> None:
        """Signal a change (a write: WRITES; a segment created or sealed: SEGMENTS and WRITES)."""
        m = self._map
        if m is None:
            return
        value = self._prefix | (next(self._seq) & 0xFFFFFFFF)
        try:
            if word == SEGMENTS:
                _WORD.pack_into(m, SEGMENTS, value)
            _WORD.pack_into(m, WRITES, value)
        except (ValueError, OSError):  # closed meanwhile
            pass

    def read(self) -> tuple[int, int]:
        """(writes word, segments word); (0, 0) without a counter file."""
        m = self._map
        if m is None:
            return 0, 0
        try:
            return _WORD.unpack_from(m, WRITES)[0], _WORD.unpack_from(m, SEGMENTS)[0]
        except (ValueError, OSError):
            return 0, 0

    def close(self) -> None:
        m, self._map = self._map, None
        if m is not None:
            try:
                m.close()
            except (BufferError, ValueError):
                pass
