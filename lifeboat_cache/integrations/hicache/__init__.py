"""Parts of the HiCache L3 backend (integrations/sglang_backend.py): SGLang's pages as store pages.

  pages.py   HostPool: a host-pool page as numpy views (zero copy), checked once per pool by its block plan
  keys.py    the namespace per host pool and rank; the dialog mark (affinity) from prefix keys
  checks.py  argument checks (keys, whole pages of host slots, page copies): BadCall
  guard.py   never raise into SGLang: `guarded(fallback)` and the "nothing done" answers
  trace.py   the backend's trace lines (engine.trace), one per SGLang call
"""

from __future__ import annotations

from .checks import MAX_CALL_PAGES, BadCall, check_extra_info, check_indices, check_keys, check_pages, count
from .guard import guarded, no_pages, no_transfers
from .keys import dialog_affinity, pool_namespace
from .pages import INT_OF_WIDTH, HostPool, as_numpy, page_tensors
from .trace import TRACE_LINES

__all__ = [
    "BadCall", "HostPool", "INT_OF_WIDTH", "MAX_CALL_PAGES", "TRACE_LINES", "as_numpy", "check_extra_info",
    "check_indices", "check_keys", "check_pages", "count", "dialog_affinity", "guarded", "no_pages", "no_transfers",
    "page_tensors", "pool_namespace",
]
