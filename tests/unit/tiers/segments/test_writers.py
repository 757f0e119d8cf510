"""The open segments of a directory: a new segment file is created outside the directory's lock, so two
threads writing to one stripe may each create one; one is used, the other removed."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest
from support.chunks import page

from lifeboat_cache.records import codec
from lifeboat_cache.records.keys import key_digest
from lifeboat_cache.tiers.segments import SEGMENT_SUFFIX, DirSettings, SegmentDir
from lifeboat_cache.tiers.segments import writers


def _record(i: int) -> tuple[int, bytes, list[object], int]:
    dg = key_digest(b"n" * 16, f"k{i}")
    hdr, parts, n = codec.build_record(page(i, 2048).view(np.uint8), itemsize=2, dtype=codec.DTYPE_CODES["u2"],
                                       digest=dg, namespace=b"n" * 16, compress=False)
    return i, dg, [hdr, *parts], n


def test_two_threads_that_each_create_a_segment_use_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Thread A's create is held; thread B (same stripe) creates and fills a segment meanwhile. A then
    writes into B's segment and removes its own file, which never held a record."""
    d = SegmentDir(tmp_path, DirSettings(capacity_bytes=None, segment_bytes=1 << 20, stripes=1))
    d.open(background=False)
    created, go = threading.Event(), threading.Event()
    real_open = writers.open_file

    def held_create(path: Path, flags: int, *args: object) -> int:
        fd = real_open(path, flags, *args)  # type: ignore[arg-type]
        if flags & os.O_CREAT and threading.current_thread().name == "A":
            created.set()
            go.wait(10)
        return fd

    monkeypatch.setattr(writers, "open_file", held_create)
    try:
        a = threading.Thread(target=d.append_many, args=([_record(j) for j in range(4)],), name="A")
        a.start()
        assert created.wait(10)
        d.append_many([_record(j) for j in range(100, 104)])  # B: this thread, the same (only) stripe
        go.set()
        a.join(10)
        assert not a.is_alive()
        d.seal()
        files = sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(SEGMENT_SUFFIX))
        assert len(files) == 1, f"the unused segment file was left behind: {files}"
        assert all(d.index.get(j) is not None for j in [*range(4), *range(100, 104)])
    finally:
        d.close()
    d = SegmentDir(tmp_path, DirSettings(capacity_bytes=None, segment_bytes=1 << 20))
    d.open(background=False)
    try:
        assert len(d.index) == 8 and all(sealed for _, _, sealed in d.units())
    finally:
        d.close()
