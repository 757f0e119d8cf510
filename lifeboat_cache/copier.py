"""Background copy of new records from the first tier to the tiers behind it (NVMe -> NFS / S3).

`put` returns once a page is on the first tier; the copier then writes it to every lower tier from
a few daemon threads. The queue is bounded in bytes (`engine.copy_queue_size`): when it is full
the copy is dropped, counted (`copy_dropped`) and logged at most once a minute, so a slow or dead
remote tier never blocks SGLang. Each record is snapshotted (one copy) when queued, because the
page buffers belong to the caller and are reused as soon as `put` returns. A batch taken from the
queue is written with `Tier.write_many` (one object per batch on S3). A lower tier in its write
cooldown is skipped (`copy_skipped_cooldown`); a failed copy counts `copy_errors` and starts the
cooldown, which reads share, so a dead tier is skipped by both. A copy never has a deadline (it is
off SGLang's path); its S3 requests use the tier's configured timeouts, and a tier held after a missed
deadline (see store.py) is skipped like one in cooldown.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from .metrics import Counters
from .tiers import Tier

if TYPE_CHECKING:
    from .cooldown import Cooldown

log = logging.getLogger(__name__)

DEFAULT_COPY_WORKERS = 4
COPY_BATCH_BYTES = 16 << 20  # one S3 object holds at most this much (or one larger record)
COPY_BATCH_RECORDS = 64
DROP_LOG_INTERVAL_S = 60.0


@dataclass(frozen=True, slots=True)
class _Item:
    ikey: int
    digest: bytes
    record: bytes
    affinity: int


class Copier:
    """Bounded queue + worker threads that copy records to tiers[1:]."""

    def __init__(self, tiers: Sequence[Tier], cooldowns: Sequence["Cooldown"], counters: Counters, *,
                 max_bytes: int, workers: int = DEFAULT_COPY_WORKERS,
                 recode: Callable[[int, bytes], bytes | memoryview] | None = None) -> None:
        self.recode = recode  # (tier level, record) -> the record that tier stores (compression rule)
        self.tiers = list(tiers)
        self.cooldowns = list(cooldowns)
        self.counters = counters
        self.max_bytes = max_bytes
        self._q: deque[_Item] = deque()
        self._pending = 0  # bytes queued or being written
        self._busy = 0
        self._stop = False
        self._cv = threading.Condition()
        self._last_drop_log = -DROP_LOG_INTERVAL_S
        self._threads = [threading.Thread(target=self._run, name=f"lifeboat-copy-{i}", daemon=True)
                         for i in range(max(1, workers))]
        for t in self._threads:
            t.start()

    @property
    def pending_bytes(self) -> int:
        return self._pending

    def offer(self, ikey: int, digest: bytes, parts: Sequence[object], length: int, affinity: int) -> bool:
        """Queue a copy of one record; False when it was dropped (queue full, or no tier to take it)."""
        if all(cd.active() for cd in self.cooldowns[1:]):
            self.counters.add("copy_skipped_cooldown")
            return False
        if self._stop or self._pending + length > self.max_bytes:
            self._dropped(length)
            return False
        record = b"".join(parts)  # type: ignore[arg-type]  # snapshot: the caller reuses its buffers
        with self._cv:
            if self._stop or self._pending + length > self.max_bytes:
                full = True
            else:
                full = False
                self._q.append(_Item(ikey, digest, record, affinity))
                self._pending += length
                self._cv.notify()
        if full:
            self._dropped(length)
            return False
        self.counters.add("copy_queued")
        return True

    def _dropped(self, length: int) -> None:
        self.counters.add("copy_dropped")
        self.counters.add("copy_dropped_bytes", length)
        now = time.monotonic()
        if now - self._last_drop_log >= DROP_LOG_INTERVAL_S:
            self._last_drop_log = now
            log.warning("lifeboat: copy queue full (%d of %d MiB queued): dropping copies to %s "
                        "(%d dropped so far); the pages stay on %s", self._pending >> 20, self.max_bytes >> 20,
                        ", ".join(t.name for t in self.tiers[1:]), self.counters.get("copy_dropped"),
                        self.tiers[0].name)

    def _take(self) -> list[_Item] | None:
        with self._cv:
            while not self._q and not self._stop:
                self._cv.wait()
            if not self._q:
                return None
            batch = [self._q.popleft()]
            size = len(batch[0].record)
            while self._q and len(batch) < COPY_BATCH_RECORDS and size + len(self._q[0].record) <= COPY_BATCH_BYTES:
                item = self._q.popleft()
                batch.append(item)
                size += len(item.record)
            self._busy += 1
            return batch

    def _run(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            try:
                self._copy(batch)
            except Exception:  # a bug must not kill the thread: the queue would fill for good
                log.exception("lifeboat: background copy failed")
                self.counters.add("copy_errors", len(batch))
            finally:
                with self._cv:
                    self._pending -= sum(len(it.record) for it in batch)
                    self._busy -= 1
                    self._cv.notify_all()

    def _copy(self, batch: list[_Item]) -> None:
        for level, (tier, cd) in enumerate(zip(self.tiers[1:], self.cooldowns[1:]), 1):
            if cd.active():
                self.counters.add("copy_skipped_cooldown", len(batch))
                continue
            present = tier.contains(np.array([it.ikey for it in batch], dtype=np.int64))
            groups: dict[int, list[_Item]] = {}
            for it, p in zip(batch, present.tolist()):
                if not p:
                    groups.setdefault(it.affinity, []).append(it)
            done = 0
            try:
                for affinity, group in groups.items():
                    recs = [(it.ikey, it.digest, [r], len(r)) for it, r in
                            ((it, it.record if self.recode is None else self.recode(level, it.record)) for it in group)]
                    if tier.batch_writes:  # S3: the background client's timeouts,
                        tier.write_many(recs, affinity, background=True)  # not the data path's
                    else:
                        tier.write_many(recs, affinity)
                    done += len(group)
            except OSError as e:
                self.counters.add("copy_errors", sum(map(len, groups.values())) - done)
                cd.fail("background copy", e)
            else:
                cd.ok()
            self.counters.add("copies", done)

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every queued copy is written (or dropped); False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while self._q or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def close(self, timeout: float = 30.0) -> None:
        """Finish what is queued (up to timeout), then stop; copies still queued are dropped."""
        self.drain(timeout)
        with self._cv:
            self._stop = True
            left = len(self._q)
            self._pending -= sum(len(it.record) for it in self._q)
            self._q.clear()
            self._cv.notify_all()
        if left:
            self.counters.add("copy_dropped", left)
            log.warning("lifeboat: closing with %d copies not written to %s", left,
                        ", ".join(t.name for t in self.tiers[1:]))
        for t in self._threads:
            t.join(timeout=5)
