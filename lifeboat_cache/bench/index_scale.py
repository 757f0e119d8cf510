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

log = logging.getLogger(__name__)

BATCH = 300          # keys per lookup (a long prompt's pages in one batch_exists)
WRITER_BATCH = 32
WRITER_PAUSE_S = 0.0002
READER_PAUSE_S = 0.0005


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _index_class(impl: str | None) -> type:
    if impl is None:
        from lifeboat_cache.index import Index
        return Index
    spec = importlib.util.spec_from_file_location("lifeboat_bench_index_impl", impl)
    assert spec is not None and spec.loader is not None, impl
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve the module by name
    spec.loader.exec_module(mod)
    return mod.Index


def _pcts(xs: list[float]) -> dict[str, float]:
    a = np.array(xs) * 1e3
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)), "max": float(a.max())}


def measure(n: int, quick: bool = False, impl: str | None = None) -> dict[str, Any]:
    """One size in this process: bulk load, idle lookups, lookups while a writer fills, memory."""
    cls = _index_class(impl)
    from lifeboat_cache.index import Loc

    rng = np.random.default_rng(n)
    extra = max(1000, min(n // 2, 20_000 if quick else 500_000))
    keys = rng.integers(-2**63, 2**63 - 1, n + extra, dtype=np.int64)
    units = (np.arange(n, dtype=np.int64) // 4096).astype(np.uint32)
    offs = (np.arange(n, dtype=np.uint64) % 4096) * np.uint64(1 << 20)
    lens = np.full(n, 1 << 20, dtype=np.uint32)
    queries = [keys[rng.integers(0, n, BATCH)] for _ in range(300 if quick else 3000)]
    gc.collect()
    base = _rss()
    can_peak = _reset_peak()

    ix = cls()
    t0 = time.perf_counter()
    ix.insert_arrays(keys[:n], units, offs, lens)
    bulk_s = time.perf_counter() - t0
    gc.collect()
    after_bulk = (_rss() - base) / n
    bulk_peak = (_peak() - base) / n if can_peak else float("nan")
    est_bulk = ix.memory_bytes() / n

    idle, idle_cpu = [], []
    for q in queries:
        c, t = time.thread_time(), time.perf_counter()
        hit = ix.contains(q)
        idle.append(time.perf_counter() - t)
        idle_cpu.append(time.thread_time() - c)
    assert hit.all()

    # a writer fills while a reader looks up; RSS sampled as it grows
    _reset_peak()
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
            fill_samples.append((_rss() - base) / (n + written[0]))
        i += 1
        time.sleep(READER_PAUSE_S)
    wt.join()
    write_s = time.perf_counter() - t0
    fill_peak = (_peak() - base) / (n + extra) if can_peak else float("nan")
    if hasattr(ix, "settle"):
        ix.settle()
    gc.collect()
    total = n + extra
    final = (_rss() - base) / total
    assert len(ix) == total
    return {
        "pages": n,
        "bulk_insert_s": bulk_s,
        "exists_idle_p50_ms": _pcts(idle)["p50"], "exists_idle_p99_ms": _pcts(idle)["p99"],
        "exists_idle_cpu_p99_ms": _pcts(idle_cpu)["p99"],
        "exists_writer_p50_ms": _pcts(busy)["p50"], "exists_writer_p99_ms": _pcts(busy)["p99"],
        "max_stall_ms": _pcts(busy)["max"],
        "writer_inserts_per_s": extra / write_s, "writer_inserts": extra, "lookups_with_writer": len(busy),
        "B_per_page_after_bulk": after_bulk, "B_per_page_bulk_peak": bulk_peak,
        "B_per_page_filling_max": max(fill_samples) if fill_samples else float("nan"),
        "B_per_page_filling_peak": fill_peak, "B_per_page_after_fill": final,
        "B_per_page_estimate": est_bulk,
    }


PER_UNIT = 4096       # records per synthetic sealed segment in the reopen measurement
REOPEN_POLL_S = 0.001


def _make_store(root: str, n: int, first_unit: int = 0) -> np.ndarray:
    """Sealed segments holding n records in all: sparse files, real trailers (the index is all a
    reopen reads; no record bytes are needed for it). Returns the keys."""
    from lifeboat_cache.tiers.segfile import TABLE_ENTRY, FOOTER, FOOTER_MAGIC, parse_name
    import struct
    import zlib

    rng = np.random.default_rng(n + first_unit)
    keys = rng.integers(-2**63, 2**63 - 1, n, dtype=np.int64)
    rec = 1 << 16
    for u, a in enumerate(range(0, n, PER_UNIT), first_unit):
        k = keys[a:a + PER_UNIT]
        table = np.zeros(len(k), dtype=TABLE_ENTRY)
        table["key"] = k
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


def _open_dir(root: str) -> Any:
    from lifeboat_cache.tiers.segment import SegmentDir

    return SegmentDir(__import__("pathlib").Path(root), capacity_bytes=1 << 62, segment_bytes=1 << 30,
                      refresh_interval_s=3600, evict=False)


def _time_reopen(root: str, probe: np.ndarray) -> tuple[float, float, float]:
    """(seconds to the first hit among probe keys, to the full index, process CPU seconds until then)
    of a fresh open: on a shared machine the CPU seconds are the reopen's own cost."""
    t0, c0 = time.perf_counter(), time.process_time()
    d = _open_dir(root)
    d.open(background=True)
    first = float("nan")
    while True:
        hit = d.index.contains(probe)
        if hit.any() and first != first:
            first = time.perf_counter() - t0
        if d.rebuilt and hit.all():
            break
        time.sleep(REOPEN_POLL_S)
    full = time.perf_counter() - t0
    cpu = time.process_time() - c0
    d._closed.set()  # stop its refresh thread; close() would save a snapshot
    return first, full, cpu


def measure_reopen(n: int) -> dict[str, Any]:
    """Reopen of n pages in sealed segments: after a clean close (snapshot), after a crash (no
    snapshot), and with a stale snapshot (10% of the pages in segments written after it)."""
    import shutil
    import tempfile

    from lifeboat_cache.tiers.snapshot import SNAPSHOT_NAME

    root = tempfile.mkdtemp(prefix="lifeboat-reopen-")
    try:
        old = n - n // 10
        keys = _make_store(root, old)
        d = _open_dir(root)
        d.open(background=False)
        d.close()  # writes the snapshot of the old part
        stale_snap = open(os.path.join(root, SNAPSHOT_NAME), "rb").read()
        keys = np.concatenate([keys, _make_store(root, n - old, first_unit=(old + PER_UNIT - 1) // PER_UNIT)])
        probe = keys[np.random.default_rng(1).integers(0, n, BATCH)]
        out: dict[str, Any] = {"pages": n, "units": len([f for f in os.listdir(root) if f.endswith(".seg")])}
        out["stale_first_hit_s"], out["stale_full_s"], out["stale_cpu_s"] = _time_reopen(root, probe)
        d = _open_dir(root)
        d.open(background=False)
        d.close()  # a fresh snapshot of everything
        out["snapshot_bytes"] = os.path.getsize(os.path.join(root, SNAPSHOT_NAME))
        out["clean_first_hit_s"], out["clean_full_s"], out["clean_cpu_s"] = _time_reopen(root, probe)
        os.unlink(os.path.join(root, SNAPSHOT_NAME))
        out["crash_first_hit_s"], out["crash_full_s"], out["crash_cpu_s"] = _time_reopen(root, probe)
        del stale_snap
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


REOPEN_COLUMNS = [("pages", "pages", "{:,}"), ("units", "segments", "{:,}"),
                  ("clean_first_hit_s", "clean: first hit s", "{:.3f}"), ("clean_full_s", "clean: full s", "{:.3f}"),
                  ("clean_cpu_s", "clean: CPU s", "{:.3f}"),
                  ("stale_first_hit_s", "stale: first hit s", "{:.3f}"), ("stale_full_s", "stale: full s", "{:.3f}"),
                  ("stale_cpu_s", "stale: CPU s", "{:.3f}"),
                  ("crash_first_hit_s", "crash: first hit s", "{:.3f}"), ("crash_full_s", "crash: full s", "{:.3f}"),
                  ("crash_cpu_s", "crash: CPU s", "{:.3f}")]


def reopen_table(rows: Sequence[dict[str, Any]]) -> str:
    head = [h for _, h, _ in REOPEN_COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join(f.format(r[k]) for k, _, f in REOPEN_COLUMNS) + " |")
    return "\n".join(lines)


def _child(n: int, quick: bool, impl: str | None, reopen: bool = False) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "lifeboat_cache.bench.index_scale", "--one" if not reopen else "--reopen-one", str(n)]
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
    head = ["impl"] + [h for _, h, _ in COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join([str(r.get("impl", "index"))] + [f.format(r[k]) for k, _, f in COLUMNS]) + " |")
    return "\n".join(lines)


def run(sizes: Sequence[int] = (10_000, 100_000, 1_000_000, 10_000_000), quick: bool = False,
        impl: str | None = None, reopen: bool = True, **_: Any) -> dict[str, Any]:
    """Measure every size (each in a child process), print the table, return the rows."""
    rows, reopen_rows = [], []
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
    return {"machine": machine, "load_avg_1min": load, "rows": rows, "reopen_rows": reopen_rows}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--sizes", default="10000,100000,1000000,10000000")
    p.add_argument("--impl", default=None, help="an index.py to measure instead of lifeboat_cache.index")
    p.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--reopen-one", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--no-reopen", action="store_true", help="skip the reopen measurement")
    a = p.parse_args(argv)
    if a.reopen_one is not None:
        print(json.dumps(measure_reopen(a.reopen_one)))
        return 0
    if a.one is not None:
        print(json.dumps(measure(a.one, a.quick, a.impl)))
        return 0
    run([int(x) for x in a.sizes.split(",")], a.quick, a.impl, reopen=not a.no_reopen)
    return 0


if __name__ == "__main__":
    sys.exit(main())
