"""The retention policy: what to do with the unit at the head of the eviction queue, and its cost bound.

The store is log-structured, so eviction frees whole units (segments, S3 objects), oldest first, as
CacheLib's Navy frees regions. Before a unit goes, its records that were read since they were written
(AccessTable) are kept, Navy's hits-based reinsertion; the queue is a CLOCK over units whose hand lowers
each kept record's count, so only what is read again stays (an approximation of LRU that also weighs
how often a record was read, see docs/storage.md "Retention"):

- no record was read: the unit is evicted (one-off pages go first, at no cost);
- at least KEEP_WHOLE_SHARE of its bytes were read: the unit is kept whole and goes to the tail of the
  queue (no byte rewritten: a unit of a returning user's prefix stays where it is);
- otherwise its read records are rewritten at the tail (reinsertion), then the unit is evicted, as long
  as the rewrite budget allows; past the budget it is evicted as it is.

The rewrite budget caps write amplification: bytes rewritten stay within `share` of the bytes callers
wrote since open, plus one unit of slack (counted and reported as `retention_rewritten_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass

KEEP_WHOLE_SHARE = 0.75
REWRITE_SHARE = 0.5

#: What a tier reports of the policy (per tier in `stats`, summed over serving processes by `lifeboat stats`).
COUNTERS = ("evicted_unread_records", "retention_kept_segments", "retention_kept_records",
            "retention_reinserted_records", "retention_rewritten_bytes", "retention_over_budget_records")

EVICT = "evict"
KEEP = "keep"
REINSERT = "reinsert"


@dataclass
class RewriteBudget:
    """Bytes rewritten to keep read records, bounded by a share of the bytes callers wrote."""

    share: float = REWRITE_SHARE
    slack_bytes: int = 0
    written: int = 0
    rewritten: int = 0

    def wrote(self, n: int) -> None:
        """Callers wrote n bytes (reinsertions are not counted here)."""
        self.written += n

    def allows(self, n: int) -> bool:
        return self.rewritten + n <= self.share * self.written + self.slack_bytes

    def spend(self, n: int) -> None:
        self.rewritten += n


def choose(unit_bytes: int, read_bytes: int, budget: RewriteBudget) -> str:
    """EVICT, KEEP or REINSERT for the unit at the head of the queue (see the module docstring)."""
    if read_bytes <= 0:
        return EVICT
    if read_bytes >= unit_bytes * KEEP_WHOLE_SHARE:
        return KEEP
    return REINSERT if budget.allows(read_bytes) else EVICT
