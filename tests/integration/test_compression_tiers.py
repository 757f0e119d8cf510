"""Compression where it pays: the per-tier rule (local raw, nfs / s3 compressed, `compression:`
overrides), the background copy re-encoding for a compressing tier, raw promotion, and crafted
records whose declared sizes do not fit the destination (misses, with no read or allocation of
what they declare). Real files, real tiers, the public ChunkStore API.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lifeboat_cache import ChunkStore, namespace_fingerprint
from lifeboat_cache.config import ConfigError, TierSettings, settings_from_dict
from lifeboat_cache.records import codec, payloads
from lifeboat_cache.records.codec import HEADER_SIZE
from lifeboat_cache.records.keys import index_key, key_digest
from lifeboat_cache.store import compresses

NS = namespace_fingerprint(model="compression-test", dtype="bfloat16", page_size=64)


def kv_pages(n: int, size: int = 1 << 15, seed: int = 0) -> list[np.ndarray]:
    """bf16 bit patterns of N(0,1) x per-channel scales: sign/exponent bytes compress like real KV."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        scale = np.exp(rng.standard_normal(64)).astype(np.float32).repeat(size // 64)
        x = rng.standard_normal(size).astype(np.float32) * scale
        out.append((x.view(np.uint32) >> 16).astype(np.uint16))
    return out


def tier(kind: str, path: Path, **kw: Any) -> dict[str, Any]:
    t = {"type": kind, "path": str(path), "capacity": "256MiB", "segment_size": "4MiB", **kw}
    if kind == "nfs":
        t["seal_after_s"] = 0.2
    return t


def records(st: ChunkStore, level: int) -> list[codec.Header]:
    t = st.tiers[level]
    out = []
    for _, ref in t.records():
        rec = bytearray(ref.length)
        assert t.read_into(ref, [memoryview(rec)])
        h = codec.unpack_header(rec)
        codec.verify_record(h, memoryview(rec)[HEADER_SIZE:], digest=h.digest, namespace=h.namespace)
        out.append(h)
    return out


@pytest.mark.parametrize("kind,engine,own,expected", [
    ("local", "auto", None, False), ("nfs", "auto", None, True), ("s3", "auto", None, True),
    ("local", "zstd", None, True), ("nfs", "none", None, False),
    ("local", "auto", "zstd", True), ("s3", "zstd", "none", False), ("nfs", "none", "auto", True),
])
def test_the_rule_per_tier(kind: str, engine: str, own: str | None, expected: bool) -> None:
    assert compresses(TierSettings(type=kind, compression=own), engine) is expected


def test_compression_is_a_tier_setting_and_bad_values_name_the_key(tmp_path: Path) -> None:
    s = settings_from_dict({"storage": [tier("local", tmp_path / "a", compression="zstd"),
                                        tier("nfs", tmp_path / "b")]})
    assert s.engine.compression == "auto"
    assert [t.compression for t in s.storage] == ["zstd", None]
    with pytest.raises(ConfigError, match=r"storage\[1\]\.compression: must be one of auto, zstd, none"):
        settings_from_dict({"storage": [tier("local", tmp_path / "a"), tier("nfs", tmp_path / "b", compression="lz4")]})


def test_local_tier_stores_raw_and_the_nfs_copy_is_compressed(tmp_path: Path) -> None:
    ks, ps = [f"k{i}" for i in range(12)], kv_pages(12)
    settings = settings_from_dict({"storage": [tier("local", tmp_path / "nvme"), tier("nfs", tmp_path / "nfs")],
                                   "engine": {"io_workers": 4}})
    with ChunkStore.open(settings, background=False) as st:
        assert st.tier_compress == [False, True]
        assert all(st.put(NS, ks, ps))
        st.flush()
        local, remote = records(st, 0), records(st, 1)
        assert len(local) == len(remote) == 12
        assert {h.codec for h in local} == {codec.RAW}
        assert {h.codec for h in remote} == {payloads.PLANES}
        assert sum(h.raw_len for h in remote) / sum(h.stored_len for h in remote) > 1.1
    # a host with an empty local drive reads the compressed copy and promotes it raw
    settings = settings_from_dict({"storage": [tier("local", tmp_path / "nvme2"), tier("nfs", tmp_path / "nfs")],
                                   "engine": {"io_workers": 4}})
    with ChunkStore.open(settings, background=False) as st:
        out = [np.zeros_like(p) for p in ps]
        assert all(st.get_into(NS, ks, out))
        assert all((a == b).all() for a, b in zip(out, ps))
        assert st.counters.get("promotions") == 12
        assert {h.codec for h in records(st, 0)} == {codec.RAW}
        out = [np.zeros_like(p) for p in ps]
        assert all(st.get_into(NS, ks, out)) and all((a == b).all() for a, b in zip(out, ps))


def test_engine_compression_zstd_compresses_the_local_tier(tmp_path: Path) -> None:
    ks, ps = [f"k{i}" for i in range(4)], kv_pages(4)
    settings = settings_from_dict({"storage": [tier("local", tmp_path / "a")], "engine": {"compression": "zstd"}})
    with ChunkStore.open(settings, background=False) as st:
        assert all(st.put(NS, ks, ps))
        assert {h.codec for h in records(st, 0)} == {payloads.PLANES}
        out = [np.zeros_like(p) for p in ps]
        assert all(st.get_into(NS, ks, out)) and all((a == b).all() for a, b in zip(out, ps))


def _forged(key: str, raw_len: int, payload: bytes, kind: int = payloads.PLANES) -> bytes:
    """A record with valid checksums for whatever it declares (anyone who can write the store can)."""
    h = codec.Header(kind, 5, raw_len, len(payload), key_digest(NS, key), NS, codec.payload_crc([payload]))
    return codec.pack_header(h) + payload


@pytest.mark.parametrize("dest_bytes", [16 << 10, 64 << 10])
def test_a_record_declaring_1_gib_is_a_miss_with_no_big_allocation(tmp_path: Path, dest_bytes: int) -> None:
    import resource

    import zstandard

    cctx = zstandard.ZstdCompressor(level=1)
    planes = []
    for _ in range(2):  # each plane: a valid frame of 512 MiB of zeros (a few KiB of payload)
        c = cctx.compressobj(size=512 << 20)
        planes.append(b"".join(c.compress(bytes(1 << 20)) for _ in range(512)) + c.flush())
    payload = np.array([len(p) for p in planes], "<u4").tobytes() + b"".join(planes)
    rec = _forged("crafted", 1 << 30, payload)
    settings = settings_from_dict({"storage": [tier("local", tmp_path / "a")]})
    with ChunkStore.open(settings, background=False) as st:
        dg = key_digest(NS, "crafted")
        st.tiers[0].write(index_key(dg), dg, [rec], len(rec))
        assert st.contains(NS, ["crafted"]) == [True]
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for _ in range(3):
            assert st.get_into(NS, ["crafted"], [np.zeros(dest_bytes, np.uint8)]) == [False]
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 32 << 10  # KiB
        assert st.counters.get("miss_size") == 3
        assert st.contains(NS, ["crafted"]) == [True]  # an intact record of another size is left alone


def test_a_record_whose_frame_lies_about_its_page_is_dropped_without_decoding_the_lie(tmp_path: Path) -> None:
    """The issue's case: raw length = the page, valid checksums, one plane's zstd frame declaring 1 GiB."""
    import resource

    import zstandard

    page_bytes = 256 << 10
    c = zstandard.ZstdCompressor(level=1).compressobj(size=1 << 30)
    lie = b"".join(c.compress(bytes(1 << 20)) for _ in range(1024)) + c.flush()
    assert len(lie) < page_bytes // 2  # fits in a plane: the plane table adds up
    honest = zstandard.ZstdCompressor().compress(bytes(page_bytes // 2))
    payload = np.array([len(lie), len(honest)], "<u4").tobytes() + lie + honest
    rec = _forged("liar", page_bytes, payload)
    settings = settings_from_dict({"storage": [tier("local", tmp_path / "a")]})
    with ChunkStore.open(settings, background=False) as st:
        dg = key_digest(NS, "liar")
        st.tiers[0].write(index_key(dg), dg, [rec], len(rec))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        assert st.get_into(NS, ["liar"], [np.zeros(page_bytes, np.uint8)]) == [False]
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 << 10  # KiB: not 1 GiB
        assert st.counters.get("miss_payload") == 1
        assert st.contains(NS, ["liar"]) == [False]  # a record that fails verification is dropped


@pytest.mark.parametrize("compress", [False, True])
def test_version_1_records_written_by_the_previous_release_still_read_after_a_reopen(tmp_path: Path,
                                                                                    compress: bool) -> None:
    """Format 1 (CRC-32) records in a store's segments: served, and found again by the recovery scan."""
    import zlib

    page = kv_pages(1)[0]
    flat = codec.as_bytes_view(page)
    c, parts = codec.encode(flat, 2, compress)
    payload = b"".join(bytes(memoryview(p).cast("B")) for p in parts)
    dg = key_digest(NS, "old")
    h = codec.Header(c, 5, flat.nbytes, len(payload), dg, NS, zlib.crc32(payload), version=1)
    rec = codec.pack_header(h) + payload
    assert rec[4] == 1
    settings = settings_from_dict({"storage": [tier("local", tmp_path / "a")]})
    with ChunkStore.open(settings, background=False) as st:
        st.tiers[0].write(index_key(dg), dg, [rec], len(rec))
        out = np.zeros_like(page)
        assert st.get_into(NS, ["old"], [out]) == [True] and (out == page).all()
        st.put(NS, ["new"], [page])  # a version-2 record next to it
    for f in (tmp_path / "a").rglob("*"):  # no snapshot: the index is rebuilt by scanning the records
        if f.is_file() and "snap" in f.name:
            f.unlink()
    with ChunkStore.open(settings, background=False) as st:
        out = [np.zeros_like(page), np.zeros_like(page)]
        assert st.get_into(NS, ["old", "new"], out) == [True, True]
        assert all((o == page).all() for o in out)
        assert st.verify() == []
