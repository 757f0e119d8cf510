"""Compression on real KV (SmolLM2 pages from real text): ratio and GB/s per `compression:` choice.

Each choice of the config's `compression:` setting stores the same real-KV pages (small-shape pages)
through a ChunkStore on a local tier with one io worker (one core does the codec work), then reads
them back from the page cache: put GB/s, get GB/s, and raw / stored bytes. Random bf16 pages (N(0, 1)
values) run alongside as the reference: the same choice on data with no KV structure. Besides the wall
clock it reports GB per CPU-second of the whole process (`*_cpu_gb_s`: the caller plus the io worker),
which is what a page costs on a shared, loaded machine where the wall clock counts waiting for a core.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from .ceilings import PAGE_BYTES, random_bf16
from .common import Series, dir_bytes
from .sizes import Sizes


def choices() -> tuple[str, ...]:
    from ..config import COMPRESSIONS

    return tuple(COMPRESSIONS)


def one(work: Path, choice: str, pages: list[np.ndarray], reps: int) -> dict[str, Any]:
    from .. import ChunkStore, namespace_fingerprint
    from ..config import settings_from_dict

    ns = namespace_fingerprint(model="bench-compression", dtype="bfloat16")
    total = sum(p.nbytes for p in pages)
    put, get, put_cpu, get_cpu = Series(), Series(), Series(), Series()
    stored = 0
    for rep in range(reps):
        path = work / f"compression-{choice}-{rep}"
        s = settings_from_dict({"storage": [{"type": "local", "path": str(path), "capacity": "64GiB"}],
                                "engine": {"io_workers": 1, "compression": choice}})
        views = [p.view(np.uint16) for p in pages]  # bf16 bits: the codec sees 2-byte elements
        keys = [f"r{rep}-p{i}" for i in range(len(pages))]
        out = [np.empty_like(v) for v in views]
        with ChunkStore.open(s, background=False) as st:
            t, c = time.perf_counter(), time.process_time()
            if not all(st.put(ns, keys, views)):
                raise RuntimeError(f"compression {choice}: put failed")
            st.flush()
            put.add(total / (time.perf_counter() - t) / 1e9)
            put_cpu.add(total / max(time.process_time() - c, 1e-9) / 1e9)
            t, c = time.perf_counter(), time.process_time()
            if not all(st.get_into(ns, keys, out)):
                raise RuntimeError(f"compression {choice}: get failed")
            get.add(total / (time.perf_counter() - t) / 1e9)
            get_cpu.add(total / max(time.process_time() - c, 1e-9) / 1e9)
            if any(not np.array_equal(a, b) for a, b in zip(out, views)):
                raise RuntimeError(f"compression {choice}: round trip changed a page")
            ratio = st.stats().get("compression_ratio")
        stored = dir_bytes(path)
        shutil.rmtree(path)
    return {"put_gb_s": put.summary(), "get_gb_s": get.summary(), "put_cpu_gb_s": put_cpu.summary(),
            "get_cpu_gb_s": get_cpu.summary(),
            "ratio": float(ratio) if ratio else total / max(stored, 1), "disk_bytes": stored, "raw_bytes": total}


def run(work: Path, sizes: Sizes, realkv: np.ndarray | None) -> dict[str, Any]:
    n = max(1, min(sizes.ceiling_mib, 64) * (1 << 20) // PAGE_BYTES)
    data = {"random_bf16": random_bf16(n * PAGE_BYTES, seed=3)}
    if realkv is not None:
        reps = -(-n * PAGE_BYTES // realkv.nbytes)
        data = {"real_kv": (np.tile(realkv, reps) if reps > 1 else realkv)[: n * PAGE_BYTES]} | data
    out: dict[str, Any] = {"page_bytes": PAGE_BYTES, "pages": n, "io_workers": 1, "choices": {}}
    for name, buf in data.items():
        pages = [np.ascontiguousarray(buf[i * PAGE_BYTES: (i + 1) * PAGE_BYTES]) for i in range(n)]
        out["choices"][name] = {c: one(work, c, pages, sizes.reps) for c in choices()}
    return out
