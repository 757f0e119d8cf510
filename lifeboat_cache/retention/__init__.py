"""Retention: which records a full store keeps. Knows nothing of tiers; they ask it what to evict.

  access.py      AccessTable: reads per record since written or kept (capped), queue positions of units
  policy.py      choose(): evict, keep whole or reinsert the unit at the queue's head; RewriteBudget
  verdict.py     judge(): that decision for one unit from its trailer table (which read records are current);
                 keep_whole(), tail_position(): the bookkeeping of a kept unit; offsets_by_unit(): a batch
                 of uses by unit (AccessTable.hit_many); shared by every tier
  ghost.py       Ghost: keys evicted and how long ago; a page back after a long absence is cache-averse
  state_file.py  the AccessTable on disk (one file per process, merged by the others): encode / decode
"""

from __future__ import annotations

from .access import HEAD, HIT_CAP, KEEP_PLACE, AccessTable
from .ghost import GHOST_SPAN, HISTORY_SPAN, Ghost
from .policy import (
    COUNTERS as RETENTION_COUNTERS, EVICT, KEEP, KEEP_WHOLE_SHARE, REINSERT, REWRITE_SHARE, RewriteBudget, choose)
from .state_file import MAX_BYTES as STATE_MAX_BYTES, decode, encode
from .verdict import Row, gone_keys, judge, keep_whole, offsets_by_unit, tail_position

__all__ = [
    "EVICT", "GHOST_SPAN", "HEAD", "HISTORY_SPAN", "HIT_CAP", "KEEP", "KEEP_PLACE", "KEEP_WHOLE_SHARE", "REINSERT",
    "RETENTION_COUNTERS", "REWRITE_SHARE", "STATE_MAX_BYTES", "AccessTable", "Ghost", "RewriteBudget", "Row",
    "choose", "decode", "encode", "gone_keys", "judge", "keep_whole", "offsets_by_unit", "tail_position",
]
