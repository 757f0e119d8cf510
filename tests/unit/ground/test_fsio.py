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


def _sys_tree(root, features: str | None, order: str | None = "9") -> None:
    """A /sys with one virtio balloon (device 0x0005) of these feature bits, and the reporting order."""
    dev = root / "bus/virtio/devices/virtio0"
    dev.mkdir(parents=True)
    (dev / "device").write_text("0x0005\n" if features is not None else "0x0002\n")
    (dev / "features").write_text((features or "0" * 64) + "\n")
    if order is not None:
        (root / "module/page_reporting/parameters").mkdir(parents=True)
        (root / "module/page_reporting/parameters/page_reporting_order").write_text(order + "\n")


def _buddyinfo(path, gib_by_order: dict[int, float]) -> None:
    counts = [int(gib_by_order.get(k, 0) * 2**30) // (4096 << k) for k in range(11)]
    path.write_text("Node 0, zone      DMA  0  0  0  0  0  0  0  0  1  1  3\n"
                    "Node 0, zone   Normal " + " ".join(f"{c:6d}" for c in counts) + "\n")


def test_write_calls_shrink_while_free_memory_below_the_reporting_order_is_short(tmp_path, monkeypatch):
    """In a VM that reports free memory from order 9 up, the bound is the largest call size whose
    folio order and the orders above it (below 9) still hold a GiB free, else the smallest; a fixed
    `write_call_size` wins, and without reporting the largest size always stands."""
    monkeypatch.setattr(fsio, "RECHECK_S", 0.0)
    sys_root, info = tmp_path / "sys", tmp_path / "buddyinfo"
    _sys_tree(sys_root, "0110010" + "0" * 57)  # bit 5: VIRTIO_BALLOON_F_REPORTING
    assert fsio.reporting_order(sys_root) == 9
    bound = fsio.WriteCallBound(0, sys_root, info)
    for free, want in [({8: 1.5, 10: 8}, 1 << 20),            # 1 MiB blocks to spare
                       ({7: 0.6, 8: 0.5, 9: 4}, 256 << 10),   # order 9 is reported: it does not count
                       ({6: 0.7, 7: 0.2, 8: 0.2}, 256 << 10),
                       ({4: 3.0, 8: 0.1}, 256 << 10),         # nothing left at 256 KiB and up: the smallest
                       ({8: 1.0}, 1 << 20)]:
        _buddyinfo(info, free)
        assert bound() == want, free
    assert sum(fsio.free_bytes_by_order(info)[:9]) == 2**30 + (4096 << 8)  # the DMA zone's block counts too
    assert fsio.WriteCallBound(64 << 10, sys_root, info)() == 64 << 10
    _buddyinfo(info, {4: 3.0})
    for features, order in [(None, "9"), ("0" * 64, "9")]:  # no balloon; a balloon that does not report
        root = tmp_path / f"sys-{features is None}"
        _sys_tree(root, features, order)
        assert fsio.reporting_order(root) is None and fsio.WriteCallBound(0, root, info)() == 1 << 20
    root = tmp_path / "sys-default-order"
    _sys_tree(root, "0110010" + "0" * 57, order=None)
    assert fsio.reporting_order(root) == 9  # the pageblock order when the module does not say


def test_free_memory_by_order_is_the_kernels_free_memory():
    """Read from this machine: the buddy lists hold some of what /proc/meminfo calls free, never more
    (per-CPU lists, and blocks a balloon holds while it reports them, are free but not in the lists)."""
    if not os.path.exists("/proc/buddyinfo"):
        pytest.skip("no /proc/buddyinfo on this system")
    meminfo = dict(line.split(":", 1) for line in open("/proc/meminfo"))
    free = int(meminfo["MemFree"].split()[0]) * 1024
    by_order = fsio.free_bytes_by_order()
    assert len(by_order) >= 10 and 0 < sum(by_order) <= free + (16 << 20)  # read a moment apart
    assert fsio.reporting_order() in (None, *range(0, 11))
