"""ChunkStore over the local segment tier: the failure stories, one test each."""

from __future__ import annotations

import threading
from functools import partial

import numpy as np
import pytest
from support import chunks
from support.chunks import keys, local_settings as settings, page

from lifeboat_cache import ChunkStore, namespace_fingerprint
from lifeboat_cache.records.keys import index_key, key_digest

NS = namespace_fingerprint(model="test", dtype="bfloat16", page_size=64)


read_back = partial(chunks.read_back, ns=NS)


@pytest.mark.parametrize("dtype", [np.uint16, np.float16, np.float32, np.uint8])
@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_round_trip_every_dtype(tmp_path, dtype, compression):
    s = settings(tmp_path)
    s = s.__class__(**{**s.__dict__, "engine": s.engine.__class__(**{**s.engine.__dict__, "compression": compression})})
    ks = keys(40)
    pages = [page(i).view(np.uint8).view(dtype) for i in range(40)]
    with ChunkStore.open(s, background=False) as st:
        assert all(st.put(NS, ks, pages))
        assert st.count_leading_hits(NS, ks) == 40
        assert all(read_back(st, ks, pages))
        ratio = st.stats()["compression_ratio"]
        if compression == "none":
            assert ratio == pytest.approx(1.0, abs=0.01)  # stored as is (payload bytes = page bytes)
        elif dtype in (np.uint16, np.float16):
            assert ratio > 1.0  # bf16-like bits: zstd gains on the exponent bytes
        else:
            assert ratio > 0.9  # random float32 / byte views: zstd may gain nothing, but never inflates much


def test_exists_counts_leading_hits_and_namespaces_are_disjoint(tmp_path):
    with ChunkStore.open(settings(tmp_path), background=False) as st:
        ks = keys(10)
        st.put(NS, ks[:4] + ks[5:], [page(i) for i in range(10) if i != 4])
        assert st.count_leading_hits(NS, ks) == 4
        assert st.contains(NS, ks) == [True] * 4 + [False] + [True] * 5
        other = namespace_fingerprint(model="test", dtype="bfloat16", page_size=16)
        assert st.count_leading_hits(other, ks) == 0
        out = [np.empty_like(page(0))]
        assert st.get_into(other, ks[:1], out) == [False]


def test_exists_never_hits_a_key_not_stored_in_that_namespace(tmp_path):
    """Property: over two namespaces that store overlapping sets of the same key strings, exists
    (`contains` and `count_leading_hits`, first asked and then again from the digest cache) says
    stored for exactly the (namespace, key) pairs stored there: random keys never stored, and keys
    stored only in the other namespace, miss. A str key and its UTF-8 bytes are one key."""
    from hypothesis import HealthCheck, given, settings as hsettings, strategies as hs

    other = namespace_fingerprint(model="test", dtype="bfloat16", page_size=16)
    shared = [f"{i:064x}" for i in range(120)]
    stored = {NS: set(shared[:80]), other: set(shared[40:])}  # 40..79 in both, 0..39 / 80..119 in one
    key = hs.one_of(hs.sampled_from(shared), hs.text(max_size=70), hs.binary(max_size=70),
                    hs.sampled_from(shared).map(str.encode))
    with ChunkStore.open(settings(tmp_path), background=False) as st:
        for ns, ks in stored.items():
            ks = sorted(ks)
            assert all(st.put(ns, ks, [page(i, n=64) for i in range(len(ks))]))

        def model(ns: bytes, k: str | bytes) -> bool:
            return (k if isinstance(k, str) else k.decode("utf-8", "replace")) in stored[ns] and (
                isinstance(k, str) or k.decode("utf-8", "replace").encode() == k)

        @hsettings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
        @given(qs=hs.lists(key, max_size=40), put_new=hs.lists(hs.text(min_size=1, max_size=20), max_size=5),
               into=hs.sampled_from([NS, other]))
        def check(qs, put_new, into):
            new = [k for k in put_new if k not in stored[into]]
            if new:  # keys stored while the property runs hit from then on, in that namespace only
                assert all(st.put(into, new, [page(i, n=64) for i in range(len(new))]))
                stored[into].update(new)
            for ns in (NS, other):
                want = [model(ns, k) for k in qs]
                lead = want.index(False) if False in want else len(want)
                for _ in range(2):  # digests computed, then from the cache
                    assert st.contains(ns, qs) == want
                    assert st.count_leading_hits(ns, qs) == lead

        check()
        assert st.count_leading_hits(NS, [f"{i:064x}" for i in range(120, 10_000)]) == 0
        assert not any(st.contains(other, [f"{i:064x}" for i in range(120, 10_000)]))


def test_corrupt_payload_is_miss_and_dropped(tmp_path):
    ks, pages = keys(10), [page(i) for i in range(10)]
    with ChunkStore.open(settings(tmp_path), background=False) as st:
        st.put(NS, ks, pages)
        st.flush()
    with ChunkStore.open(settings(tmp_path), background=False) as st:
        ref = st.tiers[0].locate(index_key(key_digest(NS, ks[3])))
        seg = tmp_path / st.tiers[0].loc_name(ref).split("@")[0]
        chunks.flip_byte(seg, ref.loc.offset + 64 + 500)
        res = read_back(st, ks, pages)
        assert res == [True] * 3 + [False] + [True] * 6
        assert st.contains(NS, ks)[3] is False  # dropped from the index
        assert st.stats()["counters"]["miss_checksum"] == 1
    with ChunkStore.open(settings(tmp_path)) as st:  # quarantined: a rescan does not bring it back
        assert st.wait_rebuilt(10)
        assert st.contains(NS, ks)[3] is False


def test_verify_reports_and_quarantines(tmp_path):
    ks, pages = keys(20), [page(i) for i in range(20)]
    with ChunkStore.open(settings(tmp_path), background=False) as st:
        st.put(NS, ks, pages)
        st.flush()
        seg = next(tmp_path.glob("*.seg"))
        with open(seg, "r+b") as f:
            f.seek(64 + 10)
            f.write(b"\xff\xff\xff")
        problems = st.verify(fix=True)
        assert len(problems) == 1 and "checksum" in problems[0]
        assert st.verify() == []
        assert sum(st.contains(NS, ks)) == 19


def test_concurrent_callers(tmp_path):
    with ChunkStore.open(settings(tmp_path), background=False) as st:
        errors: list[BaseException] = []

        def worker(t: int) -> None:
            try:
                ks = keys(50, prefix=f"t{t}-")
                ps = [page(t * 1000 + i) for i in range(50)]
                assert all(st.put(NS, ks, ps))
                assert all(read_back(st, ks, ps))
                assert st.count_leading_hits(NS, ks) == 50
            except BaseException as e:  # surfaced below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert st.verify() == []


@pytest.fixture
def tiny_fs(tmpfs_mount):
    return tmpfs_mount("2m")


def test_full_disk_drops_writes_and_cools_down(tiny_fs, caplog):
    s = settings(tiny_fs, capacity="64MiB", segment_size="1MiB")
    with ChunkStore.open(s, background=False) as st:
        ks = keys(200)
        results = []
        for i in range(0, 200, 10):
            results += st.put(NS, ks[i:i + 10], [page(j, n=16384) for j in range(i, i + 10)])
        assert any(results) and not all(results)  # some landed, the rest were dropped
        c = st.stats()["counters"]
        assert c.get("write_errors", 0) + c.get("writes_dropped_cooldown", 0) >= results.count(False)
        stored = [k for k, ok in zip(ks, results) if ok]
        assert all(st.contains(NS, stored))
        assert all(read_back(st, stored, [page(int(k[1:]), n=16384) for k in stored]))
        assert sum("skipping the tier" in r.message for r in caplog.records) >= 1


def test_unwritable_path_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OSError, match="not writable"):
        ChunkStore.open(settings(blocker / "sub"))


def test_wrong_sized_buffer_is_a_miss_not_a_partial_copy(tmp_path):
    with ChunkStore.open(settings(tmp_path), background=False) as st:
        st.put(NS, ["a"], [page(1)])
        small = np.zeros(100, dtype=np.uint16)
        assert st.get_into(NS, ["a"], [small]) == [False]
        assert (small == 0).all()  # a miss leaves the caller's buffer untouched: no partial copy
        assert st.contains(NS, ["a"]) == [True]  # an intact record is not dropped for a caller's mistake


@pytest.mark.parametrize("ns", [b"ns", b"x" * 32, "n" * 16, bytearray(16), None])
def test_a_namespace_that_is_not_a_fingerprint_raises(tmp_path, ns):
    """`put(b"ns", ...)` returned [True], then a fresh process got contains [True] and get_into [False]:
    a caller bug must raise on every call, and nothing is written."""
    with ChunkStore.open(settings(tmp_path), background=False) as st:
        for call in (lambda: st.put(ns, ["k1"], [page(0)]), lambda: st.contains(ns, ["k1"]),
                     lambda: st.get_into(ns, ["k1"], [np.zeros_like(page(0))]),
                     lambda: st.count_leading_hits(ns, ["k1"]), lambda: st.affinity_of(ns, ["k1"])):
            with pytest.raises(ValueError, match="namespace_fingerprint"):
                call()
        assert st.stats()["tiers"][0]["pages"] == 0
    with ChunkStore.open(settings(tmp_path), background=False) as st:  # a fresh process: contains == get_into
        buf = np.zeros_like(page(0))
        assert st.contains(NS, ["k1"]) == st.get_into(NS, ["k1"], [buf]) == [False]
