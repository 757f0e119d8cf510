"""The unit table of a segment directory: one `Unit` per segment file, its read fd, and the lock.

Everything that adds, finds, opens or drops a unit goes through `UnitTable`, the lock's only owner:
the writers, the rebuild, eviction, purge and compaction all take `table.lock` for their own
reads of unit fields, and never touch the table's dicts. Dropping a unit (evicted, vanished, a
discarded snapshot's) removes its entries from the index in one pass; components that keep state
per unit name (the listing signatures, the NFS probe state) register an `on_drop` callback.

Invariants: unit ids only grow; a dropped unit's fd is closed once its last reader releases it.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

from ...fsio import open_file
from ...index import Index
from ...records import framing, process_token, writer_tag
from .format import SEGMENT_SUFFIX


@dataclass
class Unit:
    id: int
    name: str
    path: Path
    own: bool = False
    scanned: int = 0  # bytes from the start known to hold only complete, indexed records
    walked: int = -1  # file size at the last walk (a dead writer's file is not walked again)
    size: int = 0  # bytes on disk (own open segment: bytes reserved)
    framing: int = 0  # of those, the record headers and the trailer: what `capacity:` does not count
    sealed: bool = False
    fd: int | None = None
    fd_epoch: int = 0  # bumped when the cached fd must be opened afresh (close-to-open, close_cached_fd)
    readers: int = 0
    dropped: bool = False
    damaged: list[tuple[int, int]] = field(default_factory=list)  # skipped regions (counted once)
    damage_seen: dict[int, float] = field(default_factory=dict)  # damaged offset -> first seen (monotonic)

    def sealed_at(self, size: int, records: int) -> None:
        """Its trailer ends at `size` and lists `records` records: all of it is scanned, and its framing
        (what `capacity:` does not count) is theirs. Called under the table's lock."""
        self.size = self.scanned = self.walked = size
        self.framing = framing(records)
        self.sealed = True


class UnitTable:
    """The units of one directory by id and by name, their fds, and the names this process creates.

    `tag` (`<host>-<pid>`) and `token` go into every segment name this process creates; `writer_tag`
    is looked up in this module when the table is made, so a test can pretend to be another host by
    patching `units.writer_tag`.
    """

    def __init__(self, path: Path, index: Index) -> None:
        self.path = Path(path)
        self.index = index
        self.lock = threading.RLock()
        self.tag = writer_tag()
        self.token = process_token()
        self._units: dict[int, Unit] = {}
        self._by_name: dict[str, int] = {}
        self._next_unit = 1
        self._seq = 0
        self._on_drop: list[Callable[[Unit], None]] = []

    @property
    def host(self) -> str:
        """This process's host part of segment names."""
        return self.tag.split("-")[0]

    def on_drop(self, callback: Callable[[Unit], None]) -> None:
        """Call callback(unit) (under the lock) for every unit dropped from now on."""
        self._on_drop.append(callback)

    # ------------------------------------------------------------------ lookup
    @property
    def next_id(self) -> int:
        """The id the next unit gets: a unit added after this was read cannot be in an older listing."""
        with self.lock:
            return self._next_unit

    def get(self, unit_id: int) -> Unit | None:
        with self.lock:
            return self._units.get(unit_id)

    def named(self, name: str) -> Unit | None:
        with self.lock:
            return self._units.get(self._by_name.get(name, -1))

    def live(self) -> list[Unit]:
        """The units not dropped, in id order (a copy: safe to use outside the lock)."""
        with self.lock:
            return [u for u in self._units.values() if not u.dropped]

    def live_ids(self) -> list[int]:
        with self.lock:
            return [uid for uid, u in self._units.items() if not u.dropped]

    def __len__(self) -> int:
        with self.lock:
            return len(self._units)

    # ------------------------------------------------------------------ add / name
    def add(self, name: str, own: bool = False) -> Unit:
        with self.lock:
            uid = self._next_unit
            self._next_unit += 1
            unit = Unit(uid, name, self.path / name, own=own)
            self._units[uid] = unit
            self._by_name[name] = uid
            return unit

    def new_name(self, ms: int | None = None, mark: str = "", width: int = 6) -> str:
        """A fresh segment name of this process: `<ms>-<host>-<pid>-<token><mark><seq>.seg` (ms: now)."""
        ms = int(time.time() * 1000) if ms is None else ms
        with self.lock:
            self._seq += 1
            return f"{ms:013d}-{self.tag}-{self.token}{mark}{self._seq:0{width}d}{SEGMENT_SUFFIX}"

    # ------------------------------------------------------------------ fds
    def acquire(self, unit: Unit) -> int:
        """The unit's read fd, held until `release`; FileNotFoundError once it is dropped. The first
        reader opens the file outside the lock (on NFS an open is a round trip to the filer: one that
        hangs must not hold up the reads of other segments)."""
        while True:
            with self.lock:
                if unit.dropped:
                    raise FileNotFoundError(errno.ENOENT, "segment evicted", str(unit.path))
                if unit.fd is not None:
                    unit.readers += 1
                    return unit.fd
                epoch = unit.fd_epoch
            fd = open_file(unit.path, os.O_RDONLY)
            with self.lock:
                if not unit.dropped and unit.fd is None and unit.fd_epoch == epoch:
                    unit.fd = fd
                    unit.readers += 1
                    return fd
            os.close(fd)  # evicted, opened by another reader, or to be opened afresh meanwhile: look again

    def release(self, unit: Unit) -> None:
        fd = None
        with self.lock:
            unit.readers -= 1
            if unit.dropped and unit.readers == 0 and unit.fd is not None:
                fd, unit.fd = unit.fd, None
        if fd is not None:
            os.close(fd)  # outside the lock: an NFSv4 close is a round trip

    @contextmanager
    def reading(self, name: str) -> Iterator[int | None]:
        """The read fd of segment `name`, held open for the block; None when it is gone or cannot be opened."""
        unit = self.named(name)
        try:
            fd = None if unit is None else self.acquire(unit)
        except OSError:
            fd = None
        if fd is None or unit is None:
            yield None
            return
        try:
            yield fd
        finally:
            self.release(unit)

    def close_cached_fd(self, unit: Unit) -> None:
        """Close a unit's cached fd when no read holds it, so the next read opens the file afresh."""
        fd = None
        with self.lock:
            unit.fd_epoch += 1  # an open in progress outside the lock is not cached either
            if unit.fd is not None and unit.readers == 0:
                fd, unit.fd = unit.fd, None
        if fd is not None:
            os.close(fd)

    def close_fds(self) -> None:
        with self.lock:
            for u in self._units.values():
                if u.fd is not None:
                    os.close(u.fd)
                    u.fd = None

    # ------------------------------------------------------------------ drop
    def drop(self, unit: Unit) -> None:
        self.drop_many([unit])

    def drop_many(self, units: Sequence[Unit]) -> None:
        """Forget units (evicted, vanished, a discarded snapshot's): one pass over the index for all."""
        ids, fds = [], []
        with self.lock:
            for unit in units:
                if unit.dropped:
                    continue
                unit.dropped = True
                for callback in self._on_drop:
                    callback(unit)
                self._units.pop(unit.id, None)
                self._by_name.pop(unit.name, None)
                if unit.readers == 0 and unit.fd is not None:
                    fds.append(unit.fd)
                    unit.fd = None
                ids.append(unit.id)
        for fd in fds:
            os.close(fd)  # outside the lock: an NFSv4 close is a round trip
        if ids:
            self.index.drop_units(ids)
