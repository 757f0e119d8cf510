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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ..background import BoundedWriter, WriterCounters
from ..metrics import Counters
from ..tiers import Tier

if TYPE_CHECKING:
    from ..cooldown import Cooldown

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
    """Copies records to tiers[1:] through one :class:`~lifeboat_cache.background.BoundedWriter`."""

    def __init__(self, tiers: Sequence[Tier], cooldowns: Sequence["Cooldown"], counters: Counters, *,
                 max_bytes: int, workers: int = DEFAULT_COPY_WORKERS, policy: str = "normal",
                 recode: Callable[[int, bytes], bytes | memoryview] | None = None) -> None:
        self.recode = recode  # (tier level, record) -> the record that tier stores (compression rule)
        self.tiers = list(tiers)
        self.cooldowns = list(cooldowns)
        self.counters = counters
        self.max_bytes = max_bytes
        lower = ", ".join(t.name for t in self.tiers[1:])
        self._writer: BoundedWriter[_Item] = BoundedWriter(
            self._copy, counters, max_bytes=max_bytes, workers=workers, name="lifeboat-copy", policy=policy,
            what=f"copies to {lower}", queue="copy", max_batch_jobs=COPY_BATCH_RECORDS,
            max_batch_bytes=COPY_BATCH_BYTES,
            names=WriterCounters(dropped_full="copy_dropped", dropped_full_bytes="copy_dropped_bytes",
                                 dropped_closed="copy_dropped", dropped_closed_bytes="copy_dropped_bytes",
                                 dropped_exit="copy_dropped", errors="copy_errors"),
            drop_note=lambda: f"the pages stay on {self.tiers[0].name}",
            exit_note=f"the pages stay on {self.tiers[0].name}" if self.tiers else "",
            drop_log_interval_s=DROP_LOG_INTERVAL_S)

    @property
    def pending_bytes(self) -> int:
        return self._writer.pending_bytes

    def offer(self, ikey: int, digest: bytes, parts: Sequence[object], length: int, affinity: int) -> bool:
        """Queue a copy of one record; False when it was dropped (queue full, or no tier to take it)."""
        if all(cd.active() for cd in self.cooldowns[1:]):
            self.counters.add("copy_skipped_cooldown")
            return False
        if self._writer.room() < length:  # checked before the snapshot: a full queue costs no copy
            self._writer.drop(1, length, closed=self._writer.closed)
            return False
        record = b"".join(parts)  # type: ignore[arg-type]  # snapshot: the caller reuses its buffers
        if not self._writer.offer(_Item(ikey, digest, record, affinity), length):
            return False
        self.counters.add("copy_queued")
        return True

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
        return self._writer.flush(timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Finish what is queued (up to timeout), then stop; copies still queued are dropped."""
        self._writer.close(timeout)
