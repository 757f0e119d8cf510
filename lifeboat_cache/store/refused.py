"""Pages a tier holds that this process will not serve: `exists` must not count them.

Why: an index entry says a record is there, not that this process can open it. A page sealed with a
key this process does not hold (another key, one dropped by rotation), or plaintext where sealed
records are required, was counted by `batch_exists`: SGLang was told the pages were cached, scheduled
their prefetch, and every read missed. The read path reports every such record here (the miss
reasons that leave a record in place: records/sealing.py OPENABLE_REASONS), per tier, and
`contains` / `count_leading_hits` / `put`'s already-stored check leave them out, so the next
`exists` says no and the next `put` writes the page again, sealed with this process's key (which
takes the key off the set). A bad record (a tag that fails) is dropped from the index instead.

With encryption on, a store that serves also reads the header of every record its local tiers
index when it opens (`audit_keys`, one background thread, 64 bytes per record), so the pages of a
key it does not hold are left out from the start, not only after their first read. Shared tiers
(NFS, S3) are not audited (a request per record), nor tiers of more than AUDIT_MAX_RECORDS pages
(the pass walks a copy of the index): there the first read finds them.

Cost: nothing while a tier's set is empty (one attribute check per tier per call); otherwise one
sorted-array membership test of the call's keys. Bounded to MAX_KEYS per tier (then, logged once,
further records are only misses, as before).
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Iterable, Sequence

import numpy as np

from ..records import Header, Sealer
from ..tiers import SegmentDirs, Tier
from .maint import record_headers

log = logging.getLogger(__name__)

MAX_KEYS = 1 << 20  # per tier: 8 MiB of keys at most
AUDIT_MAX_RECORDS = 2_000_000  # the open's header pass copies the index (24 B a page) to walk it


class Refused:
    """Per tier level: index keys of records this process will not serve. Thread-safe; lookups take
    no lock (they read a published sorted array)."""

    def __init__(self, levels: int) -> None:
        self._lock = threading.Lock()
        self._sets: list[set[int]] = [set() for _ in range(levels)]
        self._arrays: list[np.ndarray | None] = [None] * levels  # sorted copy of each set, None when empty
        self._full_logged = False

    def add(self, level: int, ikey: int) -> None:
        with self._lock:
            s = self._sets[level]
            if ikey in s:
                return
            if len(s) >= MAX_KEYS:
                if not self._full_logged:
                    self._full_logged = True
                    log.warning("lifeboat: %d pages of tier %d are not for this process (key not held); "
                                "more are not tracked", len(s), level)
                return
            s.add(ikey)
            self._publish(level)

    def discard(self, level: int, ikeys: Iterable[int]) -> None:
        """Keys this process has just written to that tier (its own records now)."""
        if self._arrays[level] is None:
            return
        with self._lock:
            s = self._sets[level]
            before = len(s)
            s.difference_update(int(k) for k in ikeys)
            if len(s) != before:
                self._publish(level)

    def _publish(self, level: int) -> None:
        s = self._sets[level]
        self._arrays[level] = np.sort(np.fromiter(s, np.int64, len(s))) if s else None

    def mask(self, level: int, ikeys: np.ndarray) -> np.ndarray | None:
        """Per key: refused on that tier; None (nothing to leave out) while the tier's set is empty."""
        arr = self._arrays[level]
        if arr is None:
            return None
        pos = np.minimum(np.searchsorted(arr, ikeys), len(arr) - 1)
        return arr[pos] == ikeys

    def count(self, level: int) -> int:
        return len(self._sets[level])


def serves(sealer: Sealer, h: Header) -> bool:
    """Whether this store opens a record of this header (by its key id; the tag is checked on read)."""
    if not h.sealed:
        return not sealer.require_sealed
    return sealer.keyring is not None and h.key_id in sealer.keyring.serving


def audit_keys(tiers: Sequence[Tier], sealer: Sealer, refused: Refused, stop: Callable[[], bool]) -> int:
    """Add every indexed record of the local tiers that this store will not open to `refused` (the
    header of each read once; the index rebuild waited for). Returns how many; stops when `stop()`."""
    n = 0
    for level, tier in enumerate(tiers):
        if tier.shared or not isinstance(tier, SegmentDirs):
            continue
        while not tier.wait_rebuilt(1.0):
            if stop():
                return n
        if sum(len(d.index) for d in tier.dirs) > AUDIT_MAX_RECORDS:  # its index is copied to be walked
            log.info("lifeboat: %s holds more than %d pages: pages of keys this process does not hold are "
                     "found by their first read", tier.name, AUDIT_MAX_RECORDS)
            continue
        for ikey, _, h in record_headers(tier):
            if stop():
                return n
            if h is not None and not serves(sealer, h):
                refused.add(level, ikey)
                n += 1
    if n:
        log.info("lifeboat: %d indexed page(s) are sealed with a key this process does not hold: not counted "
                 "by exists", n)
    return n
