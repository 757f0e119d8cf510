"""Periodic index snapshots (tiers/segments/snapshot_policy.py `Snapshots.maybe_save`): written by the
index thread while the store serves, loadable, and harmless when the write fails.

Real parts: a real ChunkStore over a local tier on real files; the thresholds are lowered for the test
(`SNAPSHOT_INTERVAL_S`, `SNAPSHOT_MIN_SEGMENTS`) so a test sees a snapshot within seconds.
"""

from __future__ import annotations

import errno
import logging
import time
from pathlib import Path

import numpy as np
import pytest

from lifeboat_cache import ChunkStore, namespace_fingerprint
from lifeboat_cache.config import settings_from_dict
from lifeboat_cache.tiers.segments import DirSettings, SegmentDir, snapshot_file as snap, snapshot_policy as seg
from lifeboat_cache.tiers.segments.snapshot_file import SNAPSHOT_NAME

NS = namespace_fingerprint(model="periodic-snapshot")
PAGE = 4096  # u16 elements: 8 KiB pages, ~128 per 1 MiB segment


def _page(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 2**16, PAGE, dtype=np.uint16)


def _store(root: Path, monkeypatch: pytest.MonkeyPatch) -> ChunkStore:
    monkeypatch.setattr(seg, "SNAPSHOT_INTERVAL_S", 0.1)
    monkeypatch.setattr(seg, "SNAPSHOT_MIN_SEGMENTS", 2)
    cfg = settings_from_dict({"storage": [{"type": "local", "path": str(root), "capacity": "256MiB",
                                           "segment_size": "1MiB", "refresh_interval_s": 0.05}],
                               # what is tested here is the snapshot, not the read deadline (tests/unit/store):
                               # a CI runner once took over the default 2 s for the 1,200-page read below
                               "engine": {"deadline_s": 30}})
    return ChunkStore.open(cfg)


def _put(st: ChunkStore, a: int, b: int) -> None:
    for i in range(a, b, 16):
        keys = [f"p{j}" for j in range(i, min(b, i + 16))]
        assert all(st.put(NS, keys, [_page(int(k[1:])) for k in keys]))


def _wait(cond, timeout_s: float = 20.0) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return False


def test_a_periodic_snapshot_appears_after_enough_sealed_segments_and_loads(tmp_path: Path, monkeypatch) -> None:
    st = _store(tmp_path, monkeypatch)
    d = st.tiers[0].dirs[0]
    try:
        assert d.counters["snapshot_saves"] == 0
        _put(st, 0, 64)  # less than one segment: nothing sealed, nothing due
        time.sleep(0.5)
        assert d.counters["snapshot_saves"] == 0 and not (tmp_path / SNAPSHOT_NAME).exists()
        _put(st, 64, 600)  # ~4 sealed segments
        assert _wait(lambda: d.counters["snapshot_saves"] >= 1), "no periodic snapshot was written"
        s = snap.parse((tmp_path / SNAPSHOT_NAME).read_bytes())
        assert s.dropped == 0 and len(s.keys) > 0 and len(s.units) >= 2
        # a second directory object (another process's view) loads it while the first keeps serving
        r = SegmentDir(tmp_path, DirSettings(capacity_bytes=1 << 30, segment_bytes=1 << 20), read_only=True)
        r.open(background=False)
        r.stop_refresh()
        assert r.counters["snapshot_pages"] == len(s.keys)
        assert r.counters["snapshot_segments"] == len(s.units)
        assert r.counters["snapshot_mismatched_units"] == 0 and r.counters["snapshot_discarded"] == 0
        found, units, offs, lens = r.index.locate(s.keys)
        assert found.all()
        bufs = [np.empty(PAGE, np.uint16) for _ in range(600)]
        assert all(st.get_into(NS, [f"p{i}" for i in range(600)], bufs))
        assert all(np.array_equal(b, _page(i)) for i, b in enumerate(bufs))
        # once nothing new is due, no further snapshot however long it serves
        assert _wait(lambda: not d.snapshots.due())
        time.sleep(0.3)
        n = d.counters["snapshot_saves"]
        time.sleep(0.5)
        assert d.counters["snapshot_saves"] == n
    finally:
        st.close()


def test_a_process_skips_its_turn_while_another_wrote_the_snapshot_lately(tmp_path: Path, monkeypatch) -> None:
    st = _store(tmp_path, monkeypatch)
    d = st.tiers[0].dirs[0]
    try:
        d.snapshots.interval_s = 3600.0  # not due by time: driven by hand below
        _put(st, 0, 600)
        d.seal()
        assert _wait(lambda: d.snapshots.due())
        (tmp_path / SNAPSHOT_NAME).write_bytes(b"another process's fresh snapshot")
        d.snapshots.tried = time.monotonic() - 3601
        d.snapshots.maybe_save()
        assert d.counters["snapshot_saves"] == 0  # the file on disk is younger than the interval
        old = time.time() - 7200
        import os
        os.utime(tmp_path / SNAPSHOT_NAME, (old, old))
        d.snapshots.tried = time.monotonic() - 3601
        d.snapshots.maybe_save()
        assert d.counters["snapshot_saves"] == 1 and not d.snapshots.due()
    finally:
        st.close()


def test_a_failing_snapshot_write_is_logged_once_and_serving_goes_on(tmp_path: Path, monkeypatch, caplog) -> None:
    calls = [0]

    def full_disk(*a: object, **k: object) -> int:
        calls[0] += 1
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(snap, "save", full_disk)
    caplog.set_level(logging.INFO, logger="lifeboat_cache")
    st = _store(tmp_path, monkeypatch)
    d = st.tiers[0].dirs[0]
    try:
        _put(st, 0, 600)
        assert _wait(lambda: d.counters["snapshot_save_failures"] >= 1)
        _put(st, 600, 1200)  # more sealed segments: tried again after the interval, fails again
        assert _wait(lambda: d.counters["snapshot_save_failures"] >= 2)
        bufs = [np.empty(PAGE, np.uint16) for _ in range(1200)]
        assert all(st.get_into(NS, [f"p{i}" for i in range(1200)], bufs))
        assert all(np.array_equal(b, _page(i)) for i, b in enumerate(bufs))
        assert d.counters["snapshot_saves"] == 0 and not (tmp_path / SNAPSHOT_NAME).exists()
    finally:
        st.close()
    msgs = [r for r in caplog.records if "cannot save index snapshot" in r.getMessage()]
    assert len(msgs) == 1 and msgs[0].levelno == logging.WARNING
    assert calls[0] >= 3  # two periodic tries and the close
