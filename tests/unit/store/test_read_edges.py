"""Failure branches of the chunk store that had no test: each is a miss (or a slower start), never an
exception and never a wrong page.

Only public surfaces are used (ChunkStore, settings, the tier classes, the on-disk files), so the
tests survive the store/segment restructuring: records are found by their magic on disk, not
through the segment module's internals.
"""

from __future__ import annotations

import errno
import logging
import os
import time
import zlib
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from support import chunks
from support.chunks import keys, page

from lifeboat_cache import ChunkStore, namespace_fingerprint
from lifeboat_cache.config import settings_from_dict
from lifeboat_cache.records import codec
from lifeboat_cache.records.keys import index_key, key_digest
from lifeboat_cache.testing.memory import MemoryTier
from lifeboat_cache.tiers.local import LocalTier

NS = namespace_fingerprint(model="edges", dtype="bfloat16", page_size=64)
read_back = partial(chunks.read_back, ns=NS)
UNKNOWN_VERSION = 99  # a format version no build of this code knows


def settings(path: Path, kind: str = "local", **engine):
    eng = {"io_workers": 2, "compression": "none", "failure_cooldown_s": 0.2, "failure_cooldown_max_s": 0.4,
           **engine}
    return settings_from_dict({"storage": [{"type": kind, "path": str(path), "segment_size": "4MiB"}],
                               "engine": eng})


def record_offsets(data: bytes) -> list[int]:
    """Offsets of valid record headers in a file's bytes (found by magic, then checked)."""
    out, pos = [], data.find(codec.MAGIC)
    while pos >= 0:
        try:
            codec.unpack_header(data[pos: pos + codec.HEADER_SIZE])
            out.append(pos)
        except codec.RecordError:
            pass
        pos = data.find(codec.MAGIC, pos + 1)
    return out


def files_with_records(root: Path) -> dict[Path, list[int]]:
    found = {}
    for p in root.rglob("*"):
        if p.is_file():
            offs = record_offsets(p.read_bytes())
            if offs:
                found[p] = offs
    return found


def set_version(path: Path, offset: int, version: int) -> None:
    """Rewrite one header's format version and re-seal its header CRC, as a build that writes
    `version` would have: the record is well formed, only of a version this build does not read."""
    data = bytearray(path.read_bytes())
    body_size = codec.HEADER_BODY_SIZE
    assert data[offset + 4] == codec.FORMAT_VERSION, "header layout changed: magic (4 bytes), then version"
    data[offset + 4] = version
    crc = zlib.crc32(bytes(data[offset: offset + body_size]))
    data[offset + body_size: offset + body_size + 4] = crc.to_bytes(4, "little")
    path.write_bytes(bytes(data))


# ------------------------------------------------------------------------------ format versions
@pytest.mark.parametrize("snapshot", [True, False], ids=["indexed-from-snapshot", "rescanned"])
def test_record_of_an_unknown_format_version_is_a_clean_miss(tmp_path: Path, snapshot: bool) -> None:
    ks, ps = keys(6), [page(i) for i in range(6)]
    with ChunkStore.open(settings(tmp_path), background=False) as st:
        assert all(st.put(NS, ks, ps))
    files = files_with_records(tmp_path)
    assert sum(len(v) for v in files.values()) == 6
    seg, offs = next(iter(files.items()))
    set_version(seg, offs[0], UNKNOWN_VERSION)
    with pytest.raises(codec.RecordError, match=f"format version {UNKNOWN_VERSION}"):
        codec.unpack_header(seg.read_bytes()[offs[0]: offs[0] + codec.HEADER_SIZE])
    if not snapshot:
        for p in tmp_path.rglob("*.snapshot*"):
            p.unlink()
    with ChunkStore.open(settings(tmp_path)) as st:
        assert st.wait_rebuilt(10)
        res = read_back(st, ks, ps)
        assert res.count(False) >= 1 and not all(res)  # the unknown record is a miss ...
        assert any(res)  # ... and the store still serves the records it can read
        bad = [k for k, ok in zip(ks, res) if not ok]
        out = [np.zeros_like(ps[0])]
        assert st.get_into(NS, bad[:1], out) == [False] and not out[0].any()  # nothing half-copied
        assert st.count_leading_hits(NS, bad[:1]) == 0


def test_snapshot_of_another_version_is_ignored_and_rescanned(tmp_path: Path, caplog) -> None:
    ks, ps = keys(40), [page(i) for i in range(40)]
    with ChunkStore.open(settings(tmp_path), background=False) as st:
        st.put(NS, ks, ps)
    snaps = list(tmp_path.rglob("*.snapshot*"))
    assert len(snaps) == 1
    data = bytearray(snaps[0].read_bytes())
    assert data[:8] == b"LBIXSNAP"
    data[8:12] = UNKNOWN_VERSION.to_bytes(4, "little")  # the header's version field
    snaps[0].write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        with ChunkStore.open(settings(tmp_path)) as st:
            assert st.wait_rebuilt(10)
            assert st.count_leading_hits(NS, ks) == 40 and all(read_back(st, ks, ps))
    assert any(f"snapshot version {UNKNOWN_VERSION}" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------------------------ NFS: ESTALE
def test_nfs_estale_on_read_is_a_miss_not_a_tier_failure(tmp_path: Path, monkeypatch) -> None:
    """Another host evicted the segment while it was open here: NFS answers ESTALE.

    No NFS server runs in the test machine, so the kernel's answer is injected at the system call
    (`os.preadv` raises OSError(ESTALE)); everything above it is the real `type: nfs` tier.
    """
    ks, ps = keys(8), [page(i) for i in range(8)]
    st = ChunkStore.open(settings(tmp_path, kind="nfs"), background=False)
    try:
        assert all(st.put(NS, ks, ps))
        st.flush()
        real = os.preadv

        def stale(fd, bufs, offset, *a):
            raise OSError(errno.ESTALE, os.strerror(errno.ESTALE))

        monkeypatch.setattr(os, "preadv", stale)
        assert read_back(st, ks[:1], ps[:1]) == [False]
        monkeypatch.setattr(os, "preadv", real)
        c = st.stats()
        assert c["counters"].get("read_errors", 0) == 0  # a stale location, not a failing tier
        assert not c["tiers"][0]["reads_cooling_down"]
        assert c["tiers"][0]["stale_handles"] == 1 and c["counters"]["miss_stale"] == 1  # counted
        assert all(st.put(NS, ["after"], [page(99)])) and read_back(st, ["after"], [page(99)]) == [True]
    finally:
        st.close()


# ------------------------------------------------------------------------------ verify
def _memory_store(tmp_path: Path, units: dict) -> ChunkStore:
    s = settings(tmp_path / "unused")
    return ChunkStore(s, [MemoryTier(units)])


def test_verify_reports_a_foreign_record(tmp_path: Path) -> None:
    """Two records of equal length swap places: each is intact but stored under the other's key."""
    units: dict[int, bytearray] = {}
    st = _memory_store(tmp_path, units)
    assert all(st.put(NS, ["a", "b"], [page(1), page(2)]))
    tier = st.tiers[0]
    ra, rb = (tier.locate(index_key(key_digest(NS, k))) for k in ("a", "b"))
    assert ra.length == rb.length
    ua, ub = units[ra.loc.unit], units[rb.loc.unit]
    a = bytes(ua[ra.loc.offset: ra.loc.offset + ra.length])
    ua[ra.loc.offset: ra.loc.offset + ra.length] = ub[rb.loc.offset: rb.loc.offset + rb.length]
    ub[rb.loc.offset: rb.loc.offset + rb.length] = a
    problems = st.verify()
    assert len(problems) == 2 and all("foreign" in p for p in problems), problems
    out = [np.empty_like(page(1))]
    assert st.get_into(NS, ["a"], out) == [False]  # never served under the wrong key
    st.close()


def test_verify_reports_truncated_records(tmp_path: Path) -> None:
    units: dict[int, bytearray] = {}
    st = _memory_store(tmp_path, units)
    assert all(st.put(NS, ["a"], [page(1)])) and all(st.put(NS, ["b"], [page(2)]))
    tier = st.tiers[0]
    ra = tier.locate(index_key(key_digest(NS, "a")))
    del units[ra.loc.unit][ra.loc.offset + ra.length // 2:]  # the unit lost its tail
    problems = st.verify(fix=True)
    assert len(problems) == 1 and "truncated" in problems[0], problems
    assert st.contains(NS, ["a", "b"]) == [False, True]  # quarantined; the intact one stays
    assert st.verify() == []
    st.close()


# ------------------------------------------------------------------------------ promotion
@pytest.fixture
def tiny_fs(tmpfs_mount):
    return tmpfs_mount("1m")


def _fill(path: Path) -> Path:
    filler = path / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC
    return filler


def test_failed_promotion_still_serves_the_lower_tier_hit(tiny_fs: Path, tmp_path: Path) -> None:
    """A hit on the lower tier cannot be copied up (the first tier's disk is really full): the read
    still succeeds from the lower tier, nothing raises, and promotion resumes once there is room."""
    units: dict[int, bytearray] = {}
    s = settings_from_dict({"storage": [{"type": "local", "path": str(tiny_fs / "store"), "segment_size": "1MiB"},
                                        {"type": "local", "path": str(tmp_path / "unused-lower")}],
                            "engine": {"io_workers": 2, "compression": "none", "failure_cooldown_s": 0.2,
                                       "failure_cooldown_max_s": 0.4}})
    lower = MemoryTier(units)
    seed = ChunkStore(s, [lower])
    ks, ps = keys(4), [page(i, n=32768) for i in range(4)]  # 64 KiB pages
    assert all(seed.put(NS, ks, ps))
    first = LocalTier(s.storage[0]).open(background=False)
    filler = _fill(tiny_fs)
    st = ChunkStore(s, [first, MemoryTier(units)])
    try:
        assert read_back(st, ks[:2], ps[:2]) == [True, True]  # served from the lower tier
        c = st.stats()["counters"]
        assert c.get("hits_tier1", 0) == 2 and c.get("promotions", 0) == 0
        assert first.locate(index_key(key_digest(NS, ks[0]))) is None
        filler.unlink()
        time.sleep(0.45)  # past the write cooldown (max 0.4 s)
        assert read_back(st, ks[2:], ps[2:]) == [True, True]
        assert st.stats()["counters"].get("promotions", 0) >= 1
    finally:
        st.close()
