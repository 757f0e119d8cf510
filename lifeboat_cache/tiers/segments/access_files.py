"""Each process's retention state in the directory: `retention-<host>-<pid>-<token>.state`.

A process publishes its AccessTable (reads per record, queue positions of kept units) to its own file
now and then and at close, and absorbs the files of the others (and of earlier runs), so what was read
before a restart, or by another process or host of a shared directory, still counts when a unit is
chosen for eviction. What a process knows of another's reads is at most one publish interval old.
A file whose process is gone (same host, pid dead) is removed once its counts are in this process's
own published file. A torn or hostile file is ignored (logged once): it can only cost a rewrite or a
miss, never a wrong page.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Callable

from ...fsio import read_small_file, write_new_file
from ...retention import STATE_MAX_BYTES, AccessTable, decode, encode
from .format import process_alive
from .units import UnitTable

log = logging.getLogger(__name__)

PREFIX, SUFFIX = "retention-", ".state"
PUBLISH_S = 5.0  # the longest one process's reads stay unknown to the others


class AccessFiles:
    """Publishes this process's AccessTable and absorbs the other processes' (see the module docstring)."""

    def __init__(self, path: Path, table: UnitTable, access: AccessTable, *, file_mode: int, read_only: bool,
                 log_once: Callable[..., bool]) -> None:
        self.path, self.table, self.access = Path(path), table, access
        self.file_mode, self.read_only, self._log_once = file_mode, read_only, log_once
        self.own = f"{PREFIX}{table.tag}-{table.token}{SUFFIX}"
        self._seen: dict[str, tuple[int, int]] = {}  # file -> (size, mtime_ns) when last absorbed
        self._dead: set[str] = set()  # absorbed files of gone processes: removed after our next publish
        self._published = -1
        self._last = 0.0
        self._absorbed = -PUBLISH_S

    def absorb_due(self, force: bool = False) -> None:
        """`absorb` when PUBLISH_S passed since the last one (always when forced)."""
        now = time.monotonic()
        if force or now - self._absorbed >= PUBLISH_S:
            self._absorbed = now
            self.absorb()

    def absorb(self) -> None:
        """Merge every other process's file that changed since it was last read."""
        live = {u.name for u in self.table.live()}
        try:
            entries = list(os.scandir(self.path))
        except OSError:
            return
        for e in entries:
            if not (e.name.startswith(PREFIX) and e.name.endswith(SUFFIX)) or e.name == self.own:
                continue
            try:
                st = e.stat(follow_symlinks=False)
                if not e.is_file(follow_symlinks=False):
                    continue
                sig = (st.st_size, st.st_mtime_ns)
                if self._seen.get(e.name) == sig:
                    continue
                data = read_small_file(self.path / e.name, STATE_MAX_BYTES)
                if data is None:
                    continue
                hits, order = decode(data)
            except (OSError, ValueError) as err:
                self._log_once(f"access:{e.name}", "lifeboat: %s: ignoring retention state %s (%s)", self.path,
                               e.name, err)
                continue
            self._seen[e.name] = sig
            self.access.merge(hits, order)
            if self._gone(e.name) or (live and not (set(hits) | set(order)) & live):
                self._dead.add(e.name)  # its process is gone, or it speaks only of gone units

    def _gone(self, name: str) -> bool:
        """Whether the file's process is a dead one of this host (another host's files age out with
        their units: a file whose units are all gone says nothing)."""
        tag = name[len(PREFIX):-len(SUFFIX)].split("-")
        if len(tag) != 3 or tag[0] != self.table.host or not tag[1].isdigit():
            return False
        return int(tag[1]) == os.getpid() or not process_alive(int(tag[1]))

    def publish(self, *, force: bool = False) -> None:
        """Write this process's view (live units only) when it changed; then remove absorbed dead files."""
        if self.read_only:
            return
        now = time.monotonic()
        if not force and now - self._last < PUBLISH_S:
            return
        self._last = now
        if self.access.version == self._published:
            return
        version = self.access.version
        live = {u.name for u in self.table.live()}
        hits, order = self.access.export(live)
        try:
            if hits or order:
                write_new_file(self.path / self.own, encode(hits, order), self.file_mode)
            else:
                self._remove(self.own)
        except OSError as e:
            self._log_once(f"access-save:{e.errno}", "lifeboat: %s: cannot save retention state: %s", self.path, e)
            return
        self._published = version
        for name in sorted(self._dead):
            self._remove(name)
        self._dead.clear()

    def _remove(self, name: str) -> None:
        try:
            os.unlink(self.path / name)
        except FileNotFoundError:
            pass
        except OSError as e:
            self._log_once(f"access-rm:{e.errno}", "lifeboat: %s: cannot remove %s: %s", self.path, name, e)
