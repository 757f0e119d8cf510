"""The per-directory change counter (tiers/changes.py): a signal only, never trusted, never fatal."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from lifeboat_cache.records import codec
from lifeboat_cache.records.keys import key_digest
from lifeboat_cache.tiers.segments import DirSettings, SegmentDir
from lifeboat_cache.tiers.segments.changes import CHANGES_NAME, SEGMENTS, ChangeCounter


def test_every_bump_changes_what_a_second_opener_reads(tmp_path: Path) -> None:
    a, b = ChangeCounter(tmp_path, create=True), ChangeCounter(tmp_path, create=True)
    seen = {b.read()}
    for i in range(50):
        (a if i % 2 else b).bump(SEGMENTS if i % 5 == 0 else 0)
        now = b.read()
        assert now not in seen, "a bump left the counter at a value seen before"
        seen.add(now)
    w, s = b.read()
    a.bump(0)
    assert b.read()[1] == s and b.read()[0] != w, "a plain write must not ask for a listing"
    a.close()
    b.close()
    assert b.read() == (0, 0)
    b.bump()  # after close: nothing happens, nothing raises


def test_truncated_or_garbage_counter_is_only_a_spurious_catch_up(tmp_path: Path) -> None:
    c = ChangeCounter(tmp_path, create=True)
    c.bump(SEGMENTS)
    os.truncate(tmp_path / CHANGES_NAME, 3)  # someone else cut the file: a short read, no SIGBUS
    assert c.read()[1] == 0
    (tmp_path / CHANGES_NAME).write_bytes(os.urandom(64))
    assert c.read() != (0, 0)
    c.bump()
    c.close()


def test_a_planted_link_turns_the_counter_off_and_the_store_still_works(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"x" * 16)
    store = tmp_path / "store"
    store.mkdir()
    os.symlink(target, store / CHANGES_NAME)
    d = SegmentDir(store, DirSettings(capacity_bytes=1 << 30, segment_bytes=1 << 20))
    d.open(background=False)
    try:
        assert d.change_counter is None
        page = np.arange(1024, dtype=np.uint16)
        dg = key_digest(b"n" * 16, "k")
        hdr, parts, n = codec.build_record(page.view(np.uint8), itemsize=2, dtype=codec.DTYPE_CODES["u2"], digest=dg,
                                           namespace=b"n" * 16, compress=False)
        d.append(1, dg, [hdr, *parts], n)
        assert len(d.index) == 1
    finally:
        d.close()
    assert target.read_bytes() == b"x" * 16, "a write went through the planted link"


def test_a_reader_tells_its_own_bumps_from_another_process_s(tmp_path: Path) -> None:
    """The index thread polls fast only after another process's change (indexer.py): its own writes are
    indexed as they are written, and each fast wake-up takes the GIL from SGLang's threads."""
    mine, theirs = ChangeCounter(tmp_path, create=True), ChangeCounter(tmp_path, create=True)
    before = mine.read()
    mine.bump()
    mine.bump(SEGMENTS)
    assert mine.only_mine(mine.read(), before)
    before = mine.read()
    theirs.bump()
    assert not mine.only_mine(mine.read(), before), "another process's write looked like ours"
    before = mine.read()
    theirs.bump(SEGMENTS)
    mine.bump()  # ours over theirs in the writes word; their new segments word still shows
    assert not mine.only_mine(mine.read(), before)
    before = mine.read()
    mine.bump()  # only the writes word changed, and it is ours; their older segments word did not change
    assert mine.only_mine(mine.read(), before)
    assert not theirs.only_mine(theirs.read(), before)
    mine.close()
    theirs.close()
