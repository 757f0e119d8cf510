"""The purge rules a segment directory enforces: `purge.list` plus the tier's `max_age`.

Why here, apart from gc: the read path refuses a purged record (`PurgeFilter.blocks`) and the index
sweep and `lifeboat gc`'s compaction drop them; all three use this one filter, and the read path
never imports gc. Every process reloads the list on its index refresh (a stat while unchanged).
"""

from __future__ import annotations

import logging
import os
import time

from ...fsio import ForeignFile
from ...records import PURGE_NAME, PurgeRules, load_rules

log = logging.getLogger(__name__)


class PurgeFilter:
    """One directory's purge rules plus its `max_age`, reloaded when `purge.list` changes."""

    def __init__(self, path: os.PathLike[str] | str, max_age_s: float | None = None) -> None:
        self.path = os.fspath(path)
        self.max_age_s = max_age_s
        self.rules = PurgeRules()
        self._stamp: tuple[int, int, int] | None = None
        self.swept: dict[int, tuple[int, bool]] = {}  # unit id -> (size, sealed) at its last sweep
        self.purged_pages = 0
        self.evicted_aged = 0
        self.bad_lines = 0
        self.reload()  # before any read: a process opening with a background rebuild never serves purged pages

    def reload(self) -> bool:
        """Re-read purge.list if it changed (stat only otherwise). Returns True when rules changed."""
        try:
            st = os.stat(os.path.join(self.path, PURGE_NAME), follow_symlinks=False)
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            stamp = None
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            rules, bad = load_rules(self.path)
        except (OSError, ForeignFile) as e:
            log.warning("lifeboat: cannot read %s in %s: %s (keeping the previous rules)", PURGE_NAME, self.path, e)
            return False
        self.bad_lines = bad
        if rules == self.rules:
            return False
        self.rules = rules
        self.swept.clear()
        return True

    @property
    def active(self) -> bool:
        return bool(self.rules.namespaces) or self.rules.age_before_ms > 0 or self.max_age_s is not None

    def age_cutoff_ms(self, now: float | None = None) -> int:
        """Segments created before this (ms) hold only purged or expired records."""
        cut = self.rules.age_before_ms
        if self.max_age_s is not None:
            cut = max(cut, int(((time.time() if now is None else now) - self.max_age_s) * 1000))
        return cut

    def blocks(self, seg_ms: int, ns: bytes) -> bool:
        """Whether a record of namespace ns in a segment created at seg_ms must not be served."""
        if seg_ms < self.age_cutoff_ms():
            return True
        before = self.rules.namespaces.get(bytes(ns))
        return before is not None and seg_ms < before
