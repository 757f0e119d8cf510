"""Benchmark the S3 tier on a loopback S3 server: parallel vs serial requests, and promoted hits.

Command (from the repo root, inside the project venv):
    python scripts/bench_s3.py                           # 0 ms and 20 ms added latency, 128 x 512 KiB pages
    python scripts/bench_s3.py --latency-ms 0 --pages 256 --page-kib 1024 --io-workers 16

For each latency setting, one moto S3 server (moto's own WSGI app under werkzeug's threaded
server, in a subprocess on 127.0.0.1) serves every measurement of that setting:
  * write: a single-request loop (a store with io_workers=1, one page per put) vs `io_workers`
    parallel requests (batches of 32 pages per put) - MB/s, and the ratio (target >= 4x);
  * read: the same, with get_into;
  * promotion: local NVMe tier in front of S3; the first read of each page (remote hit + promotion
    to local) vs the second read of the same page (local) - per-page latency p50/p90/p99/max.
`--latency-ms` adds a sleep before the server handles each request, standing in for the
first-byte latency of a real S3 endpoint (tens of ms): on loopback, moto answers in about a
millisecond and is CPU-bound, so on a small machine parallelism mostly buys overlap of client and
server CPU, not hidden network latency. Both numbers are printed; read them accordingly.
Compression is off (the payload is incompressible random bytes) so this measures the request path.
Warm-up requests are excluded. Misses are printed and must be 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchutil import pct  # noqa: E402
from lifeboat_cache import ChunkStore, namespace_fingerprint  # noqa: E402
from lifeboat_cache.config import settings_from_dict  # noqa: E402

NS = namespace_fingerprint(model="bench-s3")
BATCH = 32


# ---------------------------------------------------------------------------- the server
# One launcher for tests and benchmarks: tests/support/s3_server.py (latency_ms adds a per-request delay).
sys.path.insert(0, str(ROOT / "tests"))
from support.s3_server import MotoS3Server  # noqa: E402


# ---------------------------------------------------------------------------- measurements
def settings(endpoint: str, bucket: str, workers: int, local: Path | None = None):
    s3 = {"type": "s3", "bucket": bucket, "prefix": "bench", "endpoint_url": endpoint, "region": "us-east-1",
          "read_timeout_s": 60, "refresh_interval_s": 60}
    storage = ([{"type": "local", "path": str(local), "capacity": "8GiB"}] if local else []) + [s3]
    return settings_from_dict({"storage": storage, "engine": {"io_workers": workers, "compression": "none"}})


def run_one(endpoint: str, args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    import boto3

    bucket = f"bench-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    rng = np.random.default_rng(0)
    n, size = args.pages, args.page_kib << 10
    pages = [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(n)]
    total_mb = n * size / 1e6
    out: dict[str, float] = {}

    def warm(st: ChunkStore, tag: str) -> None:
        st.put(NS, [f"warm-{tag}-{i}" for i in range(4)], pages[:4])
        st.get_into(NS, [f"warm-{tag}-{i}" for i in range(4)], [np.empty_like(p) for p in pages[:4]])

    # ---- write
    with ChunkStore.open(settings(endpoint, bucket, 1), background=False) as st:
        warm(st, "s")
        lat = []
        t0 = time.perf_counter()
        for i, p in enumerate(pages):
            t = time.perf_counter()
            assert st.put(NS, [f"s{i}"], [p]) == [True]
            lat.append(time.perf_counter() - t)
        out["write_serial_mb_s"] = total_mb / (time.perf_counter() - t0)
        print(f"  write, 1 request at a time : {out['write_serial_mb_s']:8.1f} MB/s   per put {pct(lat, digits=2)}")
    with ChunkStore.open(settings(endpoint, bucket, args.io_workers), background=False) as st:
        warm(st, "p")
        t0 = time.perf_counter()
        for i in range(0, n, BATCH):
            assert all(st.put(NS, [f"p{j}" for j in range(i, min(n, i + BATCH))], pages[i: i + BATCH]))
        out["write_parallel_mb_s"] = total_mb / (time.perf_counter() - t0)
        print(f"  write, {args.io_workers:2d} in parallel      : {out['write_parallel_mb_s']:8.1f} MB/s   "
              f"x{out['write_parallel_mb_s'] / out['write_serial_mb_s']:.1f} vs serial")

    # ---- read (a fresh store each time: index from the listing, nothing cached)
    misses = 0
    with ChunkStore.open(settings(endpoint, bucket, 1), background=False) as st:
        warm(st, "rs")
        dst = np.empty(size, np.uint8)
        lat = []
        t0 = time.perf_counter()
        for i in range(n):
            t = time.perf_counter()
            misses += not st.get_into(NS, [f"s{i}"], [dst])[0]
            lat.append(time.perf_counter() - t)
        out["read_serial_mb_s"] = total_mb / (time.perf_counter() - t0)
        print(f"  read,  1 request at a time : {out['read_serial_mb_s']:8.1f} MB/s   per get {pct(lat, digits=2)}")
    with ChunkStore.open(settings(endpoint, bucket, args.io_workers), background=False) as st:
        warm(st, "rp")
        dsts = [np.empty(size, np.uint8) for _ in range(BATCH)]
        t0 = time.perf_counter()
        for i in range(0, n, BATCH):
            ks = [f"p{j}" for j in range(i, min(n, i + BATCH))]
            misses += len(ks) - sum(st.get_into(NS, ks, dsts[: len(ks)]))
        out["read_parallel_mb_s"] = total_mb / (time.perf_counter() - t0)
        print(f"  read,  {args.io_workers:2d} in parallel      : {out['read_parallel_mb_s']:8.1f} MB/s   "
              f"x{out['read_parallel_mb_s'] / out['read_serial_mb_s']:.1f} vs serial")

    # ---- promotion: local NVMe in front of S3, a host that has never seen these pages
    local = tmp / f"local-{bucket}"
    with ChunkStore.open(settings(endpoint, bucket, args.io_workers, local), background=False) as st:
        dst = np.empty(size, np.uint8)
        first, second = [], []
        for i in range(n):
            t = time.perf_counter()
            misses += not st.get_into(NS, [f"s{i}"], [dst])[0]
            first.append(time.perf_counter() - t)
        for i in range(n):
            t = time.perf_counter()
            misses += not st.get_into(NS, [f"s{i}"], [dst])[0]
            second.append(time.perf_counter() - t)
        c = st.counters.snapshot()
        out["promoted_speedup_p50"] = float(np.median(first) / np.median(second))
        print(f"  1st read (S3 + promote)    : {pct(first, digits=2)}")
        print(f"  2nd read (promoted, local) : {pct(second, digits=2)}   x{out['promoted_speedup_p50']:.1f} faster at p50")
        print(f"  hits from S3 {c.get('hits_tier1', 0)}, promotions {c.get('promotions', 0)}")
    shutil.rmtree(local, ignore_errors=True)
    out["misses"] = misses
    print(f"  misses: {misses}")
    return out


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pages", type=int, default=128)
    p.add_argument("--page-kib", type=int, default=512)
    p.add_argument("--io-workers", type=int, default=16)
    p.add_argument("--latency-ms", default="0,20", help="comma-separated added per-request latencies")
    return p


def main(argv: list[str] | None = None) -> int:
    args = setup_arg_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    import boto3
    import moto

    print(f"python {sys.version.split()[0]}, boto3 {boto3.__version__}, moto {moto.__version__}, "
          f"{os.cpu_count()} CPUs; {args.pages} pages x {args.page_kib} KiB, io_workers {args.io_workers}")
    tmp = Path(tempfile.mkdtemp(prefix="lifeboat-bench-s3-"))
    failed = False
    try:
        for latency in [float(x) for x in args.latency_ms.split(",")]:
            server = MotoS3Server(log_dir=tmp, latency_ms=latency).start()
            try:
                print(f"\nmoto S3 server {server.endpoint}, +{latency:g} ms per request")
                r = run_one(server.endpoint, args, tmp)
                failed |= r["misses"] > 0
            finally:
                server.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
