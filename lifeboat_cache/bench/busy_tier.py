"""Reads and puts while a process backs up pages, per tier kind: what a busy store makes a read wait for.

One ChunkStore per tier kind (`busy_tier_kinds`: local, and nfs on a local directory, where every seal
`fdatasync`s and `seal_after_s` seals each open segment every 2 s, as on a filer). A backup thread puts
`busy_tier_pages` pages of 768 KiB at `busy_tier_mb_s`; the main thread reads the same 8 stored pages
every 10 ms. Per kind: read and put latency p50 / p99 / worst and the reads over 50 ms. Each read and
write of a segment directory takes its lock, so a round trip to the filer made under it (a seal's
commit, a create, a heartbeat) shows here as a read that waits (docs/storage.md, NFS).
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from .common import log
from .index_common import percentiles_ms
from .sizes import Sizes, names

PAGE_BYTES = 768 << 10  # one 64-token page of the small shape (24 layers x 2 KV heads x 64, bf16)
HOT_PAGES = 8
READ_PERIOD_S = 0.01


def measure(kind: str, path: Path, sizes: Sizes, seconds: float) -> dict[str, Any]:
    from .. import ChunkStore, namespace_fingerprint
    from ..config import settings_from_dict

    tier = {"type": kind, "path": str(path), "compression": "none", "segment_size": sizes.busy_tier_segment}
    st = ChunkStore.open(settings_from_dict({"storage": [tier]}))
    ns = namespace_fingerprint(model="busy-tier")
    rng = np.random.default_rng(1)
    hot = [f"hot-{i}" for i in range(HOT_PAGES)]
    backup = [rng.integers(0, 256, PAGE_BYTES, dtype=np.uint8) for _ in range(sizes.busy_tier_pages)]
    puts: list[float] = []
    failed = [0]
    stop = threading.Event()

    def backups() -> None:
        n, t0 = 0, time.monotonic()
        while not stop.is_set():
            t = time.perf_counter()
            ok = st.put(ns, [f"b{n}-{i}" for i in range(len(backup))], backup)
            puts.append(time.perf_counter() - t)
            failed[0] += len(ok) - sum(ok)
            n += 1
            due = t0 + n * len(backup) * PAGE_BYTES / (sizes.busy_tier_mb_s * 1e6)
            stop.wait(max(0.0, due - time.monotonic()))

    try:
        st.wait_rebuilt()
        if not all(st.put(ns, hot, [rng.integers(0, 256, PAGE_BYTES, dtype=np.uint8) for _ in hot])):
            raise RuntimeError(f"{kind}: the pages to read back were not stored")
        st.flush()
        out = [np.empty(PAGE_BYTES, np.uint8) for _ in hot]
        reads: list[float] = []
        misses = 0
        th = threading.Thread(target=backups, name="bench-backups", daemon=True)
        th.start()
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end:
            t = time.perf_counter()
            misses += HOT_PAGES - sum(st.get_into(ns, hot, out))
            reads.append(time.perf_counter() - t)
            time.sleep(READ_PERIOD_S)
        stop.set()
        th.join(60)
    finally:
        stop.set()
        st.close()
    return {"kind": kind, "reads": len(reads), "read_ms": percentiles_ms(reads or [0.0]),
            "reads_over_50ms": int(sum(r > 0.05 for r in reads)), "read_misses": misses,
            "puts": len(puts), "put_ms": percentiles_ms(puts or [0.0]), "pages_not_stored": failed[0]}


KINDS = ("local", "nfs")  # the segment-directory tiers (an S3 tier has no directory lock)


def run(work: Path, sizes: Sizes, quick: bool = False) -> dict[str, Any]:
    seconds = 2.0 if quick else float(sizes.busy_tier_s)
    kinds = names(sizes.busy_tier_kinds)
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ValueError(f"busy_tier_kinds: {','.join(bad) or '(empty)'}: choose from {', '.join(KINDS)}")
    rows = []
    for kind in kinds:
        path = work / f"busy-{kind}"
        path.mkdir(parents=True, exist_ok=True)
        try:
            rows.append(measure(kind, path, sizes, seconds))
        finally:
            shutil.rmtree(path, ignore_errors=True)
        r = rows[-1]
        log.info("busy tier %s: read p99 %.1f ms (worst %.1f), put p99 %.1f ms", kind, r["read_ms"]["p99"],
                 r["read_ms"]["max"], r["put_ms"]["p99"])
    return {"seconds": seconds, "page_bytes": PAGE_BYTES, "read_pages": HOT_PAGES,
            "read_period_ms": READ_PERIOD_S * 1000, "backup_mb_s": sizes.busy_tier_mb_s,
            "pages_per_put": sizes.busy_tier_pages, "segment_size": sizes.busy_tier_segment, "rows": rows}
