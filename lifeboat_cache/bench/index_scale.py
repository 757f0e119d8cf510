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


def _make_store(root: str, n: int, first_unit: int = 0, keys: np.ndarray | None = None,
                tails: np.ndarray | None = None, rec: int = 1 << 16) -> np.ndarray:
    """Sealed segments holding n records of `rec` bytes in all: sparse files, real trailers (the index
    is all a reopen reads; no record bytes are needed for it). `keys` / `tails` (digest bytes 8-16,
    "S8"): the records' index keys and digests (default random keys, zero tails). Returns the keys."""
    from lifeboat_cache.tiers.segments.format import TABLE_ENTRY, FOOTER, FOOTER_MAGIC, parse_name
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


def _open_dir(root: str) -> Any:
    from lifeboat_cache.tiers.segments import SegmentDir

    return SegmentDir(__import__("pathlib").Path(root), capacity_bytes=1 << 62, segment_bytes=1 << 30,
                      refresh_interval_s=3600, evict=False)


def _time_reopen(root: str, probe: np.ndarray, n: int) -> tuple[float, float, float, float, float]:
    """(seconds to the first hit among probe keys, to the full index, process CPU seconds until then,
    peak resident bytes per page above the RSS before the open, process CPU seconds to the first hit)
    of a fresh open: on a shared machine the CPU seconds are the reopen's own cost."""
    gc.collect()
    base = _rss()
    can_peak = _reset_peak()
    t0, c0 = time.perf_counter(), time.process_time()
    d = _open_dir(root)
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
    peak = (_peak() - base) / n if can_peak else float("nan")
    d.stop_refresh()  # stop its refresh thread; close() would save a snapshot
    return first, full, cpu, peak, first_cpu


STORE_REC = 4096  # record bytes in the store measurement's sparse segments (apparent size only)
STORE_PAGE = 16384  # bytes of each page the writer thread stores


def measure_store(n: int, quick: bool = False) -> dict[str, Any]:
    """`count_leading_hits` (what SGLang's batch_exists calls) of 300 stored keys through a real
    ChunkStore over a local tier of n pages (sealed segments with real trailers of real key digests),
    idle and while another thread stores new pages with `put` (real records, written to disk)."""
    import shutil
    import tempfile

    from lifeboat_cache import ChunkStore, namespace_fingerprint
    from lifeboat_cache.config import settings_from_dict
    from lifeboat_cache.keys import DIGEST_CACHE_ENTRIES, digests

    ns = namespace_fingerprint(model="bench-index-scale", page_size=64)
    root = tempfile.mkdtemp(prefix="lifeboat-store-scale-")
    try:
        ik = np.empty(n, dtype=np.int64)
        tails = np.empty(n, dtype="S8")
        for a in range(0, n, 1 << 16):
            ds, k = digests(ns, [f"page-{i}" for i in range(a, min(n, a + (1 << 16)))])
            ik[a:a + len(k)] = k
            tails[a:a + len(k)] = np.frombuffer(b"".join(d[8:] for d in ds), dtype="S8")
        _make_store(root, n, keys=ik, tails=tails, rec=STORE_REC)
        del ik, tails
        cfg = settings_from_dict({"storage": [{"type": "local", "path": root, "capacity": "1PiB",
                                               "segment_size": "64MiB"}], "engine": {"io_workers": 2}})
        rng = np.random.default_rng(n)
        # SGLang asks about the same prefixes again and again: a pool of batches whose digests all fit
        # in the store's digest cache (warm); `cold` batches are asked once (a blake2b per key)
        pool = DIGEST_CACHE_ENTRIES // BATCH - 4
        queries = [[f"page-{i}" for i in rng.integers(0, n, BATCH).tolist()] for _ in range(pool)]
        cold_q = [[f"page-{i}" for i in rng.integers(0, n, BATCH).tolist()] for _ in range(50 if quick else 300)]
        with ChunkStore.open(cfg, background=False) as st:
            cold = []
            for q in cold_q:
                t = time.perf_counter()
                assert st.count_leading_hits(ns, q) == BATCH
                cold.append(time.perf_counter() - t)
            # warm the digest cache: twice, because the cold keys above filled it and it empties
            # when full, which can happen part-way through the first pass
            for q in queries + queries:
                st.count_leading_hits(ns, q)
            idle, idle_cpu = [], []
            for i in range(300 if quick else 3000):
                q = queries[i % len(queries)]
                c, t = time.thread_time(), time.perf_counter()
                assert st.count_leading_hits(ns, q) == BATCH
                idle.append(time.perf_counter() - t)
                idle_cpu.append(time.thread_time() - c)
            done = threading.Event()
            written = [0]
            page = np.random.default_rng(1).integers(0, 255, STORE_PAGE, dtype=np.uint8)
            total = 2_000 if quick else 20_000

            def writer() -> None:
                for i in range(0, total, WRITER_BATCH):
                    ks = [f"new-{j}" for j in range(i, i + WRITER_BATCH)]
                    st.put(ns, ks, [page] * len(ks))
                    written[0] = i + WRITER_BATCH
                    time.sleep(WRITER_PAUSE_S)
                done.set()

            busy = []
            t0 = time.perf_counter()
            wt = threading.Thread(target=writer)
            wt.start()
            i = 0
            while not done.is_set():
                q = queries[i % len(queries)]
                t = time.perf_counter()
                hits = st.count_leading_hits(ns, q)
                busy.append(time.perf_counter() - t)
                if hits != BATCH:
                    raise AssertionError("a stored key was missed while the writer ran")
                i += 1
                time.sleep(READER_PAUSE_S)
            wt.join()
            write_s = time.perf_counter() - t0
        return {"pages": n, "store_exists_cold_p50_ms": _pcts(cold)["p50"], "store_exists_cold_p99_ms": _pcts(cold)["p99"],
                "store_exists_idle_p50_ms": _pcts(idle)["p50"], "store_exists_idle_cpu_p99_ms": _pcts(idle_cpu)["p99"],
                "store_exists_idle_p99_ms": _pcts(idle)["p99"],
                "store_exists_writer_p50_ms": _pcts(busy)["p50"], "store_exists_writer_p99_ms": _pcts(busy)["p99"],
                "store_exists_writer_max_ms": _pcts(busy)["max"], "store_puts_per_s": written[0] / write_s,
                "store_lookups_with_writer": len(busy)}
    finally:
        shutil.rmtree(root, ignore_errors=True)


STORE_COLUMNS = [("pages", "pages", "{:,}"), ("store_exists_cold_p50_ms", "new keys p50 ms", "{:.3f}"),
                 ("store_exists_cold_p99_ms", "new keys p99 ms", "{:.3f}"), ("store_exists_idle_p50_ms", "idle p50 ms", "{:.3f}"),
                 ("store_exists_idle_p99_ms", "idle p99 ms", "{:.3f}"),
                 ("store_exists_idle_cpu_p99_ms", "idle CPU p99 ms", "{:.3f}"),
                 ("store_exists_writer_p50_ms", "writer p50 ms", "{:.3f}"),
                 ("store_exists_writer_p99_ms", "writer p99 ms", "{:.3f}"),
                 ("store_exists_writer_max_ms", "writer max ms", "{:.1f}"), ("store_puts_per_s", "puts/s", "{:,.0f}")]


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
        (out["stale_first_hit_s"], out["stale_full_s"], out["stale_cpu_s"], out["stale_peak_B_per_page"],
         out["stale_first_cpu_s"]) = _time_reopen(root, probe, n)
        d = _open_dir(root)
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


def _md_table(columns: Sequence[tuple[str, str, str]], rows: Sequence[dict[str, Any]]) -> str:
    """A markdown table of `rows`, one column per (key, heading, format); a missing "impl" is "index"."""
    head = [h for _, h, _ in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        r = {"impl": "index", **r}
        lines.append("| " + " | ".join(f.format(r[k]) for k, _, f in columns) + " |")
    return "\n".join(lines)


def reopen_table(rows: Sequence[dict[str, Any]]) -> str:
    return _md_table(REOPEN_COLUMNS, rows)


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
    return _md_table([("impl", "impl", "{}"), *COLUMNS], rows)


def store_table(rows: Sequence[dict[str, Any]]) -> str:
    return _md_table(STORE_COLUMNS, rows)


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
