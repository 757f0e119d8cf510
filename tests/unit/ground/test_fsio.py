"""fsio: whole-buffer pwritev / preadv that resume short transfers and report a failure's written bytes."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from lifeboat_cache import fsio


def test_pwritev_all_and_preadv_all_split_and_finish_short_transfers(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    parts = [rng.integers(0, 256, int(rng.integers(1, 40)), dtype=np.uint8).tobytes() for _ in range(3000)]
    blob = b"".join(parts)
    real_w, real_r, sizes = os.pwritev, os.preadv, []

    def short_w(fd, bufs, off):  # type: ignore[no-untyped-def]
        sizes.append(len(bufs))
        assert len(bufs) <= fsio.IOV_MAX
        return real_w(fd, [memoryview(b"".join(bytes(b) for b in bufs))[:777]], off)  # at most 777 bytes

    def short_r(fd, bufs, off):  # type: ignore[no-untyped-def]
        assert len(bufs) <= fsio.IOV_MAX
        first = bufs[0]
        return real_r(fd, [first[: min(len(first), 5)]], off)  # 5 bytes at most

    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        monkeypatch.setattr(os, "pwritev", short_w)
        fsio.pwritev_all(fd, parts, 10)
        monkeypatch.setattr(os, "pwritev", real_w)
        assert os.pread(fd, len(blob) + 10, 0) == b"\0" * 10 + blob and len(sizes) > 1
        dst = [bytearray(len(p)) for p in parts]
        monkeypatch.setattr(os, "preadv", short_r)
        assert fsio.preadv_all(fd, [memoryview(b) for b in dst], 10) == len(blob)
        monkeypatch.setattr(os, "preadv", real_r)
        assert b"".join(dst) == blob
        more = [bytearray(8), bytearray(8)]  # past the end of the file: the bytes there are counted
        assert fsio.preadv_all(fd, [memoryview(b) for b in more], len(blob) + 2) == 8
    finally:
        os.close(fd)


def test_pwritev_all_reports_the_bytes_written_before_a_failure(tmp_path, monkeypatch):
    real, state = os.pwritev, {"calls": 0}

    def fail_second(fd, bufs, off):  # type: ignore[no-untyped-def]
        state["calls"] += 1
        if state["calls"] > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, [memoryview(bytes(bufs[0]))[:50]], off)

    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        monkeypatch.setattr(os, "pwritev", fail_second)
        with pytest.raises(fsio.PartialWrite) as e:
            fsio.pwritev_all(fd, [b"x" * 100, b"y" * 100], 0)
        assert e.value.written == 50 and e.value.errno == errno.ENOSPC
        state["calls"] = 1
        with pytest.raises(OSError) as e2:  # nothing written: a plain OSError
            fsio.pwritev_all(fd, [b"z"], 0)
        assert not isinstance(e2.value, fsio.PartialWrite)
    finally:
        os.close(fd)


@pytest.mark.parametrize("short", [False, True], ids=["whole", "short-writes"])
@pytest.mark.parametrize("bound", [4096, fsio.WRITE_CALL_BYTES])
def test_pwritev_all_never_writes_more_than_the_bound_in_one_call(tmp_path, monkeypatch, bound, short):
    """Buffers larger than the bound go in slices, smaller ones share a call; every call but the last is
    full (the fewest calls the bound allows), and short writes inside a slice are finished."""
    rng = np.random.default_rng(2)
    parts = [rng.integers(0, 256, n, dtype=np.uint8) for n in (3 * bound + 17, 5, 0, bound, bound - 1, 1, 2 * bound)]
    blob = b"".join(p.tobytes() for p in parts)
    real, calls = os.pwritev, []

    def spy(fd, bufs, off):  # type: ignore[no-untyped-def]
        calls.append(sum(memoryview(b).nbytes for b in bufs))
        if short:
            return real(fd, [memoryview(b"".join(bytes(b) for b in bufs))[:1000]], off)
        return real(fd, bufs, off)

    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        monkeypatch.setattr(os, "pwritev", spy)
        fsio.pwritev_all(fd, parts, 3, max_call_bytes=bound)
        monkeypatch.setattr(os, "pwritev", real)
        assert os.pread(fd, len(blob) + 3, 0) == b"\0" * 3 + blob
        assert max(calls) <= bound
        if not short:
            assert sum(calls) == len(blob) and all(c == bound for c in calls[:-1])
    finally:
        os.close(fd)


def test_reads_are_not_bounded_by_the_write_call_size(tmp_path, monkeypatch):
    """A large preadv is not slow (docs/perf/write-calls.md): a read stays one call."""
    blob = np.random.default_rng(3).integers(0, 256, 3 * fsio.WRITE_CALL_BYTES, dtype=np.uint8).tobytes()
    (tmp_path / "f").write_bytes(blob)
    real, calls = os.preadv, []

    def spy(fd, bufs, off):  # type: ignore[no-untyped-def]
        calls.append(len(bufs))
        return real(fd, bufs, off)

    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        monkeypatch.setattr(os, "preadv", spy)
        dst = bytearray(len(blob))
        assert fsio.preadv_all(fd, [memoryview(dst)], 0) == len(blob) and bytes(dst) == blob
        assert len(calls) == 1
    finally:
        os.close(fd)
