"""Benchmark LifeboatHiCacheStorage against SGLang's built-in `file` backend, side by side in one run.

Command (from the repo root, inside the project venv):
    .venv/bin/python scripts/bench_sglang_backend.py --dir /var/tmp/lifeboat-sglang-bench
    .venv/bin/python scripts/bench_sglang_backend.py --part exists --exists-pages 1000000   # batch_exists
    (--part throughput (default), exists or all; --cases small/layer_first/kv,... picks cases;
     --compression zstd|none|auto sets LifeboatCache's engine.compression, default: its own default)

What is measured, exactly:
  * Both backends are created by SGLang 0.5.23's StorageBackendFactory (`dynamic` ->
    LifeboatHiCacheStorage, `file` -> HiCacheFile) inside SGLang's HybridCacheController
    (`attach_storage_backend`), over the same real SGLang MHA host pool (pin_memory=False, 64-token
    pages, bf16), writing into two sibling directories of --dir (same disk). LifeboatCache runs with
    its DEFAULT settings unless --compression is given.
  * Cases (8): shape x layout x data. Shapes: small (24 layers, 2 KV heads, 64 dim: 0.75 MiB pages)
    and 8B-like (32 layers, 8 KV heads, 128 dim: 8 MiB pages). Layouts: page_first and layer_first
    (SGLang's `--hicache-mem-layout`). Data: "kv" (bf16 N(0,1) with per-channel scales: sign/exponent
    bytes compress ~1.4x like real bf16 KV, mantissas do not) and "random" (uniform random bits,
    incompressible).
  * The controller's own per-batch page functions, as its backup / prefetch threads call them: for
    LifeboatCache `_page_set_zero_copy` / `_page_get_zero_copy` (batch_set_v1 / batch_get_v1); for
    `file`, whose batch_*_v1 are SGLang's no-op defaults, `_generic_page_set` / `_generic_page_get`
    (batch_set / batch_get plus SGLang's page copies). Batches of up to 128 pages (fewer for 8 MiB
    pages, at most --batch-mib per batch).
  * write = all batches + the backend's flush (LifeboatCache seals its segments; `file` has nothing
    buffered). Then `sync`. warm read = from the page cache, right after. cold read = after that
    backend's files were written back and dropped from the page cache (fsync + POSIX_FADV_DONTNEED).
  * Reps alternate between the backends (the first one rotates each rep), each rep with fresh keys;
    the median per backend and phase is reported, with the min-max spread. torch's intra-op threads
    are pinned (--torch-threads, default 1) for both sides: SGLang's page copies for `file` use torch.
  * CPU s/GB: process CPU time (user + system, all threads) per GB of raw page bytes over the write
    and read phases, median over reps.
  * batch_exists: 300 keys through LifeboatHiCacheStorage.batch_exists with --exists-pages pages
    stored, written through batch_set_v1 from a small pool (1-token pages, 256 B); p50/p90/p99.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))
from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageExtraInfo, PoolName  # noqa: E402
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import PrefetchOperation  # noqa: E402

from benchutil import drop_page_cache, pct  # noqa: E402
from sglang_pools import CpuHiCache, create_backend, lifeboat_extra, mha_pools, page_keys, storage_config  # noqa: E402

BATCH = 128
SHAPES = {"small": dict(layers=24, heads=2, head_dim=64), "8B": dict(layers=32, heads=8, head_dim=128)}
LAYOUTS = ("page_first", "layer_first")
DATA = ("kv", "random")
PHASES = ("write", "cold read", "warm read")
log = logging.getLogger("bench")


def timed(fn: Callable[[int], Any], n: int, cpu: list[float] | None = None) -> list[float]:
    """Wall time per call; with `cpu`, also this thread's CPU time per call (time not preempted)."""
    out = []
    for i in range(n):
        c, t = time.thread_time(), time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t)
        if cpu is not None:
            cpu.append(time.thread_time() - c)
    return out


def load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg()) + f" on {os.cpu_count()} CPUs"


def proc_cpu() -> float:
    t = os.times()
    return t.user + t.system


class Side:
    """One backend attached to SGLang's controller, and its batch functions."""

    def __init__(self, name: str, dev: Any, host: Any, root: Path, settings: dict) -> None:
        self.name = name
        if name == "lifeboat":
            self.cache = CpuHiCache(dev, host, lifeboat_extra(root / name, **settings), storage_backend="dynamic")
        else:
            os.environ.pop("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", None)
            self.cache = CpuHiCache(dev, host, {"file_storage_path": str(root / name)}, storage_backend="file")
        self.root = root / name
        self.ctl = self.cache.ctl
        self.set_fn, self.get_fn = self.ctl.page_set_func.__name__, self.ctl.page_get_func.__name__

    def write(self, keys: list[list[str]], slots: torch.Tensor) -> None:
        for b in range(len(keys)):
            prefix = [k for kb in keys[:b] for k in kb]
            ok = self.ctl.page_set_func(keys[b], slots, HiCacheStorageExtraInfo(prefix_keys=prefix))
            assert ok, f"{self.name}: backup batch {b} failed"
        if self.name == "lifeboat":
            self.cache.backend.store.flush()

    def read(self, keys: list[list[str]], slots: torch.Tensor) -> None:
        op = PrefetchOperation(CacheRequestHandle(rid="bench", attempt_id=0), [])
        for b in range(len(keys)):
            got = self.ctl.page_get_func(op, keys[b], slots, HiCacheStorageExtraInfo(prefix_keys=None))
            assert got == len(keys[b]), f"{self.name}: prefetch batch {b} got {got} pages"


def fill(host: Any, slots: torch.Tensor, data: str, dim: int, seed: int) -> None:
    """Every page of `slots`: KV-like bf16 (per-channel scales) or random bits."""
    gen = torch.Generator().manual_seed(seed)
    for start in slots[:: host.page_size].tolist():
        flat = host.get_data_page(start, flat=True)
        if data == "random":
            page = torch.randint(-(2**15), 2**15, (flat.numel(),), dtype=torch.int16, generator=gen).view(flat.dtype)
        else:
            scale = torch.exp(torch.randn(dim, generator=gen)).repeat(flat.numel() // dim)
            page = (torch.randn(flat.numel(), generator=gen) * scale).to(flat.dtype)
        host.set_from_flat_data_page(start, page)


def page_bytes_of(host: Any, start: int) -> bytes:
    return bytes(host.get_data_page(start, flat=True).contiguous().view(torch.uint8).numpy())


def run_case(root: Path, shape: str, layout: str, data: str, args: argparse.Namespace) -> dict:
    """One case: both backends over one host pool; returns medians, spreads and CPU s/GB per side."""
    geo = SHAPES[shape]
    ps = args.page_tokens
    page_mib = 2 * geo["layers"] * ps * geo["heads"] * geo["head_dim"] * 2 / 2**20
    per_batch = max(1, min(BATCH, int(args.batch_mib // page_mib)))
    dev, host = mha_pools(layout, page_size=ps, tokens=2 * per_batch * ps, **geo)
    src, dst = host.alloc(per_batch * ps), host.alloc(per_batch * ps)
    fill(host, src, data, geo["head_dim"], seed=1)
    zero = torch.zeros_like(host.get_dummy_flat_data_page())
    settings = {"io_workers": args.io_workers}
    if args.compression:
        settings["compression"] = args.compression
    case_root = root / f"{shape}-{layout}-{data}"
    sides = [Side("lifeboat", dev, host, case_root, settings), Side("file", dev, host, case_root, {})]
    res: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    total = args.batches * per_batch * page_mib * 2**20
    for rep in range(args.reps + 1):  # rep 0 is a warm-up
        order = sides[rep % 2:] + sides[: rep % 2]
        for side in order:
            keys = [page_keys(list(range(rep * 10**7 + b * 10**5, rep * 10**7 + b * 10**5 + per_batch * ps)), ps)
                    for b in range(args.batches)]
            os.sync()  # no dirty backlog from the other side
            for phase in PHASES:
                if phase == "cold read":
                    os.sync()
                    drop_page_cache(side.root)
                if phase != "write":  # zeroed destination: the byte check below then means something
                    for start in dst[::ps].tolist():
                        host.set_from_flat_data_page(start, zero)
                c0, t0 = proc_cpu(), time.perf_counter()
                if phase == "write":
                    side.write(keys, src)
                else:
                    side.read(keys, dst)
                dt, dc = time.perf_counter() - t0, proc_cpu() - c0
                if phase != "write":
                    assert page_bytes_of(host, int(dst[0])) == page_bytes_of(host, int(src[0])), side.name
                    assert page_bytes_of(host, int(dst[-ps])) == page_bytes_of(host, int(src[-ps])), side.name
                if rep:
                    res.setdefault((side.name, phase), []).append(total / dt / 1e9)
                    cpu.setdefault((side.name, phase), []).append(dc / (total / 1e9))
    ratio = sides[0].cache.backend.store.stats()["compression_ratio"]
    for s in sides:
        s.cache.close()
    shutil.rmtree(case_root, ignore_errors=True)
    return {"gbps": {k: float(np.median(v)) for k, v in res.items()},
            "spread": {k: (min(v), max(v)) for k, v in res.items()},
            "cpu": {k: float(np.median(v)) for k, v in cpu.items()},
            "ratio": ratio, "page_mib": page_mib, "per_batch": per_batch,
            "fns": {s.name: (s.set_fn, s.get_fn) for s in sides}}


def throughput(root: Path, args: argparse.Namespace) -> None:
    cases = [(sh, lay, d) for sh in SHAPES for lay in LAYOUTS for d in DATA]
    if args.cases:
        want = set(args.cases.split(","))
        cases = [c for c in cases if "/".join(c) in want]
    print(f"throughput: LifeboatCache ({'defaults' if not args.compression else 'compression ' + args.compression}, "
          f"{args.io_workers} io workers) vs SGLang file; {args.batches} batches per phase, median of {args.reps} "
          f"reps (min-max); torch threads {torch.get_num_threads()}; {load()}")
    print("| case | write vs file | cold read vs file | warm read vs file | lifeboat GB/s w / cold / warm | "
          "file GB/s w / cold / warm | CPU s/GB w+r lifeboat / file | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for shape, layout, data in cases:
        r = run_case(root, shape, layout, data, args)
        g, sp = r["gbps"], r["spread"]
        cells = []
        for ph in PHASES:
            lo = sp[("lifeboat", ph)][0] / sp[("file", ph)][1]
            hi = sp[("lifeboat", ph)][1] / sp[("file", ph)][0]
            cells.append(f"**{g[('lifeboat', ph)] / g[('file', ph)]:.2f}x** ({lo:.2f}-{hi:.2f})")
        lb = " / ".join(f"{g[('lifeboat', ph)]:.2f}" for ph in PHASES)
        fl = " / ".join(f"{g[('file', ph)]:.2f}" for ph in PHASES)
        cpu = {n: sum(r["cpu"][(n, ph)] for ph in ("write", "cold read")) for n in ("lifeboat", "file")}
        print(f"| {shape} {layout} {data} ({r['page_mib']:.2f} MiB x {r['per_batch']}) | {' | '.join(cells)} | "
              f"{lb} | {fl} | {cpu['lifeboat']:.2f} / {cpu['file']:.2f} | {r['ratio'] or 1:.2f} |", flush=True)
    print(f"(lifeboat via {r['fns']['lifeboat']}, file via {r['fns']['file']}; CPU s/GB = write + cold read, "
          "process CPU time per GB of raw pages)")


def exists_scale(root: Path, n_pages: int) -> None:
    _, host = mha_pools("page_first", page_size=1, layers=1, heads=1, head_dim=64, tokens=BATCH)
    b = create_backend(storage_config(extra=lifeboat_extra(root / "exists", compression="none")), {PoolName.KV: host})
    slots = host.alloc(BATCH)
    t = time.perf_counter()
    stored: list[str] = []
    for start in range(0, n_pages, BATCH):
        keys = page_keys(list(range(start, min(start + BATCH, n_pages))), 1)
        assert all(b.batch_set_v1(keys, slots[: len(keys)]))
        if start < 300 * 20:
            stored.extend(keys)
    fill_s = time.perf_counter() - t
    n_index = sum(len(d.index) for d in b.store.tiers[0].dirs)
    rng = np.random.default_rng(0)
    starts = rng.integers(0, len(stored) - 300, 2000)
    time.sleep(2)  # let the fill's last index merge and segment refresh pass
    hit_cpu: list[float] = []
    hit = timed(lambda i: b.batch_exists(stored[starts[i]: starts[i] + 300]), 2000, hit_cpu)
    absent = page_keys(list(range(10**9, 10**9 + 300 * 20)), 1)
    miss = timed(lambda i: b.batch_exists(absent[starts[i] % (len(absent) - 300):][:300]), 2000)
    assert b.batch_exists(stored[:300]) == 300 and b.batch_exists(absent[:300]) == 0
    print(f"batch_exists(300 keys) with {n_index} pages stored (filled through batch_set_v1 in {fill_s:.1f} s; "
          f"{load()}):")
    print(f"  stored keys, wall:     {pct(hit, with_max=False)}   (target p99 <= 1 ms)")
    print(f"  stored keys, CPU time: {pct(hit_cpu, with_max=False)}   (the same calls without the time preempted)")
    print(f"  absent keys, wall:     {pct(miss, with_max=False)}")
    b.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/var/tmp/lifeboat-sglang-bench")
    ap.add_argument("--page-tokens", type=int, default=64)
    ap.add_argument("--batches", type=int, default=2, help="batches per phase")
    ap.add_argument("--batch-mib", type=float, default=96, help="at most this many MiB of pages per batch")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cases", default="", help="comma list of shape/layout/data, e.g. small/layer_first/kv")
    ap.add_argument("--exists-pages", type=int, default=100_000)
    ap.add_argument("--part", default="throughput", choices=["all", "throughput", "exists"])
    ap.add_argument("--compression", default="", choices=["", "auto", "zstd", "none"],
                    help="LifeboatCache engine.compression (default: LifeboatCache's default)")
    ap.add_argument("--io-workers", type=int, default=8, help="LifeboatCache setting")
    ap.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads, both sides")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.torch_threads)
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    try:
        if args.part in ("all", "throughput"):
            throughput(root, args)
        if args.part in ("all", "exists"):
            exists_scale(root, args.exists_pages)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
