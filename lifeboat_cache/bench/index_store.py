"""The index through the store (`measure_store`, a section of `index_scale`): `count_leading_hits`
(what SGLang's batch_exists calls) of 300 stored keys via a real ChunkStore over n pages, keys asked
for the first time and again (digest cache), idle and while another thread `put`s real pages."""

from __future__ import annotations

import threading
import time
from typing import Any, Sequence

import numpy as np

from .index_common import BATCH, READER_PAUSE_S, WRITER_BATCH, WRITER_PAUSE_S, md_table, percentiles_ms
from .index_reopen import make_store


STORE_REC = 4096  # record bytes in the store measurement's sparse segments (apparent size only)
STORE_PAGE = 16384  # bytes of each page the writer thread stores


def measure_store(n: int, quick: bool = False) -> dict[str, Any]:
    """`count_leading_hits` (what SGLang's batch_exists calls) of 300 stored keys through a real
    ChunkStore over a local tier of n pages (sealed segments with real trailers of real key digests),
    idle and while another thread stores new pages with `put` (real records, written to disk)."""
    import shutil
    import tempfile

    from .. import ChunkStore, namespace_fingerprint
    from ..config import settings_from_dict
    from ..records import DIGEST_CACHE_ENTRIES, digests

    ns = namespace_fingerprint(model="bench-index-scale", page_size=64)
    root = tempfile.mkdtemp(prefix="lifeboat-store-scale-")
    try:
        ik = np.empty(n, dtype=np.int64)
        tails = np.empty(n, dtype="S8")
        for a in range(0, n, 1 << 16):
            ds, k = digests(ns, [f"page-{i}" for i in range(a, min(n, a + (1 << 16)))])
            ik[a:a + len(k)] = k
            tails[a:a + len(k)] = np.frombuffer(b"".join(d[8:] for d in ds), dtype="S8")
        make_store(root, n, keys=ik, tails=tails, rec=STORE_REC)
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
        return {"pages": n, "store_exists_cold_p50_ms": percentiles_ms(cold)["p50"], "store_exists_cold_p99_ms": percentiles_ms(cold)["p99"],
                "store_exists_idle_p50_ms": percentiles_ms(idle)["p50"], "store_exists_idle_cpu_p99_ms": percentiles_ms(idle_cpu)["p99"],
                "store_exists_idle_p99_ms": percentiles_ms(idle)["p99"],
                "store_exists_writer_p50_ms": percentiles_ms(busy)["p50"], "store_exists_writer_p99_ms": percentiles_ms(busy)["p99"],
                "store_exists_writer_max_ms": percentiles_ms(busy)["max"], "store_puts_per_s": written[0] / write_s,
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


def store_table(rows: Sequence[dict[str, Any]]) -> str:
    return md_table(STORE_COLUMNS, rows)
