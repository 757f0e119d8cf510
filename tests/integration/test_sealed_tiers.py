"""Sealed records on every tier and through both runtimes: real files, an NFS-style shared
directory, moto and s3rver over HTTP, the tiered copy and promotion, SGLang's own host pools and
HiCache controller, MLX's KV pool. Per tier: round trip, no plaintext stored, and the failure
stories (a record moved to another key / object, a planted plaintext record, a flipped bit) as
counted misses, never exceptions."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest
from support.chunks import keys, page, wait_for
from support.sealed import encryption, forge_checksums, make_key, plant, raw_record, with_identity

from lifeboat_cache import ChunkStore, namespace_fingerprint
from lifeboat_cache.config import settings_from_dict
from lifeboat_cache.records import codec, payloads
from lifeboat_cache.records.sealing import AUTH, UNSEALED

pytest.importorskip("moto")

NS = namespace_fingerprint(model="sealed-tiers", dtype="bfloat16")
NS_B = namespace_fingerprint(model="sealed-tiers", dtype="bfloat16", key_namespace="b")


def new_bucket(endpoint: str, **kw: Any) -> str:
    name = f"sealed-{os.urandom(4).hex()}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **kw).create_bucket(Bucket=name)
    return name


def tier_entry(kind: str, tmp: Path, endpoint: str | None = None, name: str = "t") -> dict[str, Any]:
    if kind == "s3":
        return {"type": "s3", "bucket": new_bucket(endpoint), "prefix": "cache/",  # type: ignore[arg-type]
                "endpoint_url": endpoint, "region": "us-east-1"}
    t: dict[str, Any] = {"type": kind, "path": str(tmp / name), "capacity": "128MiB", "segment_size": "2MiB"}
    if kind == "nfs":
        t["seal_after_s"] = 0.2
    return t


def store(storage: list[dict[str, Any]], key: Path | None, **enc: Any) -> ChunkStore:
    doc: dict[str, Any] = {"storage": storage, "engine": {"io_workers": 4}}
    if key is not None:
        doc["encryption"] = encryption(key, **enc)
    return ChunkStore.open(settings_from_dict(doc), background=False)


def get(st: ChunkStore, ks: list[str], ref: list[np.ndarray], ns: bytes = NS) -> list[bool]:
    out = [np.empty_like(p) for p in ref]
    ok = st.get_into(ns, ks, out)
    return [bool(o and np.array_equal(a, b)) for o, a, b in zip(ok, out, ref)]


def misses(st: ChunkStore) -> dict[str, int]:
    return {k: v for k, v in st.stats()["counters"].items() if k.startswith("miss_")}


def _stories(st: ChunkStore, ks: list[str], ps: list[np.ndarray]) -> None:
    """Round trip, then each failure story on this store's first tier; every one a counted miss."""
    assert all(st.put(NS, ks, ps))
    assert all(get(st, ks, ps))
    rec = raw_record(st, NS, ks[0])
    h = codec.unpack_header(rec)
    assert h.sealed
    assert ps[0].tobytes()[:256] not in rec
    # copied byte for byte to another key of namespace B (another object on S3), then edited to claim it
    assert all(st.put(NS_B, ["b0"], [ps[1]]))
    plant(st, NS_B, "b0", rec)
    assert get(st, ["b0"], [ps[0]], ns=NS_B) == [False]
    plant(st, NS_B, "b0", with_identity(rec, NS_B, "b0"))
    assert get(st, ["b0"], [ps[0]], ns=NS_B) == [False]
    # a plaintext record with valid checksums, planted by a writer with no key
    header, parts, _ = codec.build_record(ps[2].view(np.uint8), itemsize=2, dtype=codec.DTYPE_CODES["u2"],
                                          digest=bytes(16), namespace=NS, compress=False)
    plant(st, NS, ks[2], with_identity(header + b"".join(bytes(memoryview(p)) for p in parts), NS, ks[2]))
    assert get(st, ks[2:3], ps[2:3]) == [False]
    # one flipped bit in the ciphertext, checksums made valid
    bad = bytearray(rec)
    bad[len(bad) // 2] ^= 0x10
    plant(st, NS, ks[0], forge_checksums(bad))
    assert get(st, ks[:1], ps[:1]) == [False]
    m = misses(st)
    assert m.get(f"miss_{AUTH}") == 2 and m.get(f"miss_{UNSEALED}") == 1 and m.get("miss_foreign") == 1, m
    assert all(get(st, ks[3:], ps[3:]))  # the rest still served


@pytest.mark.parametrize("kind", ["local", "nfs", "s3"])
def test_round_trip_and_failure_stories_on_every_tier(tmp_path: Path, kind: str, s3_endpoint: str) -> None:
    key = make_key(tmp_path / "keys")
    ks, ps = keys(12), [page(i) for i in range(12)]
    entry = tier_entry(kind, tmp_path, s3_endpoint)
    with store([entry], key) as st:
        _stories(st, ks, ps)
    with store([entry], key) as st:  # reopened: the index rebuilt from sealed units
        assert wait_for(lambda: st.count_leading_hits(NS, ks[3:]) == 9, timeout=10)
        assert all(get(st, ks[3:], ps[3:]))


def test_round_trip_on_s3rver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from s3_servers import S3RVER_KEY, S3RVER_SECRET, S3rver, require_s3rver

    srv = S3rver(require_s3rver()).start()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", S3RVER_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", S3RVER_SECRET)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    try:
        key = make_key(tmp_path / "keys")
        bucket = new_bucket(srv.endpoint, aws_access_key_id=S3RVER_KEY, aws_secret_access_key=S3RVER_SECRET)
        entry = {"type": "s3", "bucket": bucket, "prefix": "cache/", "endpoint_url": srv.endpoint,
                 "region": "us-east-1"}
        with store([entry], key) as st:
            _stories(st, keys(8), [page(i) for i in range(8)])
    finally:
        srv.stop()


@pytest.mark.parametrize("lower", ["nfs", "s3"])
def test_tiered_copies_are_compressed_then_sealed_and_promotions_sealed(tmp_path: Path, lower: str,
                                                                     s3_endpoint: str) -> None:
    """local (raw) over nfs / s3 (compressed): the background copy opens, compresses and seals again;
    a read from the lower tier promotes a sealed record; no tier holds a plaintext record."""
    from test_compression_tiers import kv_pages

    key = make_key(tmp_path / "keys")
    ks, ps = keys(10), kv_pages(10)
    storage = [tier_entry("local", tmp_path, name="nvme"), tier_entry(lower, tmp_path, s3_endpoint, name="shared")]
    with store(storage, key) as st:
        assert all(st.put(NS, ks, ps))
        st.flush()
        for level in (0, 1):
            hs = [codec.unpack_header(raw_record(st, NS, k, level)) for k in ks]
            assert all(h.sealed for h in hs)
            assert {h.codec for h in hs} == ({codec.RAW} if level == 0 else {payloads.PLANES})
    only_lower = [storage[1]]
    with store(only_lower, key) as st:
        assert all(get(st, ks, ps))
    (tmp_path / "fresh").mkdir()
    storage2 = [tier_entry("local", tmp_path, name="fresh/nvme"), storage[1]]
    with store(storage2, key) as st:
        assert wait_for(lambda: st.count_leading_hits(NS, ks) == 10, timeout=10)
        assert all(get(st, ks, ps))  # from the lower tier, promoted
        assert st.stats()["counters"].get("promotions") == 10
        assert all(codec.unpack_header(raw_record(st, NS, k, 0)).sealed for k in ks)
        assert all(get(st, ks, ps))


# ------------------------------------------------------------------ SGLang: factory, host pool, controller
def test_sglang_backup_and_prefetch_sealed_and_a_planted_page_is_a_miss(tmp_path: Path) -> None:
    sglang_pools = pytest.importorskip("sglang_pools", reason="SGLang 0.5.23 is not installed")
    key = make_key(tmp_path / "keys")
    dev, host = sglang_pools.mha_pools("layer_first")
    cache = sglang_pools.CpuHiCache(dev, host, sglang_pools.lifeboat_extra(
        tmp_path / "store", encryption={"keys": [str(key)]}))
    try:
        tokens = list(range(40 * 4))
        slots = host.alloc(len(tokens))
        sglang_pools.fill_random(host, slots, seed=3)
        expected = sglang_pools.flat_pages(host, slots)
        assert cache.backup(tokens, slots, prefix_keys=[]) == len(tokens)
        got = cache.prefetch(tokens, prefix_keys=[])
        assert got["loaded_tokens"] == len(tokens)
        assert sglang_pools.flat_pages(host, got["host_indices"]) == expected
        st = cache.backend.store
        assert st.sealer.active
        recs = [r for _, r in st.tiers[0].records()]
        assert len(recs) == 40
        # replace every stored page by a plaintext one with valid checksums: prefetch gets nothing, no raise
        for ikey, ref in list(st.tiers[0].records()):
            buf = bytearray(ref.length)
            assert st.tiers[0].read_into(ref, [memoryview(buf)])
            h = codec.unpack_header(buf)
            plain_len = h.raw_len
            hdr = codec.pack_header(codec.Header(codec.RAW, h.dtype, plain_len, plain_len, h.digest, h.namespace,
                                                 codec.payload_crc([bytes(plain_len)])))
            st.tiers[0].write(ikey, h.digest, [hdr, bytes(plain_len)], codec.HEADER_SIZE + plain_len)
        got = cache.prefetch(tokens, prefix_keys=[])
        assert got["loaded_tokens"] == 0
        assert st.stats()["counters"].get(f"miss_{UNSEALED}", 0) >= 1
    finally:
        cache.close()


# ------------------------------------------------------------------ MLX: writer and reader
def test_mlx_engine_round_trip_sealed_and_without_the_key_nothing_is_served(tmp_path: Path) -> None:
    mx = pytest.importorskip("mlx.core", reason="MLX is not installed (pip install 'mlx[cpu]')")
    pool_mod = pytest.importorskip("sglang.srt.hardware_backend.mlx.kv_cache.attention_kv_pool",
                                   reason="SGLang's MLX pool is not installed")
    from lifeboat_cache.runtimes import mlx as lbmlx

    key = make_key(tmp_path / "keys")
    C = lbmlx.CHUNK_TOKENS
    fp = lbmlx.ModelFingerprint(weights="w", dtype="float32", num_layers=3, n_kv_heads=2, head_dim=8)
    pool = pool_mod.MlxAttentionKVPool(1024, 3, 2, 8, dtype=mx.float32)
    for i in range(3):
        pool.k_buffer[i] = mx.random.normal((1024, 2, 8), key=mx.random.key(i))
        pool.v_buffer[i] = mx.random.normal((1024, 2, 8), key=mx.random.key(10 + i))
    mx.eval(*pool.all_buffers())
    entry = tier_entry("local", tmp_path, name="mlx")
    st = store([entry], key)
    eng = lbmlx.MlxChunkEngine(st, fp, queue_bytes=64 << 20, owns_store=True)
    ks = eng.keys(eng.seed(), list(range(3 * C)), 3)
    slots = [np.arange(1 + i * C, 1 + (i + 1) * C) for i in range(3)]
    assert eng.capture(pool, slots, ks) == 3
    assert eng.flush(10)
    read = eng.read(ks, 0)
    assert read.n_ok == 3
    want = np.array(lbmlx.numpy_view(lbmlx.gather_chunks(pool, np.concatenate(slots))))
    assert np.array_equal(read.buf, want)
    eng.close()
    other = make_key(tmp_path / "other")
    eng = lbmlx.MlxChunkEngine(store([entry], other), fp, queue_bytes=64 << 20, owns_store=True)
    try:
        assert eng.read(ks, 0).n_ok == 0  # another key: misses, no exception into the runtime
    finally:
        eng.close()


# ------------------------------------------------------------------ a sealed store says so, on every tier
@pytest.mark.parametrize("kind", ["nfs", "s3"])
def test_a_sealed_shared_tier_is_marked_and_refuses_a_writer_without_the_key(tmp_path: Path, kind: str,
                                                                             s3_endpoint: str) -> None:
    """The seal mark on an NFS-style shared directory (a file, fsync'd) and on S3 (an object under
    `<prefix>m/`): a process without the key refuses to open it for writing, one that only looks
    serves no plaintext record of it."""
    from lifeboat_cache.config import ConfigError
    from lifeboat_cache.records.keyring import Key, key_id, read_key_file
    from lifeboat_cache.records.seal_mark import mark_name, mark_verifies

    key = make_key(tmp_path / "keys")
    entry = tier_entry(kind, tmp_path, s3_endpoint)
    with store([entry], key) as st:
        assert all(st.put(NS, ["a"], [page(1)]))
    raw = read_key_file(key)
    name = mark_name(key_id(raw))
    if kind == "s3":
        body = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").get_object(
            Bucket=entry["bucket"], Key=f"cache/m/{name}")["Body"].read()
    else:
        body = (tmp_path / "t" / name).read_bytes()
    assert mark_verifies(Key(key_id(raw), key, None, raw), body)
    with pytest.raises(ConfigError, match="is a sealed store.*LIFEBOAT_KEY_FILE"):
        store([entry], None)
    doc = {"storage": [entry], "engine": {"io_workers": 2}}
    with ChunkStore.open(settings_from_dict(doc), background=False, seal=False) as look:
        header, parts, _ = codec.build_record(page(2).view(np.uint8), itemsize=2, dtype=codec.DTYPE_CODES["u2"],
                                              digest=bytes(16), namespace=NS, compress=False)
        plant(look, NS, "p", with_identity(header + b"".join(bytes(memoryview(p)) for p in parts), NS, "p"))
        assert get(look, ["p"], [page(2)]) == [False] and misses(look) == {f"miss_{UNSEALED}": 1}
    with store([entry], key) as st:  # the key holder still reads its page
        assert get(st, ["a"], [page(1)]) == [True]


@pytest.mark.parametrize("kind", ["nfs", "s3"])
def test_a_planted_plaintext_twin_never_shadows_the_page_on_a_shared_tier(tmp_path: Path, kind: str,
                                                                          s3_endpoint: str) -> None:
    """A writer with storage access and a key of its own (or none) adds plaintext twins of the
    victim's pages, newer than them (a newer S3 object, a newer segment with the index snapshot
    removed): the victim's fresh index keeps the copies that open, and every page is served."""
    key, other = make_key(tmp_path / "keys", "victim.key"), make_key(tmp_path / "keys", "attacker.key")
    entry = tier_entry(kind, tmp_path, s3_endpoint)
    ks, ps = keys(4), [page(i) for i in range(4)]
    with store([entry], key) as st:
        assert all(st.put(NS, ks, ps))
    with store([entry], other) as attacker:
        for k, p in zip(ks, ps):
            header, parts, _ = codec.build_record(p.view(np.uint8), itemsize=2, dtype=codec.DTYPE_CODES["u2"],
                                                  digest=bytes(16), namespace=NS, compress=False)
            plant(attacker, NS, k, with_identity(header + b"".join(bytes(memoryview(q)) for q in parts), NS, k))
    if kind == "nfs":
        (tmp_path / "t" / "index.snapshot").unlink()
    with store([entry], key) as st:
        assert get(st, ks, ps) == [True] * 4, misses(st)
        assert misses(st) == {}
