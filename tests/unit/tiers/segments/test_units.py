"""The unit table's read fds: a segment's first open happens outside the directory's lock, so an open
can race a reopen (NFS close-to-open, after another host sealed the segment) or an eviction."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from support.chunks import page

from lifeboat_cache.records import codec
from lifeboat_cache.records.keys import key_digest
from lifeboat_cache.tiers.segments import DirSettings, SegmentDir
from lifeboat_cache.tiers.segments import units


def _sealed_dir(path: Path) -> SegmentDir:
    d = SegmentDir(path, DirSettings(capacity_bytes=None, segment_bytes=1 << 20))
    d.open(background=False)
    dg = key_digest(b"n" * 16, "k0")
    hdr, parts, n = codec.build_record(page(0, 2048).view(np.uint8), itemsize=2, dtype=codec.DTYPE_CODES["u2"],
                                       digest=dg, namespace=b"n" * 16, compress=False)
    d.append_many([(0, dg, [hdr, *parts], n)])
    d.seal()
    return d


def test_an_open_that_raced_a_reopen_is_not_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = _sealed_dir(tmp_path)
    try:
        unit = next(u for u in d.table.live())
        opened, held, go = [], threading.Event(), threading.Event()
        real_open = units.open_file

        def open_file(path: Path, *args: object) -> int:
            fd = real_open(path, *args)  # type: ignore[arg-type]
            opened.append(fd)
            if len(opened) == 1:
                held.set()
                go.wait(10)
            return fd

        monkeypatch.setattr(units, "open_file", open_file)
        got: list[int] = []
        reader = threading.Thread(target=lambda: got.append(d.table.acquire(unit)))
        reader.start()
        assert held.wait(10)
        d.table.close_cached_fd(unit)  # the segment is to be opened afresh: the open in progress is stale
        go.set()
        reader.join(10)
        assert len(opened) == 2 and got == [opened[1]] and unit.fd == opened[1]
        d.table.release(unit)
    finally:
        d.close()


def test_an_open_that_raced_an_eviction_raises_and_keeps_no_fd(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    d = _sealed_dir(tmp_path)
    try:
        unit = next(u for u in d.table.live())
        held, go = threading.Event(), threading.Event()
        real_open = units.open_file

        def open_file(path: Path, *args: object) -> int:
            held.set()
            go.wait(10)
            return real_open(path, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(units, "open_file", open_file)
        errors: list[BaseException] = []

        def read() -> None:
            try:
                d.table.acquire(unit)
            except FileNotFoundError as e:
                errors.append(e)

        reader = threading.Thread(target=read)
        reader.start()
        assert held.wait(10)
        d.table.drop(unit)  # evicted while the reader was opening it
        go.set()
        reader.join(10)
        assert len(errors) == 1 and unit.fd is None and unit.readers == 0
    finally:
        d.close()
