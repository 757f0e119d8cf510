"""S3 tier over HTTP, on moto and on Ceph's RADOS Gateway: parallel vs single-request throughput, first vs
promoted read.

For each added latency (`s3_latency_ms`: moto on loopback answers in ~1 ms and is CPU-bound, a real
endpoint has tens of ms to first byte, so both are shown), one moto server subprocess serves the cases
below; then, where Ceph is installed, a one-machine Ceph cluster (a monitor, a memstore OSD and a
gateway, lifeboat_cache.testing.ceph_rgw) serves the same cases, with no added latency (`ceph`: its start
time, or why it was skipped):
  * write / read: one request at a time (io_workers=1, one page per call) vs `s3_io_workers` parallel
    requests (32-page batches): MB/s and the ratio parallel / serial;
  * promotion: a local tier in front of S3, on a host that has never seen the pages: the first read
    (S3 + promote to local) vs the second read (local), per-page latency, and the ratio at p50.
Compression is off (random payload): this measures the request path. Then the S3 rebuild section of
`lifeboat_cache.bench.s3_rebuild` (owned by the S3 tier) runs against the same server, if present.
The servers are the test kit's launchers (lifeboat_cache.testing).
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from ..testing import CephCluster, missing_binaries, start_with_retry
from .adapters import call_run
from .common import pct
from .sizes import Sizes, ints

BATCH = 32


def settings(endpoint: str, bucket: str, workers: int, local: Path | None = None) -> Any:
    from ..config import settings_from_dict

    s3 = {"type": "s3", "bucket": bucket, "prefix": "bench", "endpoint_url": endpoint, "region": "us-east-1",
          "read_timeout_s": 60, "refresh_interval_s": 60}
    storage = ([{"type": "local", "path": str(local), "capacity": "8GiB"}] if local else []) + [s3]
    # a deadline past any request here: on a loaded machine the bench measures slow requests, not misses
    return settings_from_dict({"storage": storage, "engine": {"io_workers": workers, "compression": "none",
                                                              "deadline_s": 60}})


def run_one(endpoint: str, sizes: Sizes, work: Path) -> dict[str, Any]:
    import boto3

    from .. import ChunkStore, namespace_fingerprint

    ns = namespace_fingerprint(model="bench-s3")
    bucket = f"bench-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    rng = np.random.default_rng(0)
    n, size, par = sizes.s3_pages, sizes.s3_page_kib << 10, sizes.s3_io_workers
    pages = [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(n)]
    mb = n * size / 1e6
    out: dict[str, Any] = {"pages": n, "page_bytes": size, "io_workers": par}
    misses = 0

    def warm(st: Any, tag: str) -> None:
        st.put(ns, [f"warm-{tag}-{i}" for i in range(2)], pages[:2])
        st.get_into(ns, [f"warm-{tag}-{i}" for i in range(2)], [np.empty_like(p) for p in pages[:2]])

    with ChunkStore.open(settings(endpoint, bucket, 1), background=False) as st:
        warm(st, "s")
        t0 = time.perf_counter()
        for i, p in enumerate(pages):
            if st.put(ns, [f"s{i}"], [p]) != [True]:
                raise RuntimeError("S3 put failed")
        out["write_serial_mb_s"] = mb / (time.perf_counter() - t0)
    with ChunkStore.open(settings(endpoint, bucket, par), background=False) as st:
        warm(st, "p")
        t0 = time.perf_counter()
        for i in range(0, n, BATCH):
            if not all(st.put(ns, [f"p{j}" for j in range(i, min(n, i + BATCH))], pages[i: i + BATCH])):
                raise RuntimeError("S3 put failed")
        out["write_parallel_mb_s"] = mb / (time.perf_counter() - t0)
    with ChunkStore.open(settings(endpoint, bucket, 1), background=False) as st:
        warm(st, "rs")
        dst = np.empty(size, np.uint8)
        t0 = time.perf_counter()
        for i in range(n):
            misses += not st.get_into(ns, [f"s{i}"], [dst])[0]
        out["read_serial_mb_s"] = mb / (time.perf_counter() - t0)
    with ChunkStore.open(settings(endpoint, bucket, par), background=False) as st:
        warm(st, "rp")
        dsts = [np.empty(size, np.uint8) for _ in range(BATCH)]
        t0 = time.perf_counter()
        for i in range(0, n, BATCH):
            ks = [f"p{j}" for j in range(i, min(n, i + BATCH))]
            misses += len(ks) - sum(st.get_into(ns, ks, dsts[: len(ks)]))
        out["read_parallel_mb_s"] = mb / (time.perf_counter() - t0)
    local = work / f"s3-local-{bucket}"
    with ChunkStore.open(settings(endpoint, bucket, par, local), background=False) as st:
        dst = np.empty(size, np.uint8)
        first, second = [], []
        for lat in (first, second):
            for i in range(n):
                t = time.perf_counter()
                misses += not st.get_into(ns, [f"s{i}"], [dst])[0]
                lat.append(time.perf_counter() - t)
        c = st.counters.snapshot()
    shutil.rmtree(local, ignore_errors=True)
    out["write_ratio"] = out["write_parallel_mb_s"] / out["write_serial_mb_s"]
    out["read_ratio"] = out["read_parallel_mb_s"] / out["read_serial_mb_s"]
    out["first_read"], out["promoted_read"] = pct(first), pct(second)
    out["promoted_speedup_p50"] = float(np.median(first) / np.median(second))
    out["promotions"] = c.get("promotions", 0)
    out["misses"] = misses
    if misses:
        raise RuntimeError(f"S3 bench: {misses} misses")
    return out


def run(work: Path, sizes: Sizes, quick: bool) -> dict[str, Any]:
    for k, v in (("AWS_ACCESS_KEY_ID", "bench"), ("AWS_SECRET_ACCESS_KEY", "bench"),
                 ("AWS_EC2_METADATA_DISABLED", "true")):
        os.environ.setdefault(k, v)
    out: dict[str, Any] = {"latencies": {}}
    for latency in ints(sizes.s3_latency_ms):
        server = start_with_retry(work, latency_ms=latency)  # its log in the work dir
        endpoint = server.endpoint
        try:
            out["latencies"][str(latency)] = run_one(endpoint, sizes, work)
            if "rebuild" not in out:
                try:  # owned by the S3 tier: its failure is reported (and fails the run), ours are kept
                    out["rebuild"] = call_run("lifeboat_cache.bench.s3_rebuild", endpoint=endpoint,
                                              endpoint_url=endpoint, work=work, root=work, quick=quick, sizes=sizes)
                except Exception as e:  # noqa: BLE001
                    out["rebuild"] = {"status": "error", "error": f"{type(e).__name__}: {e}"}
        finally:
            server.stop()
    out["ceph"] = _on_ceph(sizes, work)
    return out


def _on_ceph(sizes: Sizes, work: Path) -> dict[str, Any]:
    """The same cases on a Ceph gateway whose account is this process's AWS keys; skipped without Ceph."""
    absent = missing_binaries()
    if absent:
        return {"status": "skipped", "reason": f"Ceph is not installed (missing {', '.join(absent)})"}
    cluster = CephCluster(access_key=os.environ["AWS_ACCESS_KEY_ID"], secret_key=os.environ["AWS_SECRET_ACCESS_KEY"],
                          root=work / "ceph").start()
    try:
        return {**run_one(cluster.gateways[0].endpoint, sizes, work), "start_s": cluster.start_seconds}
    finally:
        cluster.stop()
