"""Tiering: local NVMe in front of shared storage. Writes land on the first tier and are copied
behind it in the background; reads try tiers in order and promote remote hits; a tier that is down
is skipped while the others keep serving; a dialog's pages stay on one drive.
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
from support import chunks
from support.chunks import pages, wait_for

from lifeboat_cache import ChunkStore, namespace_fingerprint
from lifeboat_cache.config import settings_from_dict
from lifeboat_cache.records.keys import index_key, key_digest
from lifeboat_cache.testing.faults import FaultyTier
from lifeboat_cache.testing.memory import MemoryTier
from lifeboat_cache.tiers.local import LocalTier

NS = namespace_fingerprint(model="tiering-test", dtype="bfloat16", page_size=64)
ENGINE = {"io_workers": 4, "failure_cooldown_s": 0.3, "failure_cooldown_max_s": 0.6}


keys = partial(chunks.keys, width=5)
read_back = partial(chunks.read_back, ns=NS)


def local_entry(path: Path, **kw: Any) -> dict[str, Any]:
    return {"type": "local", "path": str(path), "capacity": "256MiB", "segment_size": "4MiB", **kw}


def two_tier_store(local: Path, lower, **engine: Any) -> ChunkStore:
    """local tier + any lower tier object (a MemoryTier, maybe wrapped in a FaultyTier)."""
    s = settings_from_dict({"storage": [local_entry(local), local_entry(local.parent / "unused-lower")],
                            "engine": {**ENGINE, **engine}})
    first = LocalTier(s.storage[0]).open(background=False)
    return ChunkStore(s, [first, lower])


# ------------------------------------------------------------------------------ copy queue
def test_single_tier_pays_nothing_for_copies(tmp_path: Path) -> None:
    s = settings_from_dict({"storage": [local_entry(tmp_path / "a")], "engine": ENGINE})
    with ChunkStore.open(s, background=False) as st:
        assert st.copier is None
        assert all(st.put(NS, keys(8), pages(8)))
        assert not any(k.startswith("copy") for k in st.counters.snapshot())


def test_write_lands_local_and_is_copied_behind_in_batches(tmp_path: Path) -> None:
    lower = MemoryTier()
    st = two_tier_store(tmp_path / "local", lower)
    try:
        ks, ps = keys(100), pages(100)
        assert all(st.put(NS, ks, ps))
        assert st.tiers[0].contains(np.array([index_key(key_digest(NS, k)) for k in ks])).all()
        st.flush()
        assert lower.contains(np.array([index_key(key_digest(NS, k)) for k in ks])).all()
        assert len(lower.units) < 100, "queued copies are written in batches (one unit per batch)"
        c = st.counters.snapshot()
        assert c["copies"] == 100 and c.get("copy_dropped", 0) == 0
        assert st.stats()["copy_queue_bytes"] == 0
    finally:
        st.close()


def test_copy_snapshots_the_callers_buffer(tmp_path: Path) -> None:
    """SGLang reuses host-pool pages right after put returns: the queued copy must not change."""
    lower = FaultyTier(MemoryTier())
    lower.delay_s = 0.2  # the copy happens after the caller has overwritten its buffers
    st = two_tier_store(tmp_path / "local", lower, compression="none")
    try:
        ks, ps = keys(4), pages(4, seed=1)
        bufs = [p.copy() for p in ps]
        assert all(st.put(NS, ks, bufs))
        for b in bufs:
            b[:] = 0
        st.flush()
        fresh = two_tier_store(tmp_path / "other-local", lower.inner)  # empty first tier: reads come from below
        try:
            assert all(read_back(fresh, ks, ps))
        finally:
            fresh.close()
    finally:
        st.close()


def test_full_copy_queue_drops_counts_logs_once_and_never_blocks(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="lifeboat_cache")
    lower = FaultyTier(MemoryTier())
    lower.delay_s = 0.3  # a slow remote
    st = two_tier_store(tmp_path / "local", lower, copy_queue_size="256KiB", compression="none")
    try:
        ks, ps = keys(200), pages(200, seed=2)
        t0 = time.perf_counter()
        for i in range(0, 200, 20):
            assert all(st.put(NS, ks[i: i + 20], ps[i: i + 20]))
        took = time.perf_counter() - t0
        c = st.counters.snapshot()
        assert c["copy_dropped"] > 0 and c["copy_dropped_bytes"] > 0
        assert c["copy_queued"] + c["copy_dropped"] == 200
        assert took < 2.0, f"put waited for the slow tier ({took:.2f} s)"
        assert st.stats()["copy_queue_bytes"] <= 256 << 10
        drops = [r for r in caplog.records if "copy queue full" in r.getMessage()]
        assert len(drops) == 1
    finally:
        st.close()


# ------------------------------------------------------------------------------ promotion
def test_lower_tier_hit_is_promoted_and_then_read_locally(tmp_path: Path) -> None:
    lower = MemoryTier()
    a = two_tier_store(tmp_path / "host-a", lower)
    ks, ps = keys(30), pages(30, seed=3)
    try:
        assert all(a.put(NS, ks, ps))
        a.flush()
    finally:
        a.close()
    b = two_tier_store(tmp_path / "host-b", lower)  # another host: empty local tier, shared lower tier
    try:
        assert b.count_leading_hits(NS, ks) == 30
        assert all(read_back(b, ks, ps))
        assert b.counters.get("hits_tier1") == 30 and b.counters.get("promotions") == 30
        assert all(read_back(b, ks, ps))
        assert b.counters.get("hits_tier1") == 30, "the second read came from the lower tier again"
        assert b.verify() == []
    finally:
        b.close()


# ------------------------------------------------------------------------------ failures
def test_lower_tier_down_is_skipped_and_the_first_keeps_serving(tmp_path: Path) -> None:
    lower = FaultyTier(MemoryTier())
    st = two_tier_store(tmp_path / "local", lower)
    try:
        old_ks, old_ps = keys(10, "old"), pages(10, seed=4)
        assert all(st.put(NS, old_ks, old_ps))
        st.flush()
        lower.down()
        ks, ps = keys(20), pages(20, seed=5)
        assert all(st.put(NS, ks, ps))  # the first tier takes the writes
        st.flush()
        c = st.counters.snapshot()
        assert c.get("copy_errors", 0) >= 1
        assert all(read_back(st, ks, ps))
        # pages only the lower tier has: a miss while it is down, no exception
        st.tiers[0].forget(index_key(key_digest(NS, old_ks[0])), st.tiers[0].locate(index_key(key_digest(NS, old_ks[0]))), "test")
        assert read_back(st, old_ks[:1], old_ps[:1]) == [False]
        lower.up()
        time.sleep(0.7)  # the cooldown ends
        assert read_back(st, old_ks[:1], old_ps[:1]) == [True]
    finally:
        st.close()


def test_first_tier_down_sends_writes_to_the_next(tmp_path: Path) -> None:
    lower = MemoryTier()
    s = settings_from_dict({"storage": [local_entry(tmp_path / "local"), local_entry(tmp_path / "unused")],
                            "engine": ENGINE})
    first = FaultyTier(LocalTier(s.storage[0]).open(background=False))
    st = ChunkStore(s, [first, lower])
    try:
        first.fail_writes = True
        ks, ps = keys(12), pages(12, seed=6)
        assert st.put(NS, ks, ps) == [False] * 12  # the write error starts the first tier's cooldown
        assert st.put(NS, ks, ps) == [False] * 12  # while it cools down, pages go to the lower tier
        st.flush()
        assert st.counters.get("writes_redirected") == 12
        assert st.count_leading_hits(NS, ks) == 12
        assert all(read_back(st, ks, ps))
        assert st.counters.get("hits_tier1") == 12
    finally:
        st.close()


# ------------------------------------------------------------------------------ several drives
def two_drive_store(tmp_path: Path, affinity_chunks: int = 1) -> ChunkStore:
    s = settings_from_dict({"storage": [{"type": "local", "paths": [str(tmp_path / "nvme0"), str(tmp_path / "nvme1")],
                                         "capacity": "256MiB", "affinity_chunks": affinity_chunks}],
                            "engine": ENGINE})
    return ChunkStore.open(s, background=False)


def drive_of(st: ChunkStore, key: str) -> int:
    ref = st.tiers[0].locate(index_key(key_digest(NS, key)))
    assert ref is not None
    return ref.part


def test_a_dialogs_pages_land_on_one_drive(tmp_path: Path) -> None:
    with two_drive_store(tmp_path) as st:
        used = set()
        for d in range(24):
            dialog = keys(9, f"d{d}-")
            aff = st.affinity_of(NS, dialog)
            for lo, hi in ((0, 3), (3, 7), (7, 9)):  # the dialog grows over three turns
                assert all(st.put(NS, dialog[lo:hi], pages(hi - lo, seed=d), affinity=aff))
            drives = {drive_of(st, k) for k in dialog}
            assert len(drives) == 1, f"dialog {d} is spread over drives {drives}"
            used |= drives
        assert used == {0, 1}, "dialogs are spread over both drives"


def test_default_affinity_keeps_one_batch_on_one_drive(tmp_path: Path) -> None:
    with two_drive_store(tmp_path) as st:
        for b in range(8):
            ks = keys(16, f"b{b}-")
            assert all(st.put(NS, ks, pages(16, seed=b)))
            assert len({drive_of(st, k) for k in ks}) == 1


def test_affinity_chunks_decides_how_much_prefix_picks_the_drive(tmp_path: Path) -> None:
    """Dialogs that share a system-prompt page: affinity_chunks 1 piles them on one drive; 2 spreads them."""
    for n, expect_one in ((1, True), (2, False)):
        with two_drive_store(tmp_path / f"chunks{n}", affinity_chunks=n) as st:
            drives = {st.affinity_of(NS, ["system-prompt", f"user-{u}"]) % 2 for u in range(32)}
            assert (len(drives) == 1) is expect_one


def test_promotion_lands_on_the_dialogs_drive(tmp_path: Path) -> None:
    lower = MemoryTier()
    s = settings_from_dict({"storage": [{"type": "local", "paths": [str(tmp_path / "n0"), str(tmp_path / "n1")],
                                         "capacity": "256MiB"}, local_entry(tmp_path / "unused")],
                            "engine": ENGINE})
    st = ChunkStore(s, [LocalTier(s.storage[0]).open(background=False), lower])
    try:
        dialog, ps = keys(6, "p"), pages(6, seed=9)
        aff = st.affinity_of(NS, dialog)
        lower.write_many([(index_key(key_digest(NS, k)), key_digest(NS, k), [_record(k, p)], len(_record(k, p)))
                          for k, p in zip(dialog, ps)])
        assert all(read_back(st, dialog[2:], ps[2:], affinity=aff))  # a read from the middle of the dialog
        assert {drive_of(st, k) for k in dialog[2:]} == {aff % 2}
    finally:
        st.close()


def _record(key: str, page: np.ndarray) -> bytes:
    from lifeboat_cache.records import codec

    flat = codec.as_bytes_view(page)
    header, parts, _ = codec.build_record(flat, itemsize=2, dtype=codec.dtype_code(page), digest=key_digest(NS, key),
                                          namespace=NS, compress=False)
    return header + b"".join(bytes(memoryview(p)) for p in parts)


# ------------------------------------------------------------------------------ local + real S3
def new_bucket(endpoint: str) -> str:
    boto3 = pytest.importorskip("boto3")
    bucket = f"lb-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    return bucket


def s3_entry(endpoint: str, bucket: str) -> dict[str, Any]:
    return {"type": "s3", "bucket": bucket, "prefix": "tiered", "endpoint_url": endpoint, "region": "us-east-1",
            "connect_timeout_s": 1.0, "read_timeout_s": 2.0, "max_attempts": 1, "refresh_interval_s": 0.2}


def test_local_in_front_of_s3_promotes_remote_hits(tmp_path: Path, s3_endpoint: str) -> None:
    bucket = new_bucket(s3_endpoint)
    ks, ps = keys(40), pages(40, seed=10)

    def settings(local: Path):
        return settings_from_dict({"storage": [local_entry(local), s3_entry(s3_endpoint, bucket)], "engine": ENGINE})

    with ChunkStore.open(settings(tmp_path / "host-a"), background=False) as a:
        assert all(a.put(NS, ks, ps))
        a.flush()
        assert a.stats()["tiers"][1]["pages"] == 40
        assert a.stats()["tiers"][1]["objects"] < 40  # copies batched into fewer objects
    with ChunkStore.open(settings(tmp_path / "host-b"), background=False) as b:
        assert b.count_leading_hits(NS, ks) == 40
        assert all(read_back(b, ks, ps))
        assert b.counters.get("hits_tier1") == 40 and b.counters.get("promotions") == 40
        gets = b.stats()["tiers"][1]["get_object_requests"]
        assert all(read_back(b, ks, ps))
        assert b.stats()["tiers"][1]["get_object_requests"] == gets, "promoted pages are read locally"


def test_s3_killed_behind_local_keeps_serving_and_recovers(tmp_path: Path, s3_server) -> None:
    ep = s3_server.endpoint
    bucket = new_bucket(ep)
    s = settings_from_dict({"storage": [local_entry(tmp_path / "local"), s3_entry(ep, bucket)], "engine": ENGINE})
    with ChunkStore.open(s, background=False) as st:
        s3_server.stop(hard=True)
        ks, ps = keys(20), pages(20, seed=11)
        assert all(st.put(NS, ks, ps))  # the first tier takes every write
        st.flush()
        c = st.counters.snapshot()
        assert c.get("copy_errors", 0) + c.get("copy_skipped_cooldown", 0) == 20
        assert all(read_back(st, ks, ps))
        s3_server.start()
        pytest.importorskip("boto3").client("s3", endpoint_url=ep).create_bucket(Bucket=bucket)  # moto restarts empty
        time.sleep(0.7)
        ks2, ps2 = keys(10, "after"), pages(10, seed=12)
        assert all(st.put(NS, ks2, ps2))
        st.flush()
        assert wait_for(lambda: st.tiers[1].contains(
            np.array([index_key(key_digest(NS, k)) for k in ks2])).all(), timeout=5)
        assert st.counters.get("copies") >= 10


def test_a_bad_record_on_one_tier_is_served_from_the_next(tmp_path: Path) -> None:
    """A first tier that reads page by page (here a MemoryTier) holds a corrupted record of every page
    and the local tier behind it a good one: each page is refused on the first tier (never served) and
    read from the second in the same call."""
    first = MemoryTier()
    s = settings_from_dict({"storage": [local_entry(tmp_path / "l0"), local_entry(tmp_path / "l1")],
                            "engine": ENGINE})
    second = LocalTier(s.storage[1]).open(background=False)
    st = ChunkStore(s, [first, second])
    ks, ps = keys(6), pages(6, seed=11)
    try:
        assert all(st.put(NS, ks, ps))
        st.flush()
        assert wait_for(lambda: st.counters.get("copies") >= 6)
        for unit in first.units.values():
            chunks.flip_byte(unit, len(unit) - 1)  # the last payload byte of each record
        assert all(read_back(st, ks, ps))
        assert st.counters.get("miss_checksum") == 6 and st.counters.get("hits_tier1") == 6
    finally:
        st.close()
