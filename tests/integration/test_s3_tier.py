"""The S3 tier against real S3 protocol servers on loopback, over HTTP: moto's standalone server and a Ceph
RADOS Gateway (every test that takes `s3_endpoint` or `s3_server` runs on both; tests/conftest.py).

The conformance suite runs on the session server (`s3_endpoint`); the failure stories get their own
server (`s3_server`) so they can kill, pause and restart it.
"""

from __future__ import annotations

import logging
import time
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto")

from support import chunks  # noqa: E402
from support.chunks import pages, wait_for  # noqa: E402

from lifeboat_cache import ChunkStore, namespace_fingerprint  # noqa: E402
from lifeboat_cache.config import TierSettings, settings_from_dict  # noqa: E402
from lifeboat_cache.records.keys import index_key, key_digest  # noqa: E402
from lifeboat_cache.testing.tiers import Rec, TierTests  # noqa: E402
from lifeboat_cache.tiers.base import Ref, Tier  # noqa: E402
from lifeboat_cache.tiers.s3 import S3Tier  # noqa: E402
from lifeboat_cache.tiers.s3.objects import OBJECT_SUFFIX  # noqa: E402

NS = namespace_fingerprint(model="s3-test", dtype="bfloat16", page_size=64)


def new_bucket(endpoint: str) -> str:
    name = f"lb-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=name)
    return name


def s3_entry(endpoint: str, bucket: str, **kw: Any) -> dict[str, Any]:
    return {"type": "s3", "bucket": bucket, "prefix": "cache/", "endpoint_url": endpoint, "region": "us-east-1",
            "connect_timeout_s": 1.0, "read_timeout_s": 2.0, "max_attempts": 1, "refresh_interval_s": 0.2, **kw}


def s3_settings(endpoint: str, bucket: str, **engine: Any):
    eng = {"io_workers": 8, "failure_cooldown_s": 0.3, "failure_cooldown_max_s": 0.6, **engine}
    return settings_from_dict({"storage": [s3_entry(endpoint, bucket)], "engine": eng})


keys = partial(chunks.keys, width=5)
read_back = partial(chunks.read_back, ns=NS)


# ------------------------------------------------------------------------------ conformance
class TestS3Conformance(TierTests):
    torn_unit_keeps_prefix = False  # an object without a valid trailer is ignored whole

    @pytest.fixture
    def where(self, s3_endpoint: str) -> dict[str, str]:
        return {"endpoint": s3_endpoint, "bucket": new_bucket(s3_endpoint)}

    def make_tier(self, where: dict[str, str], capacity_bytes: int | None = None) -> Tier:
        ts = TierSettings(**{k: v for k, v in s3_entry(where["endpoint"], where["bucket"]).items()
                             if k not in ("max_attempts",)}, capacity_bytes=capacity_bytes, max_attempts=2)
        return S3Tier(ts, io_workers=8).open(background=False)

    def _client(self, tier: S3Tier) -> Any:
        return tier.client.data

    def _key(self, tier: S3Tier, ref: Ref) -> str:
        return tier.data_prefix + tier.objects.get(ref.loc.unit).name  # type: ignore[union-attr]

    def _get(self, tier: S3Tier, ref: Ref) -> bytes:
        return self._client(tier).get_object(Bucket=tier.bucket, Key=self._key(tier, ref))["Body"].read()

    def raw_bytes(self, tier: Tier, ref: Ref) -> bytes:
        return self._get(tier, ref)[ref.loc.offset: ref.loc.offset + ref.length]  # type: ignore[arg-type]

    def raw_corrupt(self, tier: Tier, ref: Ref, at: int) -> None:
        body = bytearray(self._get(tier, ref))  # type: ignore[arg-type]
        chunks.flip_byte(body, ref.loc.offset + at)
        self._client(tier).put_object(Bucket=tier.bucket, Key=self._key(tier, ref), Body=bytes(body))  # type: ignore[arg-type]

    def raw_truncate(self, tier: Tier, ref: Ref) -> None:
        body = self._get(tier, ref)  # type: ignore[arg-type]
        self._client(tier).put_object(Bucket=tier.bucket, Key=self._key(tier, ref),  # type: ignore[arg-type]
                                      Body=body[: ref.loc.offset + ref.length // 2])

    def raw_add_torn_unit(self, tier: Tier, where: dict[str, str], recs: list[Rec]) -> None:
        extra = recs[-1].blob
        name = f"{int(time.time() * 1000):013d}-deadhost-4242-abcdef000001-{len(recs)}{OBJECT_SUFFIX}"
        client = boto3.client("s3", endpoint_url=where["endpoint"])
        client.put_object(Bucket=where["bucket"], Key=f"cache/o/{name}",
                          Body=b"".join(r.blob for r in recs) + extra[: len(extra) // 2])


# ------------------------------------------------------------------------------ through the store
def test_round_trip_through_the_store(s3_endpoint: str) -> None:
    bucket = new_bucket(s3_endpoint)
    ks, ps = keys(64), pages(64)
    with ChunkStore.open(s3_settings(s3_endpoint, bucket), background=False) as st:
        assert all(st.put(NS, ks, ps))
        assert st.count_leading_hits(NS, ks) == 64
        assert all(read_back(st, ks, ps))
        assert st.verify() == []
        tier = st.stats()["tiers"][0]
        assert tier["kind"] == "s3" and tier["pages"] == 64 and tier["objects"] == 1  # one PUT per batch
        assert st.stats()["compression_ratio"] > 1.0


def test_restart_rebuilds_the_index_from_a_paginated_listing(s3_endpoint: str) -> None:
    bucket = new_bucket(s3_endpoint)
    ks, ps = keys(45), pages(45, seed=1)
    with ChunkStore.open(s3_settings(s3_endpoint, bucket), background=False) as st:
        assert all(st.put(NS, ks, ps))
    st = ChunkStore.open(s3_settings(s3_endpoint, bucket), background=True)
    try:
        st.tiers[0].list_page_keys = 10  # type: ignore[attr-defined]  # several pages, like 1000s of objects
        assert st.wait_rebuilt(30)
        assert st.count_leading_hits(NS, ks) == 45
        assert all(read_back(st, ks, ps))
        t = st.stats()["tiers"][0]
        assert t["listed_records"] == 45
    finally:
        st.close()


def test_restart_with_small_list_pages(s3_endpoint: str) -> None:
    """Pagination itself: 23 objects listed 5 keys at a time by a fresh tier."""
    bucket = new_bucket(s3_endpoint)
    ks, ps = keys(23), pages(23, seed=2)
    with ChunkStore.open(s3_settings(s3_endpoint, bucket), background=False) as st:
        for k, p in zip(ks, ps):  # one put per page: 23 objects
            assert all(st.put(NS, [k], [p]))
    ts = TierSettings(**{**s3_entry(s3_endpoint, bucket), "type": "s3"})
    tier = S3Tier(ts)
    tier.list_page_keys = 5
    tier.open(background=False)
    try:
        assert tier.stats()["list_objects_v2_requests"] >= 5 + 1  # data pages + the quarantine listing
        assert tier.contains(np.array([index_key(key_digest(NS, k)) for k in ks], dtype=np.int64)).all()
    finally:
        tier.close()


def test_exists_never_waits_on_the_network(s3_server) -> None:
    bucket = new_bucket(s3_server.endpoint)
    ks, ps = keys(16), pages(16, seed=3)
    with ChunkStore.open(s3_settings(s3_server.endpoint, bucket), background=False) as st:
        assert all(st.put(NS, ks, ps))
    s3_server.pause()  # the endpoint hangs: a listing would block for read_timeout_s
    try:
        t0 = time.perf_counter()
        st = ChunkStore.open(s3_settings(s3_server.endpoint, bucket), background=True)
        opened = time.perf_counter() - t0
        t0 = time.perf_counter()
        n = st.count_leading_hits(NS, ks)
        took = time.perf_counter() - t0
        assert n == 0 and took < 0.05 and opened < 3.0, (n, took, opened)
    finally:
        s3_server.resume()
    try:
        assert st.wait_rebuilt(30)
        assert wait_for(lambda: st.count_leading_hits(NS, ks) == 16, timeout=15)
        assert all(read_back(st, ks, ps))
    finally:
        st.close()


def test_server_killed_mid_run_is_misses_then_hits_again(s3_server, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="lifeboat_cache")
    ep = s3_server.endpoint
    bucket = new_bucket(ep)
    ks, ps = keys(20), pages(20, seed=4)
    st = ChunkStore.open(s3_settings(ep, bucket), background=False)
    try:
        assert all(st.put(NS, ks, ps))
        s3_server.stop(hard=True)  # killed: connections refused
        assert read_back(st, ks, ps) == [False] * 20  # misses, no exception
        c = st.counters.snapshot()
        assert c.get("read_errors", 0) >= 1 and c.get("tier_skipped_cooldown", 0) >= 1
        new_ks, new_ps = keys(10, "n"), pages(10, seed=5)
        assert st.put(NS, new_ks, new_ps) == [False] * 10  # dropped, counted
        c = st.counters.snapshot()
        assert c.get("write_errors", 0) + c.get("writes_dropped_cooldown", 0) == 10
        assert st.count_leading_hits(NS, ks) == 0  # the tier is cooling down: exists skips it, no network

        s3_server.start()  # back on the same port: moto empty (its state was in memory), a gateway not
        boto3.client("s3", endpoint_url=ep).create_bucket(Bucket=bucket)
        time.sleep(0.7)  # the cooldown ends
        if s3_server.keeps_data:
            assert all(read_back(st, ks, ps))  # the objects outlived their gateway: hits again
        else:
            assert read_back(st, ks, ps) == [False] * 20  # the old objects are gone: stale misses...
            assert st.counters.get("miss_stale") >= 1
            assert st.count_leading_hits(NS, ks) == 0  # ...and dropped from the index
        assert wait_for(lambda: all(st.put(NS, new_ks, new_ps)), timeout=5)
        assert all(read_back(st, new_ks, new_ps))  # hits again
        assert st.verify() == []
    finally:
        st.close()
    outage = [r for r in caplog.records if "skipping the tier" in r.getMessage()]
    assert 1 <= len(outage) <= 6, "one log line per cooldown, not one per page"


def test_server_hang_is_bounded_and_old_pages_hit_after_it_returns(s3_server) -> None:
    ep = s3_server.endpoint
    bucket = new_bucket(ep)
    ks, ps = keys(12), pages(12, seed=6)
    st = ChunkStore.open(s3_settings(ep, bucket), background=False)
    try:
        assert all(st.put(NS, ks, ps))
        s3_server.pause()
        t0 = time.perf_counter()
        got = read_back(st, ks, ps)
        took = time.perf_counter() - t0
        assert got == [False] * 12
        assert took < 8.0, f"a hung endpoint held a read for {took:.1f} s (read_timeout_s is 2 s)"
        s3_server.resume()
        time.sleep(0.7)
        assert wait_for(lambda: all(read_back(st, ks, ps)), timeout=10)  # same data, hits again
    finally:
        s3_server.resume()
        st.close()


def test_credentials_are_never_logged(s3_server, monkeypatch, caplog) -> None:
    marker_key, marker_secret = "AKIAMARKERKEY1234567", "marker/secret/value/abcdefghijklmnopqrs"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", marker_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", marker_secret)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_SECURITY_TOKEN", raising=False)
    caplog.set_level(logging.DEBUG, logger="lifeboat_cache")
    ep = s3_server.endpoint
    st = ChunkStore.open(s3_settings(ep, "no-such-bucket-here"), background=False)  # every call fails
    try:
        st.put(NS, keys(3), pages(3))
        s3_server.stop(hard=True)
        time.sleep(0.7)
        st.put(NS, keys(3, "x"), pages(3))
        text = caplog.text + repr(st.stats())
        assert "NoSuchBucket" in text or "skipping the tier" in text  # errors were logged...
        assert marker_key not in text and marker_secret not in text  # ...without credentials
    finally:
        st.close()


def test_two_hosts_share_one_prefix(s3_endpoint: str) -> None:
    """Two stores on one bucket/prefix (two hosts): each finds the other's pages by listing."""
    bucket = new_bucket(s3_endpoint)
    a = ChunkStore.open(s3_settings(s3_endpoint, bucket), background=False)
    b = ChunkStore.open(s3_settings(s3_endpoint, bucket), background=False)
    try:
        ka, pa = keys(10, "a"), pages(10, seed=7)
        kb, pb = keys(10, "b"), pages(10, seed=8)
        assert all(a.put(NS, ka, pa)) and all(b.put(NS, kb, pb))
        assert wait_for(lambda: b.count_leading_hits(NS, ka) == 10 and a.count_leading_hits(NS, kb) == 10, timeout=10)
        assert all(read_back(b, ka, pa)) and all(read_back(a, kb, pb))
    finally:
        a.close()
        b.close()


def test_two_hosts_through_two_gateways_of_one_cluster(ceph) -> None:
    """Ceph only: each host talks to its own gateway of one cluster. Each serves the other's pages byte
    for byte; objects another host deletes (its eviction) are misses here, never errors."""
    g1, g2 = ceph.gateways[0], ceph.gateway()
    bucket = new_bucket(g1.endpoint)
    a = ChunkStore.open(s3_settings(g1.endpoint, bucket), background=False)
    b = ChunkStore.open(s3_settings(g2.endpoint, bucket), background=False)
    try:
        ka, pa = keys(10, "a"), pages(10, seed=17)
        kb, pb = keys(10, "b"), pages(10, seed=18)
        c = boto3.client("s3", endpoint_url=g2.endpoint)
        assert all(a.put(NS, ka, pa))
        mine = [o["Key"] for o in c.list_objects_v2(Bucket=bucket, Prefix="cache/o/")["Contents"]
                if o["Key"].endswith(OBJECT_SUFFIX)]  # a's, listed through the other gateway
        assert mine and all(b.put(NS, kb, pb))
        assert wait_for(lambda: b.count_leading_hits(NS, ka) == 10 and a.count_leading_hits(NS, kb) == 10, timeout=10)
        assert all(read_back(b, ka, pa)) and all(read_back(a, kb, pb))
        c.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in mine]})  # b's host evicts a's
        assert read_back(a, ka, pa) == [False] * 10  # misses, no exception
        assert a.counters.get("miss_stale") >= 1 and a.count_leading_hits(NS, ka) == 0
        assert all(read_back(a, kb, pb)) and a.verify() == []
    finally:
        a.close()
        b.close()
        g2.stop()


def test_capacity_is_enforced_across_restarts(s3_endpoint: str) -> None:
    bucket = new_bucket(s3_endpoint)
    entry = s3_entry(s3_endpoint, bucket, capacity="256KiB")
    s = settings_from_dict({"storage": [entry], "engine": {"compression": "none"}})
    ks, ps = keys(40), pages(40, seed=9, size=16384)
    with ChunkStore.open(s, background=False) as st:
        for i in range(0, 40, 4):
            assert all(st.put(NS, ks[i: i + 4], ps[i: i + 4]))
        assert wait_for(lambda: st.tiers[0].usage_bytes() <= 256 << 10, timeout=10)
        assert st.contains(NS, ks[-4:]) == [True] * 4 and not st.contains(NS, ks[:1])[0]
    with ChunkStore.open(s, background=False) as st:
        assert st.tiers[0].usage_bytes() <= 256 << 10  # the listing agrees: objects were deleted
        assert all(read_back(st, ks[-4:], ps[-4:]))


def test_read_only_open_never_evicts_or_writes(s3_endpoint: str) -> None:
    """`lifeboat stats` / `verify` open the store read-only: a smaller `capacity:` in their config must
    not delete objects, and a bad record they meet is not marked in the bucket; only gc() evicts."""
    bucket = new_bucket(s3_endpoint)
    ks, ps = keys(40), pages(40, seed=11, size=16384)
    big = settings_from_dict({"storage": [s3_entry(s3_endpoint, bucket)], "engine": {"compression": "none"}})
    with ChunkStore.open(big, background=False) as st:
        for i in range(0, 40, 4):
            assert all(st.put(NS, ks[i: i + 4], ps[i: i + 4]))
    client = boto3.client("s3", endpoint_url=s3_endpoint)

    def objects() -> list[str]:
        return sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", []))

    before = objects()
    small = settings_from_dict({"storage": [s3_entry(s3_endpoint, bucket, capacity="64KiB")],
                                "engine": {"compression": "none"}})
    with ChunkStore.open(small, read_only=True) as st:
        assert st.wait_rebuilt(10)
        time.sleep(1.0)  # five refresh rounds of the background thread (refresh_interval_s 0.2)
        assert st.tiers[0].gc() == 0
        assert all(read_back(st, ks, ps))
    assert objects() == before
    with ChunkStore.open(small) as st:  # a serving open evicts down to the capacity
        assert st.wait_rebuilt(10)
        assert wait_for(lambda: st.tiers[0].usage_bytes() <= 64 << 10, timeout=10)
    assert len(objects()) < len(before)


def test_the_benchs_delayed_moto_server_starts_and_delays_every_request(tmp_path: Path) -> None:
    """`lifeboat bench --only s3` models a remote store with moto behind a fixed per-request delay."""
    from lifeboat_cache.testing import start_with_retry

    server = start_with_retry(tmp_path, latency_ms=30)
    try:
        c = boto3.client("s3", endpoint_url=server.endpoint)
        c.create_bucket(Bucket="delayed")
        t0 = time.perf_counter()
        c.list_objects_v2(Bucket="delayed")
        assert time.perf_counter() - t0 >= 0.03
    finally:
        server.stop()
