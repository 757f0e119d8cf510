"""The index thread of a segment directory: the initial rebuild, then refreshes until close.

The rebuild loads the quarantine list and the snapshot (fast first hits), then scans what is newer,
in batched inserts. Afterwards the thread lists the directory every `refresh_interval_s` (other
writers' new segments, purge rules, time seals, periodic snapshots) and, between refreshes, polls the
change counter (changes.py) so pages written by other processes of this host are indexed within ms.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from ...index import Index, trim_heap
from ...metrics import Counters
from .changes import ChangeCounter
from .eviction import SharingPolicy
from .quarantine import Quarantine
from .rebuild import Scanner
from .snapshot_policy import Snapshots

log = logging.getLogger(__name__)

CHANGE_POLL_S = 0.005  # how often the index thread reads the change counter (one pread) while busy
CHANGE_POLL_IDLE_S = 0.02  # ... and after a second without another process's change (idle CPU: ~0.2% of a core
#                            per directory); a change is still caught up at this pace (ours may hide theirs)


class IndexThread:
    """Rebuilds and refreshes one directory's index; `closed` stops it. `periodic` runs on each refresh
    (time seals); the sharing policy's heartbeat runs on every wake-up."""

    def __init__(self, name: str, index: Index, counters: Counters, scanner: Scanner, snapshots: Snapshots,
                 quarantine: Quarantine, sharing: SharingPolicy, changes: ChangeCounter | None, *,
                 refresh_interval_s: float, read_only: bool, closed: threading.Event,
                 periodic: Callable[[], None]) -> None:
        self.name, self.index, self.counters = name, index, counters
        self.scanner, self.snapshots, self.quarantine, self.sharing = scanner, snapshots, quarantine, sharing
        self.changes = changes
        self.refresh_interval_s, self.read_only = refresh_interval_s, read_only
        self.closed, self._periodic = closed, periodic
        self.rebuilt = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen_changes = (0, 0)
        self._last_change = 0.0  # monotonic time the counter last changed (the poll speeds up)

    def start(self, background: bool = True) -> None:
        """Start the thread; with background=False the initial rebuild runs here first."""
        self._thread = threading.Thread(target=self._run, name=f"lifeboat-{self.name}-index", daemon=True)
        if not background:
            self.rebuild()
        self._thread.start()

    def join(self, timeout: float) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=timeout)

    def rebuild(self) -> None:
        t0 = time.perf_counter()
        self.scanner.begin_batching()
        try:
            self.quarantine.load()
            self.snapshots.load()
            self.scanner.refresh(initial=True)
        except Exception:  # never let the index thread die on a bad directory
            log.exception("lifeboat: initial index rebuild of %s failed", self.scanner.path)
        finally:
            self.scanner.end_batching()
        self.counters.set("rebuild_ms", int((time.perf_counter() - t0) * 1000))
        self.rebuilt.set()
        trim_heap()  # the rebuild's freed batches (10M pages, crash reopen: 38 -> 27 B/page resident)
        log.info("lifeboat: %s index rebuilt: %d pages in %d ms", self.scanner.path, len(self.index),
                 self.counters["rebuild_ms"])

    def _run(self) -> None:
        if not self.rebuilt.is_set():
            self.rebuild()
        polling = self.changes is not None and self.changes.active and not self.read_only
        next_refresh = time.monotonic() + self.refresh_interval_s
        wait = CHANGE_POLL_S if polling else self.refresh_interval_s
        while not self.closed.wait(wait):
            try:
                if time.monotonic() >= next_refresh:
                    if polling:
                        self._seen_changes = self.changes.read()  # type: ignore[union-attr]
                    self.scanner.refresh(initial=False)
                    self._periodic()
                    self.snapshots.maybe_save()
                    next_refresh = time.monotonic() + self.refresh_interval_s
                elif polling:
                    self._catch_up()
                self.sharing.heartbeat()
            except Exception:
                log.exception("lifeboat: index refresh of %s failed", self.scanner.path)
            now = time.monotonic()
            left = max(0.0, next_refresh - now)
            poll = CHANGE_POLL_S if now - self._last_change < 1.0 else CHANGE_POLL_IDLE_S
            wait = min(poll, left) if polling else left

    def _catch_up(self) -> None:
        """Index what other processes of this host wrote since the counter last changed.

        A changed segments word (a segment created or sealed) costs one listing; a changed writes word
        only rescans the open segments of other processes already known, reading their new bytes.
        """
        now = self.changes.read() if self.changes is not None else (0, 0)
        if now == self._seen_changes:
            return
        listing = now[1] != self._seen_changes[1]
        if not self.changes.only_mine(now, self._seen_changes):  # type: ignore[union-attr]
            # another process wrote: poll at the busy pace. This process's own writes (indexed as they are
            # written) do not speed the poll up: each wake-up takes the GIL from SGLang's threads, 200 a
            # second while a server backs up pages (docs/perf/serving.md, "interference")
            self._last_change = time.monotonic()
        self._seen_changes = now  # before scanning: a change during the scan is seen next time
        self.counters.add("change_catch_ups")
        if listing:
            self.scanner.refresh(initial=False)
            return
        self.scanner.rescan_open(self.sharing.catches_up)
