"""The in-memory index: key digest -> Loc (unit, offset, length), lock-free lookups, 29 B per page.

Writers add deltas; a background merge folds them into the sorted, sharded main table
(docs/storage.md, "In-memory index").

  digest_index.py  Index: the API (lookups, inserts, drops, merge, export)
  order.py         Loc, key mixing (sort order and shards), vector membership helpers
  arena.py         mmap column arenas, the directory and its lookup window
  deltas.py        recent changes (dicts) turned into sorted columns and overlaid on lookups
  main_table.py    MainTable: the sorted, sharded main part (epochs, regions, drops, grow, publish)
"""

from __future__ import annotations

from .digest_index import Index
from .order import DEAD, MIX_CONSTANT, SHARDS, SHARD_BITS, Loc, mix_keys, shard_of, trim_heap, unmix_keys

__all__ = [
    "DEAD", "Index", "Loc", "MIX_CONSTANT", "SHARDS", "SHARD_BITS", "mix_keys", "shard_of", "trim_heap",
    "unmix_keys",
]
