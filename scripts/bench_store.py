"""Benchmark the chunk store on local disk, side by side with plain files in the same run.

Command (from the repo root, inside the project venv):
    python scripts/bench_store.py --dir /tmp/lifeboat-bench            # full run: 1M pages indexed
    python scripts/bench_store.py --dir /tmp/lifeboat-bench --pages 100000   # quicker

Prints:
  * store write / read GB/s with `compression: none` vs plain file write / read of the same bytes (one
    file per 128-page batch, written and read with the same number of threads), medians of 5
    alternating rounds, and the ratio (target >= 0.8x); warm-up excluded. Reads are timed twice:
    right after the writes (page cache: the software paths), and after both sides' files were
    written back and dropped from the page cache (fsync + POSIX_FADV_DONTNEED: the drive);
  * `exists` on 300 keys with N pages indexed: p50 / p90 / p99 / max (target p99 <= 1 ms);
  * index memory per page at N pages (target <= 100 bytes);
  * time until the first hit after reopening the store of N pages (target <= 2 s), with the
    snapshot (clean close) and without it (after a crash: trailer tables + torn-tail walk).
Writes land in the page cache on both sides (a sync before each timed phase clears the backlog).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from benchutil import drop_page_cache, pct
from lifeboat_cache import ChunkStore, namespace_fingerprint
from lifeboat_cache.config import settings_from_dict
from lifeboat_cache.tiers.segment import SNAPSHOT_NAME

NS = namespace_fingerprint(model="bench")
ROUNDS = 5


def throughput(root: Path, workers: int, page_bytes: int, batches: int) -> None:
    rng = np.random.default_rng(0)
    pages = [rng.integers(0, 256, page_bytes, dtype=np.uint8) for _ in range(128)]
    total = batches * 128 * page_bytes
    s = settings_from_dict({"storage": [{"type": "local", "path": str(root / "store"), "capacity": "64GiB"}],
                            "engine": {"io_workers": workers, "compression": "none"}})
    plain = root / "plain"
    plain.mkdir(parents=True, exist_ok=True)

    def plain_write(b: int) -> None:
        with open(plain / f"{b}.bin", "wb") as f:
            for p in pages:
                f.write(p)

    def plain_read(b: int) -> None:
        out = [np.empty_like(p) for p in pages]
        with open(plain / f"{b}.bin", "rb") as f:
            for o in out:
                f.readinto(o)

    pool = ThreadPoolExecutor(workers)
    with ChunkStore.open(s, background=False) as st:
        keys = [[f"b{b}-p{i}" for i in range(128)] for b in range(batches)]
        st.put(NS, [f"warm{i}" for i in range(128)], pages)  # warm-up
        plain_write(-1)
        results: dict[str, list[float]] = {}

        def timed(name: str, fn) -> None:
            os.sync()  # no dirty backlog from the other side
            t = time.perf_counter()
            fn()
            results.setdefault(name, []).append(total / (time.perf_counter() - t))

        out = [np.empty_like(p) for p in pages]
        for rnd in range(ROUNDS):  # alternate the sides; report medians (noisy shared machine)
            ks = [[k + f"r{rnd}" for k in keys[b]] for b in range(batches)]
            timed("store_w", lambda: [st.put(NS, ks[b], pages) for b in range(batches)])
            timed("plain_w", lambda: list(pool.map(plain_write, range(batches))))
            timed("store_r", lambda: [st.get_into(NS, ks[b], out) for b in range(batches)])
            timed("plain_r", lambda: list(pool.map(plain_read, range(batches))))
            st.flush()
            drop_page_cache(root)
            timed("store_d", lambda: [st.get_into(NS, ks[b], out) for b in range(batches)])
            timed("plain_d", lambda: list(pool.map(plain_read, range(batches))))
            assert all(st.contains(NS, ks[-1]))
    for what, a, b in (("write", "store_w", "plain_w"), ("read (page cache)", "store_r", "plain_r"),
                       ("read (drive)", "store_d", "plain_d")):
        sv, pv = float(np.median(results[a])) / 1e9, float(np.median(results[b])) / 1e9
        print(f"{what:18s} store {sv:.2f} GB/s vs plain files {pv:.2f} GB/s -> {sv / pv:.2f}x (target >= 0.8x)")
    print(f"       ({batches} batches x 128 pages x {page_bytes} B, {workers} threads, compression none, "
          f"median of {ROUNDS} alternating rounds)")


def index_scale(root: Path, n_pages: int, page_bytes: int) -> None:
    rng = np.random.default_rng(1)
    s = settings_from_dict({"storage": [{"type": "local", "path": str(root / "big"), "capacity": "64GiB"}],
                            "engine": {"io_workers": 4, "compression": "none"}})
    page = rng.integers(0, 256, page_bytes, dtype=np.uint8)
    t = time.perf_counter()
    with ChunkStore.open(s, background=False) as st:
        for b in range(0, n_pages, 1024):
            ks = [f"p{i}" for i in range(b, min(b + 1024, n_pages))]
            st.put(NS, ks, [page] * len(ks))
        fill_s = time.perf_counter() - t
        ix = st.tiers[0].dirs[0].index
        ix.export()  # merge the delta, as the steady state has it
        per_page = ix.memory_bytes() / len(ix)
        lat = []
        for _ in range(2000):
            start = int(rng.integers(0, n_pages - 300))
            ks = [f"p{i}" for i in range(start, start + 300)]
            t = time.perf_counter()
            n = st.exists(NS, ks)
            lat.append(time.perf_counter() - t)
            assert n == 300
    print(f"filled {n_pages} pages of {page_bytes} B in {fill_s:.1f} s")
    print(f"exists(300 keys) with {n_pages} pages indexed: {pct(lat)} (target p99 <= 1 ms)")
    print(f"index memory: {per_page:.1f} bytes/page at {n_pages} pages (target <= 100)")
    probe = [f"p{n_pages - 1}"]
    for label, drop_snapshot in (("clean close, snapshot", False), ("no snapshot (crash), rescan", True)):
        if drop_snapshot:
            (root / "big" / SNAPSHOT_NAME).unlink()
        t = time.perf_counter()
        with ChunkStore.open(s) as st:
            while not st.exists(NS, probe):
                time.sleep(0.001)
            first = time.perf_counter() - t
            st.wait_rebuilt()
            full = time.perf_counter() - t
        print(f"reopen ({label}): first hit after {first:.3f} s, index complete after {full:.3f} s "
              f"(target first hit <= 2 s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/tmp/lifeboat-bench")
    ap.add_argument("--pages", type=int, default=1_000_000, help="pages indexed for the exists/memory/reopen part")
    ap.add_argument("--page-bytes", type=int, default=1 << 20, help="page size for the throughput part")
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--workers", type=int, default=8)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    try:
        throughput(root, args.workers, args.page_bytes, args.batches)
        index_scale(root, args.pages, 256)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
