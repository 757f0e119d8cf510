"""Retention on the S3 tier, against moto's server over HTTP: objects read from are kept (whole, or
their read records copied into a new object), one-off objects go first, and the read counts survive a
restart through the state object under `<prefix>r/`."""

from __future__ import annotations

import numpy as np
import pytest

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto")

from support.chunks import pages  # noqa: E402
from test_s3_tier import new_bucket, s3_entry  # noqa: E402

from lifeboat_cache import ChunkStore, namespace_fingerprint  # noqa: E402
from lifeboat_cache.config import settings_from_dict  # noqa: E402

NS = namespace_fingerprint(model="s3-retention", dtype="bfloat16", page_size=64)
HOT, PAGE = 24, 16384
HOT_PAGES = pages(HOT, seed=1, size=PAGE)


def _settings(endpoint: str, bucket: str):  # type: ignore[no-untyped-def]
    entry = s3_entry(endpoint, bucket, capacity=f"{96 * (PAGE + 200)}B", refresh_interval_s=60)
    return settings_from_dict({"storage": [entry], "engine": {"io_workers": 4}})


def _hot_served(st: ChunkStore) -> int:
    out = [np.empty_like(p) for p in HOT_PAGES]
    ok = st.get_into(NS, [f"hot{i}" for i in range(HOT)], out)
    assert all(not g or np.array_equal(a, b) for g, a, b in zip(ok, out, HOT_PAGES)), "wrong page served"
    return sum(ok)


def _round(st: ChunkStore, r: int, read_hot: bool = True) -> int:
    served = _hot_served(st) if read_hot else 0
    if read_hot:
        st.put(NS, [f"hot{i}" for i in range(HOT)], HOT_PAGES)  # what missed is written back
    st.put(NS, [f"once{r}-{i}" for i in range(HOT)], pages(HOT, seed=100 + r, size=PAGE))
    st.tiers[0].gc()  # the background thread's gc, run now so the test does not wait for it
    return served


def test_s3_keeps_the_objects_it_reads_and_their_counts_survive_a_restart(s3_endpoint: str) -> None:
    bucket = new_bucket(s3_endpoint)
    s = _settings(s3_endpoint, bucket)
    with ChunkStore.open(s, background=False) as st:
        st.put(NS, [f"hot{i}" for i in range(HOT)], HOT_PAGES)
        served = [_round(st, r) for r in range(12)]
        t = st.stats()["tiers"][0]
    assert served == [HOT] * 12, served
    assert t["evicted_objects"] >= 8 and t["evicted_unread_records"] >= 8 * HOT, t
    assert t["retention_kept_segments"] >= 1, t
    states = boto3.client("s3", endpoint_url=s3_endpoint).list_objects_v2(Bucket=bucket, Prefix="cache/r/")
    assert states.get("KeyCount", 0) == 1, "close publishes this process's retention state"
    with ChunkStore.open(s, background=False) as st:
        for r in range(12, 13):  # 24 one-off pages, nothing read: the hot object is the oldest
            _round(st, r, read_hot=False)
        assert _hot_served(st) == HOT


def test_s3_reinserts_read_records_of_a_mostly_unread_object(s3_endpoint: str) -> None:
    """Hot pages written in the same objects as twice as many one-off pages: evicting such an object
    copies its read records into a new object first."""
    bucket = new_bucket(s3_endpoint)
    s = _settings(s3_endpoint, bucket)
    filler = pages(2 * HOT, seed=7, size=PAGE)
    with ChunkStore.open(s, background=False) as st:
        for i in range(HOT):
            st.put(NS, [f"a{i}", f"hot{i}", f"b{i}"], [filler[2 * i], HOT_PAGES[i], filler[2 * i + 1]])
        served = [_round(st, r) for r in range(10)]
        t = st.stats()["tiers"][0]
    assert served == [HOT] * 10, served
    assert t["retention_reinserted_records"] >= HOT and t["retention_rewritten_bytes"] > 0, t


def test_s3_capacity_counts_pages_not_their_framing(s3_endpoint: str) -> None:
    """A capacity of exactly 48 pages holds 48 pages, as on a local tier: the records' headers and each
    object's trailer (records.framing, from the record count in the object's name) are not counted."""
    bucket = new_bucket(s3_endpoint)
    entry = s3_entry(s3_endpoint, bucket, capacity=f"{48 * PAGE}B", compression="none", refresh_interval_s=60)
    s = settings_from_dict({"storage": [entry], "engine": {"io_workers": 4}})
    with ChunkStore.open(s, background=False) as st:
        for b in range(4):
            st.put(NS, [f"p{b}-{i}" for i in range(12)], pages(12, seed=200 + b, size=PAGE))
        st.tiers[0].gc()
        t = st.stats()["tiers"][0]
        assert t["evicted_objects"] == 0, t
        assert st.tiers[0].usage_bytes() == 48 * PAGE
        assert all(st.contains(NS, [f"p{b}-{i}" for b in range(4) for i in range(12)]))
        st.put(NS, ["one-more"], pages(1, seed=300, size=PAGE))
        st.tiers[0].gc()
        assert st.stats()["tiers"][0]["evicted_objects"] >= 1
        assert st.tiers[0].usage_bytes() <= 48 * PAGE
