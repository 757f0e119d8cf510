"""Capacity eviction of a segment directory: whole oldest sealed segments go first, and runs written at
once never overshoot together."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
from support.chunks import keys, local_settings as settings, page

from lifeboat_cache import ChunkStore, namespace_fingerprint
from lifeboat_cache.records import codec
from lifeboat_cache.records.keys import index_key, key_digest
from lifeboat_cache.tiers.segments import DirSettings, SegmentDir

NS = namespace_fingerprint(model="test", dtype="bfloat16", page_size=64)


def test_capacity_evicts_oldest_segments(tmp_path):
    s = settings(tmp_path, capacity="3MiB", segment_size="1MiB")
    with ChunkStore.open(s, background=False) as st:
        ks = keys(1000)
        for i in range(0, 1000, 20):
            st.put(NS, ks[i:i + 20], [page(j) for j in range(i, i + 20)])
            # enforced on every seal: at most the open segments (one per write stripe) above the bound
            stripes = st.tiers[0].dirs[0].writers.stripes
            assert st.tiers[0].usage_bytes() <= (3 << 20) + stripes * (1 << 20)
        hits = st.contains(NS, ks)
        assert not any(hits[:100]) and all(hits[-20:])  # oldest gone, newest kept



def _record(i: int) -> tuple[int, bytes, list[object], int]:
    """Record i: a 4 KiB page, uncompressed (16 to a 64 KiB open segment)."""
    dg = key_digest(b"n" * 16, f"k{i}")
    hdr, parts, n = codec.build_record(page(i, 2048).view(np.uint8), itemsize=2, dtype=codec.DTYPE_CODES["u2"],
                                       digest=dg, namespace=b"n" * 16, compress=False)
    return index_key(dg), dg, [hdr, *parts], n


def test_a_run_that_made_room_counts_until_it_is_written(tmp_path: Path) -> None:
    """Thread A makes room for its run and is held before writing it: the room must stay counted, so
    that thread B's run written meanwhile makes room of its own (each making room for itself only, the
    two would write into the same room and overshoot the capacity together)."""
    d = SegmentDir(tmp_path, DirSettings(capacity_bytes=1 << 20, segment_bytes=1 << 20))
    d.open(background=False)
    try:
        for i in range(0, 400, 4):  # past the capacity: old sealed segments are evicted as it goes
            d.append_many([_record(j) for j in range(i, i + 4)])
        run_a = [_record(j) for j in range(1000, 1008)]
        made_room, go = threading.Event(), threading.Event()
        evict = d.evictor.evict

        def held_evict(limit: int) -> int:
            freed = evict(limit)
            if threading.current_thread().name == "A":
                made_room.set()
                go.wait(10)
            return freed

        d.evictor.evict = held_evict  # type: ignore[method-assign]
        a = threading.Thread(target=d.append_many, args=(run_a,), name="A")
        a.start()
        assert made_room.wait(10)
        counted = d.writers.projected_bytes() - d.usage_bytes()  # beyond what the segments hold now
        d.append_many([_record(j) for j in range(2000, 2008)])  # thread B
        go.set()
        a.join(10)
        # the capacity counts pages, not their headers (records.framing)
        assert counted >= sum(r[3] - codec.HEADER_SIZE for r in run_a), \
            "a run's room was not counted between gc and its write"
        assert d.writers.projected_bytes() <= d.capacity_bytes
        assert all(d.index.get(r[0]) is not None for r in run_a)
    finally:
        d.close()


PAGE = 4096  # _record's page bytes


def _open(path: Path, pages: int) -> SegmentDir:
    d = SegmentDir(path, DirSettings(capacity_bytes=pages * PAGE, segment_bytes=64 << 10))
    d.open(background=False)
    return d


def test_the_capacity_counts_pages_as_sglang_file_counts_its_max_size(tmp_path: Path) -> None:
    """`capacity:` of N pages holds N pages, as SGLang's `file` backend with `max_size` of N pages does:
    the records' headers and trailers are on top (records.framing), before and after a reopen, and
    one page more evicts."""
    d = _open(tmp_path, 96)
    try:
        for i in range(0, 96, 4):
            d.append_many([_record(j) for j in range(i, i + 4)])
        d.seal()
        assert d.counters["evicted_segments"] == 0
        assert d.usage_bytes() == 96 * PAGE
        on_disk = sum(p.stat().st_size for p in tmp_path.glob("*.seg"))
        assert on_disk > 96 * (PAGE + codec.HEADER_SIZE)  # headers and trailers are on disk all the same
    finally:
        d.close()
    d = _open(tmp_path, 96)  # reopened: the trailers give every segment's framing again
    try:
        assert d.usage_bytes() == 96 * PAGE
        assert all(d.index.get(_record(j)[0]) is not None for j in range(96))
        d.append_many([_record(96)])
        assert d.counters["evicted_segments"] >= 1 and d.writers.projected_bytes() <= 96 * PAGE
    finally:
        d.close()


def test_an_unsealed_segment_walked_again_counts_its_headers_once(tmp_path: Path) -> None:
    """Another writer's open segment is walked as it grows (rebuild.scan_local): each walk counts only
    the records it has not counted, so the capacity's count is the pages' bytes, walk after walk."""
    writer = _open(tmp_path / "w", 1 << 10)
    try:
        writer.append_many([_record(j) for j in range(6)])
        seg = next((tmp_path / "w").glob("*.seg"))
        (tmp_path / "r").mkdir()
        (tmp_path / "r" / seg.name).write_bytes(seg.read_bytes())  # unsealed: its writer (this pid) lives
        reader = _open(tmp_path / "r", 1 << 10)
        try:
            assert reader.usage_bytes() == 6 * PAGE
            writer.append_many([_record(j) for j in range(6, 10)])
            (tmp_path / "r" / seg.name).write_bytes(seg.read_bytes())  # it grew
            reader.scanner.refresh(False)
            reader.scanner.refresh(False)
            assert all(reader.index.get(_record(j)[0]) is not None for j in range(10))
            assert reader.usage_bytes() == 10 * PAGE
        finally:
            reader.close()
    finally:
        writer.close()
