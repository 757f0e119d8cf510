"""Index at scale: `contains` of 300 stored keys (what `batch_exists` costs in the index) idle and while
another thread writes, resident memory per page after a bulk load and while filling, bulk insert time.

Each size runs in its own child process, so resident-memory deltas belong to that index alone. Memory
is measured, not estimated: RSS (/proc/self/statm) minus the RSS before the index existed (the input
arrays are allocated first), and the peak via VmHWM after resetting it (/proc/self/clear_refs);
`memory_bytes()` (the index's own estimate from its arrays) is printed next to it as a cross-check.

The writer inserts single keys with `Index.insert` in batches of 32 with a 0.2 ms pause between
batches (~100K inserts/s at most, above what one drive sustains for real pages), so what the reader
sees is the index's own stalls, not CPython's 5 ms GIL switch interval against a busy-looping thread.
Reopen (`measure_reopen`, also in `run()`): sealed segments of 4,096 pages with real trailers (sparse
files: a reopen reads only trailers and the snapshot), opened afresh after a clean close (snapshot),
with a stale snapshot (10% of the pages in newer segments) and after a crash (no snapshot): seconds
to the first hit among 300 stored keys, to the full index, and the process CPU seconds meanwhile.
Reopen also reports the peak resident bytes per page above the RSS before the open (VmHWM). Through
the store (`measure_store`, also in `run()`): `count_leading_hits` (what SGLang's batch_exists calls)
of 300 stored keys via a real ChunkStore over n pages, idle and while another thread `put`s real pages.
`--impl FILE` measures another implementation of the same interface (e.g. an older index.py) in the
same way, for side-by-side numbers.

    python -m lifeboat_cache.bench.index_scale [--quick] [--sizes 1000000,10000000] [--impl old_index.py]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import logging
import os
import platform
import subprocess
import sys
import threading
import time
from typing import Any, Sequence

import numpy as np

from .common import rss_bytes
from .index_common import (
    BATCH, READER_PAUSE_S, WRITER_BATCH, WRITER_PAUSE_S, md_table, peak_rss_bytes, percentiles_ms, reset_peak_rss)
from .index_reopen import PER_UNIT, measure_reopen, reopen_table
from .index_store import STORE_PAGE, measure_store, store_table

__all__ = ["measure", "run", "table"]

log = logging.getLogger(__name__)


def _index_class(impl: str | None) -> type:
    if impl is None:
        from ..index import Index
        return Index
    spec = importlib.util.spec_from_file_location("lifeboat_bench_index_impl", impl)
    assert spec is not None and spec.loader is not None, impl
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve the module by name
    spec.loader.exec_module(mod)
    return mod.Index


def measure(n: int, quick: bool = False, impl: str | None = None) -> dict[str, Any]:
    """One size in this process: bulk load, idle lookups, lookups while a writer fills, memory."""
    cls = _index_class(impl)
    from ..index import Loc

    rng = np.random.default_rng(n)
    extra = max(1000, min(n // 2, 20_000 if quick else 500_000))
    keys = rng.integers(-2**63, 2**63 - 1, n + extra, dtype=np.int64)
    units = (np.arange(n, dtype=np.int64) // 4096).astype(np.uint32)
    offs = (np.arange(n, dtype=np.uint64) % 4096) * np.uint64(1 << 20)
    lens = np.full(n, 1 << 20, dtype=np.uint32)
    queries = [keys[rng.integers(0, n, BATCH)] for _ in range(300 if quick else 3000)]
    gc.collect()
    base = rss_bytes()
    can_peak = reset_peak_rss()

    ix = cls()
    t0 = time.perf_counter()
    ix.insert_arrays(keys[:n], units, offs, lens)
    bulk_s = time.perf_counter() - t0
    gc.collect()
    after_bulk = (rss_bytes() - base) / n
    bulk_peak = (peak_rss_bytes() - base) / n if can_peak else float("nan")
    est_bulk = ix.memory_bytes() / n

    idle, idle_cpu = [], []
    for q in queries:
        c, t = time.thread_time(), time.perf_counter()
        hit = ix.contains(q)
        idle.append(time.perf_counter() - t)
        idle_cpu.append(time.thread_time() - c)
    assert hit.all()

    # a writer fills while a reader looks up; RSS sampled as it grows
    reset_peak_rss()
    done = threading.Event()
    written = [0]

    def writer() -> None:
        new = keys[n:].tolist()
        for i in range(0, len(new), WRITER_BATCH):
            for j, k in enumerate(new[i:i + WRITER_BATCH], i):
                ix.insert(k, Loc(1 << 20, j, 4096))
            written[0] = min(i + WRITER_BATCH, len(new))
            time.sleep(WRITER_PAUSE_S)
        done.set()

    busy, fill_samples = [], []
    wt = threading.Thread(target=writer)
    t0 = time.perf_counter()
    wt.start()
    i = 0
    while not done.is_set():
        q = queries[i % len(queries)]
        t = time.perf_counter()
        hit = ix.contains(q)
        busy.append(time.perf_counter() - t)
        if not hit.all():
            raise AssertionError("a stored key was missed while the writer ran")
        if i % 50 == 0:
            fill_samples.append((rss_bytes() - base) / (n + written[0]))
        i += 1
        time.sleep(READER_PAUSE_S)
    wt.join()
    write_s = time.perf_counter() - t0
    fill_peak = (peak_rss_bytes() - base) / (n + extra) if can_peak else float("nan")
    if hasattr(ix, "settle"):
        ix.settle()
    gc.collect()
    total = n + extra
    final = (rss_bytes() - base) / total
    assert len(ix) == total
    return {
        "pages": n,
        "bulk_insert_s": bulk_s,
        "exists_idle_p50_ms": percentiles_ms(idle)["p50"], "exists_idle_p99_ms": percentiles_ms(idle)["p99"],
        "exists_idle_cpu_p99_ms": percentiles_ms(idle_cpu)["p99"],
        "exists_writer_p50_ms": percentiles_ms(busy)["p50"], "exists_writer_p99_ms": percentiles_ms(busy)["p99"],
        "max_stall_ms": percentiles_ms(busy)["max"],
        "writer_inserts_per_s": extra / write_s, "writer_inserts": extra, "lookups_with_writer": len(busy),
        "B_per_page_after_bulk": after_bulk, "B_per_page_bulk_peak": bulk_peak,
        "B_per_page_filling_max": max(fill_samples) if fill_samples else float("nan"),
        "B_per_page_filling_peak": fill_peak, "B_per_page_after_fill": final,
        "B_per_page_estimate": est_bulk,
    }


def _child(n: int, quick: bool, impl: str | None, reopen: bool = False, store: bool = False) -> dict[str, Any]:
    flag = "--store-one" if store else "--reopen-one" if reopen else "--one"
    cmd = [sys.executable, "-m", "lifeboat_cache.bench.index_scale", flag, str(n)]
    if quick:
        cmd.append("--quick")
    if impl:
        cmd += ["--impl", impl]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"index bench at {n} pages failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


COLUMNS = [("pages", "pages", "{:,}"), ("bulk_insert_s", "bulk s", "{:.2f}"),
           ("exists_idle_p50_ms", "idle p50 ms", "{:.3f}"), ("exists_idle_p99_ms", "idle p99 ms", "{:.3f}"),
           ("exists_idle_cpu_p99_ms", "idle CPU p99 ms", "{:.3f}"),
           ("exists_writer_p50_ms", "writer p50 ms", "{:.3f}"), ("exists_writer_p99_ms", "writer p99 ms", "{:.3f}"),
           ("max_stall_ms", "max ms", "{:.1f}"), ("writer_inserts_per_s", "ins/s", "{:,.0f}"),
           ("B_per_page_after_bulk", "B/pg bulk", "{:.1f}"), ("B_per_page_bulk_peak", "B/pg bulk peak", "{:.1f}"),
           ("B_per_page_filling_max", "B/pg filling", "{:.1f}"),
           ("B_per_page_filling_peak", "B/pg fill peak", "{:.1f}"), ("B_per_page_after_fill", "B/pg after", "{:.1f}"),
           ("B_per_page_estimate", "est B/pg", "{:.1f}")]


def table(rows: Sequence[dict[str, Any]]) -> str:
    return md_table([("impl", "impl", "{}"), *COLUMNS], rows)


def run(sizes: Sequence[int] = (10_000, 100_000, 1_000_000, 10_000_000), quick: bool = False,
        impl: str | None = None, reopen: bool = True, store: bool = True, **_: Any) -> dict[str, Any]:
    """Measure every size (each in a child process), print the tables, return the rows."""
    rows, reopen_rows, store_rows = [], [], []
    for n in sizes:
        r = _child(int(n), quick, impl)
        r["impl"] = os.path.basename(impl) if impl else "index"
        rows.append(r)
        log.info("index scale: %s", r)
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    load = os.getloadavg()[0]
    print(f"Index scale ({machine}, load {load:.1f}; wall-clock percentiles include time the OS ran others; exists = contains of {BATCH} stored keys; writer: Index.insert, "
          f"{WRITER_BATCH} per {WRITER_PAUSE_S * 1e3:.1f} ms pause)")
    print(table(rows))
    if reopen and impl is None:
        for n in sizes:
            reopen_rows.append(_child(int(n), quick, None, reopen=True))
            log.info("index reopen: %s", reopen_rows[-1])
        print(f"Reopen of sealed segments ({PER_UNIT} pages each; synthetic trailers): first hit among {BATCH} "
              f"stored keys and full index, after a clean close (snapshot), a stale snapshot (10% newer "
              f"pages) and a crash (no snapshot)")
        print(reopen_table(reopen_rows))
    if store and impl is None:
        for n in sizes:
            store_rows.append(_child(int(n), quick, None, store=True))
            log.info("index store: %s", store_rows[-1])
        print(f"Through the store: count_leading_hits (batch_exists) of {BATCH} stored keys over a local tier: "
              f"keys asked for the first time (digests computed), then asked again (digest cache), "
              f"idle and while a thread puts {STORE_PAGE // 1024} KiB pages ({WRITER_BATCH} per put, "
              f"{WRITER_PAUSE_S * 1e3:.1f} ms pause); load {os.getloadavg()[0]:.1f}")
        print(store_table(store_rows))
    for r, extra, prefix in [(r, x, "reopen_") for r, x in zip(rows, reopen_rows)] + \
            [(r, x, "") for r, x in zip(rows, store_rows)]:  # one row per size for `lifeboat bench`'s report
        r.update({prefix + k: v for k, v in extra.items() if k not in ("pages", "units")})
    return {"machine": machine, "load_avg_1min": load, "rows": rows, "reopen_rows": reopen_rows,
            "store_rows": store_rows}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--sizes", default="10000,100000,1000000,10000000")
    p.add_argument("--impl", default=None, help="an index.py to measure instead of lifeboat_cache.index")
    p.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--reopen-one", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--store-one", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--no-reopen", action="store_true", help="skip the reopen measurement")
    p.add_argument("--no-store", action="store_true", help="skip the measurement through the store")
    a = p.parse_args(argv)
    if a.store_one is not None:
        print(json.dumps(measure_store(a.store_one, a.quick)))
        return 0
    if a.reopen_one is not None:
        print(json.dumps(measure_reopen(a.reopen_one)))
        return 0
    if a.one is not None:
        print(json.dumps(measure(a.one, a.quick, a.impl)))
        return 0
    run([int(x) for x in a.sizes.split(",")], a.quick, a.impl, reopen=not a.no_reopen, store=not a.no_store)
    return 0


if __name__ == "__main__":
    sys.exit(main())
