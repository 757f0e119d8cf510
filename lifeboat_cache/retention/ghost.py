"""Ghost: which pages were evicted, and how long ago, so a page written again after a long absence
is known to be cache-averse (its reuse distance is longer than the store).

When a page evicted long ago (more than GHOST_SPAN x the records held evictions back) is written
again, keeping it at the tail would evict pages that come back sooner: its unit goes to the head of
the queue instead, and survives only if it is read before the next pass (then CLOCK keeps it as any
read unit). A page evicted recently (it just missed the cut) or never seen goes to the tail as usual.
This is reuse-distance prediction (Hawkeye, SHiP) with S3-FIFO's ghost list, per page key; it helps
skewed traffic (Zipf) where one-off visits of cold documents push out popular ones, and leaves chat
prefixes (whose pages come back within the ghost) as they were (docs/storage.md, "Retention").

Bounded: a direct-mapped table of keys and eviction counts (16 bytes a slot, 2 x HISTORY_SPAN slots per
record held, at most MAX_SLOTS); a collision forgets the older page, which then counts as never seen (the safe
side: a page goes to the tail). A hint only: a wrong guess costs a miss, never a wrong page.
"""

from __future__ import annotations

import threading
from typing import Iterable

import numpy as np

GHOST_SPAN = 4  # evicted within this many x the records held: it just missed the cut, not averse
HISTORY_SPAN = 8  # the table has 2 x this many slots per record held: how many evicted keys it recalls
MIN_SLOTS = 1 << 10
MAX_SLOTS = 1 << 21  # 32 MiB at most


class Ghost:
    """Evicted page keys with the eviction count at which each went (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys = np.zeros(MIN_SLOTS, np.int64)
        self._seqs = np.zeros(MIN_SLOTS, np.int64)  # 0: empty slot
        self.evictions = 0

    def evicted(self, keys: Iterable[int], held: int) -> None:
        """These pages' records were evicted; `held`: records the store holds now (sizes the history)."""
        ks = np.fromiter(keys, np.int64)
        if not len(ks):
            return
        with self._lock:
            self._grow(held)
            seqs = self.evictions + 1 + np.arange(len(ks), dtype=np.int64)
            self.evictions += len(ks)
            slots = ks & (len(self._keys) - 1)
            self._keys[slots], self._seqs[slots] = ks, seqs

    def averse(self, key: int, held: int) -> bool:
        """Whether a page written now was evicted long ago: more than GHOST_SPAN x `held` evictions back
        (and still recalled). Forgets it (a page is judged once per return)."""
        with self._lock:
            slot = key & (len(self._keys) - 1)
            if self._keys[slot] != key or not self._seqs[slot]:
                return False
            ago = self.evictions - int(self._seqs[slot])
            self._seqs[slot] = 0
            return ago > GHOST_SPAN * max(1, held)

    def _grow(self, held: int) -> None:
        want = min(MAX_SLOTS, max(MIN_SLOTS, 1 << int(2 * HISTORY_SPAN * max(1, held) - 1).bit_length()))
        if want <= len(self._keys):
            return
        keys, seqs = np.zeros(want, np.int64), np.zeros(want, np.int64)
        live = self._seqs > 0
        order = np.argsort(self._seqs[live])  # older first, so a collision keeps the newer
        k, s = self._keys[live][order], self._seqs[live][order]
        keys[k & (want - 1)], seqs[k & (want - 1)] = k, s
        self._keys, self._seqs = keys, seqs
