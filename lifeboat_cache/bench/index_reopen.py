"""Index reopen at scale (`measure_reopen`, a section of `index_scale`): sealed segments of 4,096 pages
with real trailers (sparse files: a reopen reads only trailers and the snapshot), opened afresh after a
clean close (snapshot), with a stale snapshot (10% of the pages in newer segments) and after a crash
(no snapshot): seconds to the first hit among 300 stored keys, to the full index, the process CPU
seconds meanwhile, and the peak resident bytes per page above the RSS before the open (VmHWM).
`make_store` / `open_dir` also build the synthetic stores of the snapshot and rebuild tests."""

from __future__ import annotations

import gc
import os
import time
from typing import Any, Sequence

import numpy as np

from .common import rss_bytes
from .index_common import BATCH, md_table, peak_rss_bytes, reset_peak_rss


PER_UNIT = 4096       # records per synthetic sealed segment in the reopen measurement
REOPEN_POLL_S = 0.001


def make_store(root: str, n: int, first_unit: int = 0, keys: np.ndarray | None = None,
               tails: np.ndarray | None = None, rec: int = 1 << 16) -> np.ndarray:
    """Sealed segments holding n records of `rec` bytes in all: sparse files, real trailers (the index
    is all a reopen reads; no record bytes are needed for it). `keys` / `tails` (digest bytes 8-16,
    "S8"): the records' index keys and digests (default random keys, zero tails). Returns the keys."""
    from ..records import FOOTER, FOOTER_MAGIC, TABLE_ENTRY
    from ..tiers.segments import parse_name
    import struct
    import zlib

    if keys is None:
        rng = np.random.default_rng(n + first_unit)
        keys = rng.integers(-2**63, 2**63 - 1, n, dtype=np.int64)
    for u, a in enumerate(range(0, n, PER_UNIT), first_unit):
        k = keys[a:a + PER_UNIT]
        table = np.zeros(len(k), dtype=TABLE_ENTRY)
        table["key"] = k
        if tails is not None:
            table["digest_tail"] = tails[a:a + PER_UNIT]
        table["offset"] = np.arange(len(k), dtype=np.uint64) * np.uint64(rec)
        table["length"] = table["raw_length"] = rec
        at = len(k) * rec
        blob = b"LBTB" + table.tobytes()
        footer = FOOTER.pack(FOOTER_MAGIC, len(k), at, zlib.crc32(blob))
        name = f"{1700000000000 + u:013d}-benchhost-1-abcdef{u:06d}.seg"
        assert parse_name(name) is not None
        with open(os.path.join(root, name), "wb") as f:
            f.seek(at)
            f.write(blob + footer + struct.pack("<I", zlib.crc32(footer)))
    return keys


def open_dir(root: str) -> Any:
    from ..tiers.segments import DirSettings, SegmentDir

    return SegmentDir(__import__("pathlib").Path(root), DirSettings(capacity_bytes=1 << 62, segment_bytes=1 << 30,
                                                                    refresh_interval_s=3600), evict=False)


def _time_reopen(root: str, probe: np.ndarray, n: int) -> tuple[float, float, float, float, float]:
    """(seconds to the first hit among probe keys, to the full index, process CPU seconds until then,
    peak resident bytes per page above the RSS before the open, process CPU seconds to the first hit)
    of a fresh open: on a shared machine the CPU seconds are the reopen's own cost."""
    gc.collect()
    base = rss_bytes()
    can_peak = reset_peak_rss()
    t0, c0 = time.perf_counter(), time.process_time()
    d = open_dir(root)
    d.open(background=True)
    first = first_cpu = float("nan")
    while True:
        hit = d.index.contains(probe)
        if hit.any() and first != first:
            first, first_cpu = time.perf_counter() - t0, time.process_time() - c0
        if d.rebuilt and hit.all():
            break
        time.sleep(REOPEN_POLL_S)
    full = time.perf_counter() - t0
    cpu = time.process_time() - c0
    peak = (peak_rss_bytes() - base) / n if can_peak else float("nan")
    d.stop_refresh()  # stop its refresh thread; close() would save a snapshot
    return first, full, cpu, peak, first_cpu


def measure_reopen(n: int) -> dict[str, Any]:
    """Reopen of n pages in sealed segments: after a clean close (snapshot), after a crash (no
    snapshot), and with a stale snapshot (10% of the pages in segments written after it)."""
    import shutil
    import tempfile

    from ..tiers.segments import SNAPSHOT_NAME

    root = tempfile.mkdtemp(prefix="lifeboat-reopen-")
    try:
        old = n - n // 10
        keys = make_store(root, old)
        d = open_dir(root)
        d.open(background=False)
        d.close()  # writes the snapshot of the old part
        stale_snap = open(os.path.join(root, SNAPSHOT_NAME), "rb").read()
        keys = np.concatenate([keys, make_store(root, n - old, first_unit=(old + PER_UNIT - 1) // PER_UNIT)])
        probe = keys[np.random.default_rng(1).integers(0, n, BATCH)]
        out: dict[str, Any] = {"pages": n, "units": len([f for f in os.listdir(root) if f.endswith(".seg")])}
        (out["stale_first_hit_s"], out["stale_full_s"], out["stale_cpu_s"], out["stale_peak_B_per_page"],
         out["stale_first_cpu_s"]) = _time_reopen(root, probe, n)
        d = open_dir(root)
        d.open(background=False)
        d.close()  # a fresh snapshot of everything
        out["snapshot_bytes"] = os.path.getsize(os.path.join(root, SNAPSHOT_NAME))
        (out["clean_first_hit_s"], out["clean_full_s"], out["clean_cpu_s"], out["clean_peak_B_per_page"],
         out["clean_first_cpu_s"]) = _time_reopen(root, probe, n)
        os.unlink(os.path.join(root, SNAPSHOT_NAME))
        (out["crash_first_hit_s"], out["crash_full_s"], out["crash_cpu_s"], out["crash_peak_B_per_page"],
         out["crash_first_cpu_s"]) = _time_reopen(root, probe, n)
        del stale_snap
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


REOPEN_COLUMNS = [("pages", "pages", "{:,}"), ("units", "segments", "{:,}"),
                  ("clean_first_hit_s", "clean: first hit s", "{:.3f}"),
                  ("clean_first_cpu_s", "clean: first hit CPU s", "{:.3f}"), ("clean_full_s", "clean: full s", "{:.3f}"),
                  ("clean_cpu_s", "clean: CPU s", "{:.3f}"), ("clean_peak_B_per_page", "clean: peak B/pg", "{:.1f}"),
                  ("stale_first_hit_s", "stale: first hit s", "{:.3f}"), ("stale_full_s", "stale: full s", "{:.3f}"),
                  ("stale_cpu_s", "stale: CPU s", "{:.3f}"),
                  ("crash_first_hit_s", "crash: first hit s", "{:.3f}"), ("crash_full_s", "crash: full s", "{:.3f}"),
                  ("crash_cpu_s", "crash: CPU s", "{:.3f}"), ("crash_peak_B_per_page", "crash: peak B/pg", "{:.1f}")]


def reopen_table(rows: Sequence[dict[str, Any]]) -> str:
    return md_table(REOPEN_COLUMNS, rows)
