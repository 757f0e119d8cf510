"""Runs: a put's pages written as a few runs (one reservation, pwritev calls of at most write_call_size,
one index insert each) and a get's adjacent records read with one preadv, over real segment files (tmpfs
where a full disk is needed).
Every record is still verified before its page counts; a full disk keeps only whole records indexed."""

from __future__ import annotations

import errno
import gc
import os
import threading
import time
from collections import Counter
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from support import chunks
from support.chunks import flip_byte, keys, page

from lifeboat_cache import ChunkStore, fsio, namespace_fingerprint
from lifeboat_cache.config import settings_from_dict
from lifeboat_cache.records import codec
from lifeboat_cache.records.codec import HEADER_SIZE
from lifeboat_cache.records.keys import index_key, key_digest
from lifeboat_cache.store import calls as store_calls, pages as store_pages, read as store_read, write as store_write
from lifeboat_cache.testing.tiers import make_records
from lifeboat_cache.tiers.segments import (
    DirSettings,
    SegmentDir,
    reads as seg_reads,
    writers as seg_writers,
)

NS = namespace_fingerprint(model="test-runs", dtype="bfloat16", page_size=64)
read_back = partial(chunks.read_back, ns=NS)


def settings(path: Path, engine: dict | None = None, **tier):
    t = {"type": "local", "path": str(path), "capacity": "1GiB", "segment_size": "4MiB", **tier}
    return settings_from_dict({"storage": [t], "engine": {"io_workers": 4, "failure_cooldown_s": 0.2,
                                                          "failure_cooldown_max_s": 0.8, **(engine or {})}})


def blocks(i: int, n: int, elems: int = 64) -> list[np.ndarray]:
    """A layer_first-like page: n separate 1-D blocks (each one iovec)."""
    rng = np.random.default_rng(i)
    return [rng.integers(0, 2**16, elems, dtype=np.uint16) for _ in range(n)]


def ref_of(st: ChunkStore, key: str):  # type: ignore[no-untyped-def]
    return st.tiers[0].locate(index_key(key_digest(NS, key)))


def seg_path(st: ChunkStore, ref) -> Path:  # type: ignore[no-untyped-def]
    d = st.tiers[0].dirs[ref.part]
    return d.path / d.unit_name(ref.loc.unit)


class Calls:
    """Counts the real system calls (and the iovecs of each) while delegating to them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n: Counter[str] = Counter()
        self.iovecs: list[int] = []
        for name in ("pwritev", "preadv"):
            real = getattr(os, name)

            def spy(fd, bufs, offset, *a, _real=real, _name=name):  # type: ignore[no-untyped-def]
                self.n[_name] += 1
                self.iovecs.append(len(bufs))
                return _real(fd, bufs, offset, *a)

            monkeypatch.setattr(os, name, spy)


# ------------------------------------------------------------------------------ write and read back
@pytest.mark.parametrize("compression", ["auto", "zstd"])
@pytest.mark.parametrize("layout", ["flat", "blocks"])
def test_runs_write_and_read_back_byte_exact(tmp_path, monkeypatch, compression, layout):
    n = 37  # not a multiple of the run count
    ps = [page(i) for i in range(n)] if layout == "flat" else [blocks(i, 48) for i in range(n)]
    ks = keys(n)
    with ChunkStore.open(settings(tmp_path, engine={"compression": compression}), background=False) as st:
        calls = Calls(monkeypatch)
        assert all(st.put(NS, ks, ps))
        assert calls.n["pwritev"] <= store_write.WRITE_RUNS  # one per run, not one per page
        calls.n.clear()
        out = [np.empty(8192, np.uint16) for _ in range(n)] if layout == "flat" else \
            [[np.empty(64, np.uint16) for _ in range(48)] for _ in range(n)]
        assert all(st.get_into(NS, ks, out))
        assert calls.n["preadv"] <= 2 * store_read.READ_RUNS  # coalesced: one per stretch of adjacent records
        for o, p in zip(out, ps):
            assert (np.concatenate(o) == np.concatenate(p)).all() if layout == "blocks" else (o == p).all()
        c = st.stats()["counters"]
        assert c["pages_written"] == n and c["pages_read"] == n
        assert st.verify() == []
    with ChunkStore.open(settings(tmp_path, engine={"compression": compression}), background=False) as st:
        flat = [np.concatenate(p) if layout == "blocks" else p for p in ps]
        assert all(read_back(st, ks, flat))  # from the trailers / snapshot after a reopen


def test_index_sees_a_run_only_after_its_bytes_are_written(tmp_path, monkeypatch):
    d = SegmentDir(tmp_path / "s", DirSettings(capacity_bytes=1 << 30, segment_bytes=4 << 20))
    d.open(background=False)
    recs = make_records(10, size=3000)
    real, seen = seg_writers.pwritev_all, []

    def check(fd, bufs, offset, *bound):  # type: ignore[no-untyped-def]
        seen.append(int(d.index.contains(np.array([r.ikey for r in recs], np.int64)).sum()))
        return real(fd, bufs, offset, *bound)

    monkeypatch.setattr(seg_writers, "pwritev_all", check)
    locs, err = d.append_many([(r.ikey, r.digest, r.bufs, r.length) for r in recs])
    assert err is None and len(locs) == 10 and seen == [0]  # one write for the run, nothing indexed before it
    assert d.index.contains(np.array([r.ikey for r in recs], np.int64)).all()
    assert [d.index.get(r.ikey) for r in recs] == locs
    assert all(b.offset == a.offset + a.length for a, b in zip(locs, locs[1:]))  # one contiguous run
    d.close()


def test_run_crossing_a_segment_boundary(tmp_path):
    d = SegmentDir(tmp_path / "s", DirSettings(capacity_bytes=1 << 30, segment_bytes=64 << 10))
    d.open(background=False)
    recs = make_records(40, size=4000)  # ~160 KiB: three segments
    locs, err = d.append_many([(r.ikey, r.digest, r.bufs, r.length) for r in recs])
    assert err is None and len(locs) == 40
    units = sorted({loc.unit for loc in locs})
    assert len(units) >= 3
    for u in units:  # each segment holds at most segment_bytes of records
        assert sum(loc.length for loc in locs if loc.unit == u) <= 64 << 10
    bufs = [bytearray(r.length) for r in recs]
    assert d.read_run(locs, [[memoryview(b)] for b in bufs]) == [True] * 40
    assert [bytes(b) for b in bufs] == [r.blob for r in recs]
    d.close()
    d2 = SegmentDir(tmp_path / "s", DirSettings(capacity_bytes=1 << 30, segment_bytes=64 << 10))
    d2.open(background=False)  # the segments the run filled were sealed with trailers listing it
    assert d2.index.contains(np.array([r.ikey for r in recs], np.int64)).all()
    assert d2.audit() == [] and d2.counters["scan_torn"] == 0
    d2.close()


def test_store_run_crossing_segments_reads_back(tmp_path):
    ks, ps = keys(48), [page(i, n=65536) for i in range(48)]  # 128 KiB pages, 1 MiB segments
    with ChunkStore.open(settings(tmp_path, segment_size="1MiB"), background=False) as st:
        assert all(st.put(NS, ks, ps))
        assert len({ref_of(st, k).loc.unit for k in ks}) >= 6
        assert all(read_back(st, ks, ps))
        assert st.verify() == []


# ------------------------------------------------------------------------------ full disk
@pytest.fixture
def tiny_fs(tmpfs_mount):
    return tmpfs_mount("1m")


def _indexed(d: SegmentDir, recs) -> list[bool]:  # type: ignore[no-untyped-def]
    return d.index.contains(np.array([r.ikey for r in recs], np.int64)).tolist()


@pytest.mark.parametrize("fallocate", [True, False], ids=["reserved", "no-fallocate"])
def test_enospc_mid_run_indexes_only_whole_records(tiny_fs, monkeypatch, fallocate):
    """A run larger than the free space of a real (1 MiB tmpfs) disk: the leading records that fit are
    written and indexed, the rest dropped and reported; never a partial record. Without fallocate (some
    NFS servers) the write itself runs out of space part-way through a record."""
    if not fallocate:
        monkeypatch.setattr(seg_writers, "reserve_space", lambda fd, off, n: None)
    d = SegmentDir(tiny_fs / "s", DirSettings(capacity_bytes=64 << 20, segment_bytes=16 << 20))
    d.open(background=False)
    recs = make_records(40, size=50_000)  # ~2 MiB for a 1 MiB disk
    locs, err = d.append_many([(r.ikey, r.digest, r.bufs, r.length) for r in recs])
    assert err is not None and err.errno == errno.ENOSPC
    assert 0 < len(locs) < 40
    assert _indexed(d, recs) == [True] * len(locs) + [False] * (40 - len(locs))  # the prefix, nothing else
    bufs = [bytearray(r.length) for r in recs[: len(locs)]]
    assert d.read_run(locs, [[memoryview(b)] for b in bufs]) == [True] * len(locs)
    assert [bytes(b) for b in bufs] == [r.blob for r in recs[: len(locs)]]
    d.close()
    d2 = SegmentDir(tiny_fs / "s", DirSettings(capacity_bytes=64 << 20, segment_bytes=16 << 20), read_only=True)
    d2.open(background=False)  # after a restart: the same whole records, no partial one
    assert _indexed(d2, recs) == [True] * len(locs) + [False] * (40 - len(locs))
    assert d2.audit() == []
    d2.close()


def test_store_on_a_full_disk_keeps_the_written_prefix_of_each_run(tiny_fs):
    ks, ps = keys(48), [page(i, n=16384) for i in range(48)]  # 48 x 32 KiB for a 1 MiB disk
    with ChunkStore.open(settings(tiny_fs / "store", capacity="64MiB", segment_size="16MiB"),
                         background=False) as st:
        ok = st.put(NS, ks, ps)
        assert any(ok) and not all(ok)
        for run in store_calls.chunks(list(range(48)), store_write.WRITE_RUNS):
            got = [ok[i] for i in run]
            assert got == sorted(got, reverse=True)  # per run: a written prefix, then the dropped rest
        c = st.stats()["counters"]
        assert c["write_errors"] == ok.count(False) and c["pages_written"] == ok.count(True)
        assert st.contains(NS, ks) == ok  # exactly the written pages are indexed
        stored = [i for i in range(48) if ok[i]]
        assert all(read_back(st, [ks[i] for i in stored], [ps[i] for i in stored]))


# ------------------------------------------------------------------------------ corrupt record in a run
@pytest.mark.parametrize("where", ["payload", "header"])
def test_corrupt_record_in_a_coalesced_read_is_a_miss_for_that_page_only(tmp_path, monkeypatch, where):
    ks, ps = keys(16), [page(i) for i in range(16)]
    with ChunkStore.open(settings(tmp_path, engine={"io_workers": 1}), background=False) as st:
        assert all(st.put(NS, ks, ps))
        bad = ref_of(st, ks[6])
        flip_byte(seg_path(st, bad), bad.loc.offset + (HEADER_SIZE + 100 if where == "payload" else 3))
        calls = Calls(monkeypatch)
        got = read_back(st, ks, ps)
        assert got == [i != 6 for i in range(16)]  # neighbours served, byte-exact
        assert calls.n["preadv"] < 16  # page 6 was read inside a coalesced run
        c = st.stats()["counters"]
        assert c["miss_checksum" if where == "payload" else "miss_header"] == 1 and c["quarantined"] == 1
        assert st.contains(NS, ks) == [i != 6 for i in range(16)]  # dropped from the index


def test_corrupt_record_falls_back_to_the_lower_tier(tmp_path):
    s = settings_from_dict({"storage": [{"type": "local", "path": str(tmp_path / "a"), "capacity": "1GiB"},
                                        {"type": "local", "path": str(tmp_path / "b"), "capacity": "1GiB"}],
                            "engine": {"io_workers": 2}})
    ks, ps = keys(8), [page(i) for i in range(8)]
    with ChunkStore.open(s, background=False) as st:
        assert all(st.put(NS, ks, ps))
        st.flush()  # the copier wrote the lower tier
        bad = ref_of(st, ks[3])
        flip_byte(seg_path(st, bad), bad.loc.offset + HEADER_SIZE + 7)
        assert all(read_back(st, ks, ps))  # page 3 from the lower tier, the rest from the run read
        c = st.stats()["counters"]
        assert c["miss_checksum"] == 1 and c["hits_tier1"] == 1 and c["promotions"] == 1


# ------------------------------------------------------------------------------ IOV_MAX
def test_runs_of_more_than_iov_max_iovecs(tmp_path, monkeypatch):
    """At least 6 pages of 300 blocks per run: 1,806+ iovecs per pwritev run and per coalesced read."""
    n = 6 * max(store_write.WRITE_RUNS, store_read.READ_RUNS)
    ks, ps = keys(n), [blocks(i, 300, elems=32) for i in range(n)]
    with ChunkStore.open(settings(tmp_path), background=False) as st:
        calls = Calls(monkeypatch)
        assert all(st.put(NS, ks, ps))
        assert max(calls.iovecs) <= fsio.IOV_MAX and sum(calls.iovecs) >= n * 301
        assert calls.n["pwritev"] >= 2 * store_write.WRITE_RUNS
        calls.iovecs.clear()
        out = [[np.empty(32, np.uint16) for _ in range(300)] for _ in range(n)]
        assert all(st.get_into(NS, ks, out))
        assert max(calls.iovecs) == fsio.IOV_MAX  # full-size preadv calls, none above the limit
        assert all((np.concatenate(o) == np.concatenate(p)).all() for o, p in zip(out, ps))


# ------------------------------------------------------------------------------ deadlines
def test_hung_run_write_and_read_return_by_the_deadline(tmp_path, monkeypatch):
    ks, ps = keys(8), [page(i) for i in range(8)]
    eng = {"deadline_s": 0.3, "failure_cooldown_s": 0.05, "failure_cooldown_max_s": 0.1}
    with ChunkStore.open(settings(tmp_path, engine=eng), background=False) as st:
        assert all(st.put(NS, ks, ps))
        release = threading.Event()
        real_r = seg_reads.preadv_all

        def hung_read(fd, bufs, off):  # type: ignore[no-untyped-def]
            release.wait(10)
            return real_r(fd, bufs, off)

        monkeypatch.setattr(seg_reads, "preadv_all", hung_read)
        out = [np.empty_like(p) for p in ps]
        t0 = time.monotonic()
        assert st.get_into(NS, ks, out) == [False] * 8
        assert time.monotonic() - t0 < 0.3 + store_calls.DEADLINE_GRACE_S + 0.5
        c = st.stats()
        assert c["counters"]["read_deadline_misses"] == 8  # counted per page, not per run
        assert c["tiers"][0]["reads_cooling_down"]
        release.set()
        monkeypatch.setattr(seg_reads, "preadv_all", real_r)
        assert chunks.wait_for(lambda: not st.read_cooldowns[0].active(), 5)  # the probe got an answer
        assert all(read_back(st, ks, ps))

        stop = threading.Event()
        real_w = seg_writers.pwritev_all

        def hung_write(fd, bufs, off, *bound):  # type: ignore[no-untyped-def]
            stop.wait(10)
            return real_w(fd, bufs, off, *bound)

        monkeypatch.setattr(seg_writers, "pwritev_all", hung_write)
        t0 = time.monotonic()
        ks2 = keys(8, prefix="w")
        assert st.put(NS, ks2, ps) == [False] * 8
        assert time.monotonic() - t0 < 0.3 + store_calls.DEADLINE_GRACE_S + 0.5
        assert st.stats()["counters"]["writes_dropped_deadline"] == 8
        stop.set()


def test_a_gc_pause_mid_read_is_no_deadline_miss_and_a_hang_still_is(tmp_path, monkeypatch):
    """A full collection holds every thread of the process (a second or more in a big server heap): the
    deadline stands still meanwhile (store/gc_pauses.py), so a read of a healthy tier is served and the
    tier is not held; a read still hung after the collection is a miss at the deadline."""
    ks, ps = keys(8), [page(i) for i in range(8)]
    eng = {"deadline_s": 0.3, "failure_cooldown_s": 0.05, "failure_cooldown_max_s": 0.1}
    with ChunkStore.open(settings(tmp_path, engine=eng), background=False) as st:
        assert all(st.put(NS, ks, ps))
        entered, collected, hang = threading.Event(), threading.Event(), [False]
        real_r = seg_reads.preadv_all

        def read_stopped_by_the_collection(fd, bufs, off):  # type: ignore[no-untyped-def]
            entered.set()
            collected.wait(10)  # as the GC holds this io thread
            if hang[0]:
                time.sleep(1.0)  # and then a tier that does not answer
            return real_r(fd, bufs, off)

        def long_collection(phase: str, info: dict) -> None:  # a collection that lasts 1 s
            if phase == "start":
                time.sleep(1.0)
            else:
                collected.set()

        def collect_mid_read() -> None:
            entered.wait(10)
            gc.callbacks.append(long_collection)  # after the store's own callback: it sees the start first
            try:
                gc.collect()
            finally:
                gc.callbacks.remove(long_collection)

        monkeypatch.setattr(seg_reads, "preadv_all", read_stopped_by_the_collection)
        for hung in (False, True):
            entered.clear()
            collected.clear()
            hang[0] = hung
            collector = threading.Thread(target=collect_mid_read)
            collector.start()
            out = [np.empty_like(p) for p in ps]
            t0 = time.monotonic()
            got = st.get_into(NS, ks, out)
            took = time.monotonic() - t0
            collector.join(10)
            c = st.stats()
            if not hung:
                assert got == [True] * 8 and all((o == p).all() for o, p in zip(out, ps))
                assert c["counters"].get("read_deadline_misses", 0) == 0
                assert not c["tiers"][0]["reads_cooling_down"]
                assert took >= 1.0  # it waited the collection out
                assert c["gc_paused_s"] >= 1.0  # what operators see in stats
            else:
                assert got == [False] * 8
                assert c["counters"]["read_deadline_misses"] == 8
                assert took < 1.0 + 0.3 + store_calls.DEADLINE_GRACE_S + 0.5


def test_page_blocks_store_the_same_records_as_a_list_of_arrays(tmp_path):
    """A PageBlocks (uint8 blocks checked by its maker) is stored exactly as the same page given as a
    list of typed arrays: same record bytes (dtype, checksum), read back into either form; get_into
    refuses one marked read-only."""
    pages = [blocks(i, 48) for i in range(6)]
    as_blocks = [store_pages.PageBlocks([b.view(np.uint8) for b in p], 2, codec.dtype_code(p[0]))
                 for p in pages]
    with ChunkStore.open(settings(tmp_path / "a")) as a, ChunkStore.open(settings(tmp_path / "b")) as b:
        assert a.put(NS, keys(6, "pb"), pages) == [True] * 6
        assert b.put(NS, keys(6, "pb"), as_blocks) == [True] * 6
        a.flush()
        b.flush()
        for k in keys(6, "pb"):
            recs = []
            for st in (a, b):
                ref, tier = ref_of(st, k), st.tiers[0]
                name, _, off = tier.loc_name(ref).partition("@")
                with open(tier.dirs[ref.part].path / name, "rb") as f:
                    f.seek(int(off))
                    recs.append(f.read(ref.loc.length))
            assert recs[0] == recs[1] and len(recs[0]) == HEADER_SIZE + 48 * 128
        out = [store_pages.PageBlocks([np.zeros(64 * 2, np.uint8) for _ in range(48)], 2,
                                    codec.dtype_code(pages[0][0])) for _ in range(6)]
        assert b.get_into(NS, keys(6, "pb"), out) == [True] * 6
        assert [b"".join(x.tobytes() for x in o.pieces) for o in out] == [b"".join(x.tobytes() for x in p) for p in pages]
        back = [[np.zeros(64, np.uint16) for _ in range(48)] for _ in range(6)]
        assert a.get_into(NS, keys(6, "pb"), back) == [True] * 6 and b.get_into(NS, keys(6, "pb"), back) == [True] * 6
        assert all(np.array_equal(x, y) for p, q in zip(back, pages) for x, y in zip(p, q))
        frozen = store_pages.PageBlocks(out[0].pieces, 2, out[0].dtype, writable=False)
        with pytest.raises(ValueError, match="writable"):
            b.get_into(NS, keys(1, "pb"), [frozen])


@pytest.mark.parametrize("bound", [None, "64KiB"])
def test_write_calls_of_a_run_stay_within_the_tier_bound(tmp_path, monkeypatch, bound):
    """A put's run of 768 KiB pages is written in calls of at most `write_call_size` (by default at most
    1 MiB, less while free memory is short): a single write of 2 MiB or more costs 10-20x the kernel time
    on some kernels (fsio.WRITE_CALL_BYTES, WriteCallBound)."""
    limit = (64 << 10) if bound else (1 << 20)
    real, sizes = os.pwritev, []

    def spy(fd, bufs, offset, *a):  # type: ignore[no-untyped-def]
        sizes.append(sum(memoryview(b).nbytes for b in bufs))
        return real(fd, bufs, offset, *a)

    ps = [np.random.default_rng(i).integers(0, 2**16, 384 << 10, dtype=np.uint16) for i in range(7)]  # 768 KiB
    ks = keys(7)
    extra = {"write_call_size": bound} if bound else {}
    with ChunkStore.open(settings(tmp_path, segment_size="64MiB", **extra), background=False) as st:
        monkeypatch.setattr(os, "pwritev", spy)
        assert all(st.put(NS, ks, ps))
        monkeypatch.setattr(os, "pwritev", real)
        assert all(read_back(st, ks, ps))
    assert sizes and max(sizes) <= limit and sum(sizes) >= 7 * (768 << 10)


@pytest.mark.parametrize("built", ["sealed", "zstd"])
def test_records_built_in_the_arena_are_written_in_runs_that_keep_its_buffers_small(tmp_path, monkeypatch, built):
    """Sealed or compressed records are built in the io task's arena: a put's runs then hold at most
    ARENA_RUN_BYTES of pages, so the arena's buffers stay that size and are reused by the next call.
    Runs of a quarter of the call took buffers of 32-64 MiB, and fresh memory on every call."""
    from lifeboat_cache.store import io_workers
    from support.sealed import encryption, make_key

    monkeypatch.setattr(io_workers, "_FREE", [])
    doc = {"storage": [{"type": "local", "path": str(tmp_path / "s"), "capacity": "1GiB"}],
           "engine": {"io_workers": 4}}
    if built == "sealed":
        doc["encryption"] = encryption(make_key(tmp_path))
    else:
        doc["storage"][0]["compression"] = "zstd"
    ps = [np.ascontiguousarray(np.tile(page(i, 4096), 48)) for i in range(64)]  # 64 pages of 768 KiB: 48 MiB
    with ChunkStore.open(settings_from_dict(doc), background=False) as st:
        for rnd in range(2):
            ks = keys(64, f"r{rnd}-")
            assert all(st.put(NS, ks, ps))
            assert all(read_back(st, ks, ps))
    largest = max(b.nbytes for b in io_workers._FREE)
    assert largest <= 2 * store_write.ARENA_RUN_BYTES, f"an arena buffer of {largest >> 20} MiB"
