"""Helpers the benchmark scripts share: latency percentiles and dropping files from the page cache."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def pct(xs: list[float], digits: int = 3, with_max: bool = True) -> str:
    """p50 / p90 / p99 (/ max) of durations in seconds, printed in milliseconds."""
    a = np.array(xs) * 1e3
    out = "  ".join(f"p{q} {np.percentile(a, q):.{digits}f} ms" for q in (50, 90, 99))
    return f"{out}  max {a.max():.{digits}f} ms" if with_max else out


def drop_page_cache(root: Path) -> None:
    """Write back and evict every file under root from the page cache, so the next reads hit the drive."""
    for path in Path(root).rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
