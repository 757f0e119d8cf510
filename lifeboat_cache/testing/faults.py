"""Fault injection for store-level tests: a tier wrapper that fails or slows on demand.

    tier = FaultyTier(LocalTier(settings).open())
    tier.down()          # every read and write raises OSError(EIO) until tier.up()
    tier.delay_s = 0.2   # every read and write takes 200 ms longer (a slow remote)
    tier.error_rate = 0.1  # one call in ten fails, from a seeded RNG (reproducible)

Index lookups (`contains`, `locate`) never fail: they are in memory for every real tier too.
"""

from __future__ import annotations

import errno
import random
import threading
import time
from collections import Counter
from typing import Any, Iterator, Sequence

import numpy as np

from ..tiers import Ref, Tier


class FaultyTier(Tier):
    """Delegates to `inner`, raising EIO (or sleeping) on reads and writes when told to."""

    def __init__(self, inner: Tier, *, seed: int = 0) -> None:
        self.inner = inner
        self.kind = inner.kind  # type: ignore[misc]
        self.name = f"faulty({inner.name})"
        self.fail_reads = False
        self.fail_writes = False
        self.error_rate = 0.0
        self.delay_s = 0.0
        self.calls: Counter[str] = Counter()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def down(self) -> None:
        self.fail_reads = self.fail_writes = True

    def up(self) -> None:
        self.fail_reads = self.fail_writes = False

    def _enter(self, op: str, failing: bool) -> None:
        with self._lock:
            self.calls[op] += 1
            unlucky = self.error_rate > 0 and self._rng.random() < self.error_rate
        if self.delay_s:
            time.sleep(self.delay_s)
        if failing or unlucky:
            with self._lock:
                self.calls[f"{op}_failed"] += 1
            raise OSError(errno.EIO, f"injected I/O error on {op} ({self.inner.name})")

    # ---- faulty paths
    def write(self, ikey: int, digest: bytes, bufs: Sequence[object], length: int, affinity: int = 0) -> Ref:
        self._enter("write", self.fail_writes)
        return self.inner.write(ikey, digest, bufs, length, affinity)

    def write_many(self, records: Sequence[tuple[int, bytes, Sequence[object], int]],
                   affinity: int = 0) -> list[Ref]:
        self._enter("write", self.fail_writes)
        return self.inner.write_many(records, affinity)

    def read_into(self, ref: Ref, bufs: Sequence[memoryview]) -> bool:
        self._enter("read", self.fail_reads)
        return self.inner.read_into(ref, bufs)

    # ---- plain delegation
    def contains(self, ikeys: np.ndarray) -> np.ndarray:
        return self.inner.contains(ikeys)

    def locate(self, ikey: int) -> Ref | None:
        return self.inner.locate(ikey)

    def forget(self, ikey: int, ref: Ref, reason: str) -> None:
        self.inner.forget(ikey, ref, reason)

    def records(self) -> Iterator[tuple[int, Ref]]:
        return self.inner.records()

    def close(self) -> None:
        self.inner.close()

    def wait_rebuilt(self, timeout: float | None = None) -> bool:
        return self.inner.wait_rebuilt(timeout)

    def flush(self) -> None:
        self.inner.flush()

    def gc(self) -> int:
        return self.inner.gc()

    def usage_bytes(self) -> int:
        return self.inner.usage_bytes()

    def capacity_bytes(self) -> int | None:
        return self.inner.capacity_bytes()

    def stats(self) -> dict[str, Any]:
        return dict(self.inner.stats(), name=self.name, injected=dict(self.calls))
