"""The chunk store: put / get_into / count_leading_hits / contains of pages over the configured tiers.

Nothing here raises into a caller on storage trouble: a failure is a miss or a dropped write,
counted and logged once per cooldown, and every call returns by `engine.deadline_s`.

  chunk_store.py  ChunkStore: the facade (open, put, get_into, contains, stats, verify, close)
  context.py      StoreContext: what the read and write paths share (tiers, cooldowns, calls, counters, sealer)
  write.py        WritePath: group by tier kind, gate, encode, store, queue copies, count
  read.py         ReadPath: first tier, then page by page over the tiers; verify, decode, promote
  calls.py        IoCalls: the io pool, the task arena, the call's deadline, late pages, hung tiers held
  io_workers.py   IoWorkers (elastic, bounded io threads), Gate (late tasks never touch a caller's buffer)
  gc_pauses.py    GcPauses: the deadlines' clock, which stands still while Python's GC stops every thread
  pages.py        PageBlocks, page_view: a page as flat uint8 views of the caller's buffers, no copy
  maint.py        verify both ways, record headers per key id, dropping records
  copier.py       background copy of new records to the lower tiers (on a BoundedWriter)
  seal_marks.py   at open: a sealed store's mark written into each tier, a keyless writer refused
  namespace_names.py  what a Namespace was made of, left in the store as marks (ls / purge --model)
"""

from __future__ import annotations

from .chunk_store import ChunkStore, compresses
from .pages import PageBlocks

__all__ = [
    "ChunkStore", "PageBlocks", "compresses",
]
