"""Time this process spent stopped in Python's cyclic garbage collector, for the call deadlines.

A full collection holds the GIL for its whole length: every thread of the process, the io threads
included, stands still. In a server whose heap holds a million objects (torch, SGLang) one takes a
second or more on a small host (SGLang logs "LONG GARBAGE COLLECTION DETECTED" and offers
`freeze_gc`). Without this clock a call's deadline ran on through such a pause: pages of a healthy
tier came back as misses and the tier was held as if it had hung (scratch probe: a 1 s deadline, four
reads of 512 pages each with a 0.6-1.4 s collection started in another thread mid-read; two runs
missed 384 and 1,024 of 2,048 pages before, none since). A call's deadline is set and waited for on
`GcPauses.clock`, which stands still during collections.

Collections belong to the process, not to a store: every store of a process shares one `GcPauses`
(`process_pauses`), so there is one collector callback however many stores are open (or were left
unclosed), each a Python call at every collection's start and stop.
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any


class GcPauses:
    """Seconds spent in collections since `start` (`total`) and a clock without them."""

    def __init__(self) -> None:
        self.total = 0.0
        self._began: float | None = None

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        # called from the collecting thread; collections never overlap, so one writer at a time. A reader
        # between the two stores below sees the clock a pause behind for a moment: a longer wait, no miss
        if phase == "start":
            self._began = time.monotonic()
        elif self._began is not None:
            self.total += time.monotonic() - self._began
            self._began = None

    def clock(self) -> float:
        """time.monotonic, less the time spent in collections since `start`; it stands still during one.
        (A collection that frees cyclic garbage runs finalizers, which can let another thread run for a
        moment: a caller that wakes then must not see its deadline passed.)"""
        began = self._began
        return (time.monotonic() if began is None else began) - self.total

    def start(self) -> "GcPauses":
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)
        return self


_process: GcPauses | None = None
_process_lock = threading.Lock()


def process_pauses() -> GcPauses:
    """This process's GcPauses, started on first use and kept for the process's life."""
    global _process
    with _process_lock:
        if _process is None:
            _process = GcPauses().start()
        return _process


__all__ = ["GcPauses", "process_pauses"]
