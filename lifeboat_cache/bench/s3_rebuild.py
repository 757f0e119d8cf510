"""S3 restart benchmark: index rebuild time and time to the first hit, per object layout.

    python -c "from lifeboat_cache.bench import s3_rebuild; print(s3_rebuild.run(quick=True))"

Starts moto's standalone S3 server on loopback (needs the test extra: moto), fills one bucket with
`pages` pages twice: one page per object (the layout of a store whose first tier is S3, before
batched writes) and `batch_pages` pages per object (batched writes, and the copier's batches), then
opens a fresh S3 tier on each and measures:

* `first_hit_s`: open -> the first page is indexed (servable; `exists` answers from the index).
* `rebuild_s`:   open -> the whole listing and every trailer is indexed.

1M-page numbers are EXTRAPOLATED, not measured (the result says so): rebuild = fixed + objects x
per-object cost, where the per-object cost (listing share + one ranged GET, at io_workers in flight)
comes from the one-page-per-object run and the fixed cost from the batched run (few objects).
moto is a single Python process on the same machine: a real S3 or ONTAP endpoint answers ranged
GETs with more latency but more parallelism, so take the ratios, not the absolute seconds.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..config import TierSettings
from ..records import as_bytes_view, build_record, dtype_code, index_key, key_digest, namespace_fingerprint
from ..testing import start_with_retry

log = logging.getLogger(__name__)

FULL_PAGES = 20_000
QUICK_PAGES = 2_000
BATCH_PAGES = 256
PAGE_BYTES = 4096
IO_WORKERS = 8
EXTRAPOLATE_TO = 1_000_000


def _fill(tier: Any, ns: bytes, pages: int, per_object: int, tag: str) -> None:
    """Write `pages` records as objects of `per_object` records each (parallel PUTs)."""
    rng = np.random.default_rng(0)
    page = (rng.standard_normal(PAGE_BYTES // 2).astype(np.float32) * 0.05).astype(np.float16)
    view = as_bytes_view(page)

    def one(start: int) -> None:
        recs = []
        for i in range(start, min(pages, start + per_object)):
            d = key_digest(ns, f"{tag}{i}")
            header, parts, length = build_record(view, itemsize=2, dtype=dtype_code(page), digest=d,
                                                       namespace=ns, compress=True)
            recs.append((index_key(d), d, [header, *parts], length))
        tier.write_many(recs, background=True)

    with ThreadPoolExecutor(16) as ex:
        list(ex.map(one, range(0, pages, per_object)))


def _measure(ts: TierSettings, ns: bytes, first_key: str) -> dict[str, float]:
    from ..tiers.s3 import S3Tier

    tier = S3Tier(ts, io_workers=IO_WORKERS)
    t0 = time.perf_counter()
    tier.open(background=True)
    first = None
    while first is None and time.perf_counter() - t0 < 600:
        if len(tier.index):
            first = time.perf_counter() - t0
        else:
            time.sleep(0.002)
    tier.wait_rebuilt(3600)
    rebuild = time.perf_counter() - t0
    out = {"first_hit_s": round(first or float("nan"), 3), "rebuild_s": round(rebuild, 3),
           "objects": tier.stats()["objects"], "pages": len(tier.index)}
    tier.close()
    return out


def run(quick: bool = False) -> dict:
    """Measure the S3 index rebuild at 2K (quick) or 20K pages; extrapolate to 1M. Returns a dict."""
    import boto3

    from ..tiers.s3 import S3Tier

    pages = QUICK_PAGES if quick else FULL_PAGES
    ns = namespace_fingerprint(model="bench-s3-rebuild")
    server = start_with_retry()  # the one moto launcher (lifeboat_cache.testing.s3_server)
    url = server.endpoint
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_EC2_METADATA_DISABLED")}
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_EC2_METADATA_DISABLED="true")
    try:
        boto3.client("s3", endpoint_url=url, region_name="us-east-1").create_bucket(Bucket="bench")
        result: dict[str, Any] = {"pages": pages, "page_bytes": PAGE_BYTES, "io_workers": IO_WORKERS,
                                  "server": "moto standalone (loopback)"}
        for layout, per_object in (("one_page_per_object", 1), (f"{BATCH_PAGES}_pages_per_object", BATCH_PAGES)):
            ts = TierSettings(type="s3", bucket="bench", prefix=f"{layout}/", endpoint_url=url, region="us-east-1",
                              refresh_interval_s=3600)
            writer = S3Tier(ts, io_workers=IO_WORKERS)
            t0 = time.perf_counter()
            _fill(writer, ns, pages, per_object, layout)
            fill_s = time.perf_counter() - t0
            writer.close()
            m = _measure(ts, ns, f"{layout}0")
            m["fill_s"] = round(fill_s, 1)
            result[layout] = m
        one, batched = result["one_page_per_object"], result[f"{BATCH_PAGES}_pages_per_object"]
        per_obj_s = max(0.0, one["rebuild_s"] - batched["rebuild_s"]) / max(1, one["objects"] - batched["objects"])
        result["per_object_s"] = round(per_obj_s, 5)
        for m, per_object in ((one, 1), (batched, BATCH_PAGES)):
            objects_1m = -(-EXTRAPOLATE_TO // per_object)
            m["extrapolated_1m_pages"] = {
                "objects": objects_1m, "rebuild_s": round(batched["rebuild_s"] + per_obj_s * objects_1m, 1),
                "method": "extrapolated: fixed (batched run) + objects x per-object cost (one-page run)"}
        result["rebuild_ratio_one_vs_batched"] = round(one["rebuild_s"] / max(batched["rebuild_s"], 1e-6), 1)
        result["first_hit_s"] = max(one["first_hit_s"], batched["first_hit_s"])
        return result
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop(hard=True)


if __name__ == "__main__":
    import json

    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
