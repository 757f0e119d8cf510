"""Retention in a full store: returning pages served against capacity, LifeboatCache beside SGLang's `file`.

Both backends are made by SGLang 0.5.23's own StorageBackendFactory over a real host pool and given
the same capacity (LifeboatCache `capacity:`, `file` its `max_size`, which turns on its LRU evictor).
Each request of a trace goes as HiCache sends it: `batch_exists` counts the stored prefix, `batch_get_v1`
reads it, and the pages from the first miss on are written back with `batch_set_v1` (a recompute).
An exact LRU and Belady's optimum, computed offline from the same trace under the same prefix rule,
bound what a policy can do. Hit rate = pages served / pages asked for that were asked for before.
Bytes written are the bytes the process passed to write calls during the run (/proc/self/io wchar).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from . import retention_traces as traces
from .common import log
from .sizes import Sizes
from .sglang_vs_file import BACKEND, PAGE_TOKENS, Controller, pools

HOT_ROUNDS = 40  # the case: 24 hot + 24 one-off pages a round, capacity 96 pages of 128 KiB
FRACTIONS = (0.1, 0.25, 0.5, 0.75, 1.0)
SIDES = ("lifeboat", "file")


def _wchar() -> int:
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("wchar:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def trace_set(quick: bool) -> dict[str, list[traces.Request]]:
    """The four traces of the section (a quick run: shorter ones of the same shape)."""
    k = 3 if quick else 1
    return {"hot_set": traces.hot_set(HOT_ROUNDS // k),
            "zipf": traces.zipf(200 // k, 4, 1500 // k),
            "multi_turn": traces.multi_turn(60 // k, 8, 2, active=24 // k),
            "round_robin": traces.round_robin(48 // k, 4, 4, 3)}


class Side:
    """One backend through SGLang's factory on a host pool with room for the longest request."""

    def __init__(self, side: str, path: Path, capacity_bytes: int, shape: tuple[int, int, int], slots: int) -> None:
        self.side, self.path, self.capacity_bytes, self.shape, self.slots = side, path, capacity_bytes, shape, slots
        self.dev, self.host = pools("page_first", *shape, slots * PAGE_TOKENS)
        self.slots = self.host.alloc(slots * PAGE_TOKENS)
        self.ctl: Controller | None = None
        self.open()

    def open(self) -> None:
        import os

        if self.side == "file":
            os.environ.pop("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", None)
            extra: dict[str, Any] = {"file_storage_path": str(self.path), "max_size": str(self.capacity_bytes)}
            self.ctl = Controller(self.dev, self.host, "file", extra)
        else:
            extra = {**BACKEND, "storage": [{"type": "local", "path": str(self.path),
                                             "capacity": f"{self.capacity_bytes}B"}]}
            self.ctl = Controller(self.dev, self.host, "dynamic", extra)
            self.ctl.backend.store.wait_rebuilt()

    def restart(self) -> None:
        """A clean restart: close the backend, open a new one on the same directory."""
        assert self.ctl is not None
        self.ctl.close_backend()
        self.ctl.detach()
        self.open()

    def request(self, keys: list[str]) -> int:
        """One request as HiCache sends it (the controller's own page get / set functions); returns the
        pages served from storage."""
        from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorageExtraInfo
        from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import PrefetchOperation

        assert self.ctl is not None
        ctl = self.ctl.ctl
        n = ctl.storage_backend.batch_exists(keys, HiCacheStorageExtraInfo(prefix_keys=None))
        got = 0
        if n:
            op = PrefetchOperation(CacheRequestHandle(rid="retention", attempt_id=0), [])
            got = ctl.page_get_func(op, keys[:n], self.slots[: n * PAGE_TOKENS],
                                    HiCacheStorageExtraInfo(prefix_keys=None))
        rest = keys[got:]
        if rest:
            ctl.page_set_func(rest, self.slots[: len(rest) * PAGE_TOKENS],
                              HiCacheStorageExtraInfo(prefix_keys=keys[:got]))
        return got

    def close(self) -> None:
        if self.ctl is not None:
            self.ctl.close_backend()
            self.ctl.detach()
            self.ctl = None


def run_side(side: str, path: Path, trace: list[traces.Request], capacity_pages: int, shape: tuple[int, int, int],
             page_bytes: int, restart_at: int | None = None) -> dict[str, Any]:
    """Replay a trace on one backend; `restart_at`: request index of a clean restart."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    slots = max(len(r) for r in trace)
    s = Side(side, path, capacity_pages * page_bytes, shape, slots)
    seen: set[int] = set()
    hits = returning = hits_after = returning_after = 0
    w0, t0 = _wchar(), time.perf_counter()
    try:
        for i, req in enumerate(trace):
            if restart_at is not None and i == restart_at:
                s.restart()
            back = sum(p in seen for p in req)
            got = s.request([f"p{p}" for p in req])
            hits += got
            returning += back
            if restart_at is not None and i >= restart_at:
                hits_after += got
                returning_after += back
            seen.update(req)
        stats = s.ctl.backend.store.stats() if side == "lifeboat" and s.ctl is not None else {}
    finally:
        s.close()
    out: dict[str, Any] = {"hits": hits, "returning": returning, "hit_rate": hits / returning if returning else 0.0,
                           "written_bytes": _wchar() - w0, "seconds": time.perf_counter() - t0}
    if restart_at is not None:
        out["hit_rate_after_restart"] = hits_after / returning_after if returning_after else 0.0
    if stats:
        out["policy"] = {k: sum(t.get(k, 0) for t in stats.get("tiers", [])) for k in (
            "evicted_segments", "evicted_unread_records", "retention_kept_segments", "retention_kept_records",
            "retention_reinserted_records", "retention_rewritten_bytes", "retention_over_budget_records")}
    shutil.rmtree(path, ignore_errors=True)
    return out


def _case(work: Path, name: str, trace: list[traces.Request], capacity_pages: int, shape: tuple[int, int, int],
          page_bytes: int, restart_at: int | None = None) -> dict[str, Any]:
    lru, opt = traces.lru(trace, capacity_pages), traces.belady(trace, capacity_pages)
    row: dict[str, Any] = {"trace": name, "capacity_pages": capacity_pages, "lru": lru.hit_rate,
                           "belady": opt.hit_rate}
    for side in SIDES:
        row[side] = run_side(side, work / side, trace, capacity_pages, shape, page_bytes, restart_at)
    log.info("retention %s @%d pages: lifeboat %.3f, file %.3f, lru %.3f, belady %.3f", name, capacity_pages,
             row["lifeboat"]["hit_rate"], row["file"]["hit_rate"], lru.hit_rate, opt.hit_rate)
    return row


def run(work: Path, sizes: Sizes, quick: bool = False) -> dict[str, Any]:
    """The sweep (four traces x capacities) and the issue's hot-set case with a restart halfway."""
    # 32 KiB pages (K and V, bf16); 64 KiB in a quick run, whose shorter traces would otherwise ask for a
    # capacity below the smallest a store accepts (one segment)
    layers = 2 if quick else 1
    shape, page_bytes = (layers, 2, 64), 2 * layers * 2 * 64 * 2 * PAGE_TOKENS
    cases = []
    for name, trace in trace_set(quick).items():
        ws = traces.working_set(trace)
        for f in FRACTIONS[::2] if quick else FRACTIONS:
            row = _case(work, name, trace, max(4, int(ws * f)), shape, page_bytes)
            row["fraction"] = f
            cases.append(row)
    # the case as users hit it: 128 KiB pages (4 layers), capacity 96 pages, restart halfway
    big, big_bytes = (4, 2, 64), 4 * 2 * 2 * 64 * 2 * PAGE_TOKENS
    trace = traces.hot_set(HOT_ROUNDS // (3 if quick else 1))
    hot = _case(work, "hot_set_restart", trace, 96, big, big_bytes, restart_at=len(trace) // 2)
    hot["written_ratio"] = hot["lifeboat"]["written_bytes"] / max(1, hot["file"]["written_bytes"])
    return {"cases": cases, "hot_set_restart": hot, "page_bytes": page_bytes}


