"""Compact index: semantics of insert / remove-if-match / drop-unit and its memory per entry."""

from __future__ import annotations

import numpy as np

from lifeboat_cache.index import Index, Loc


def test_insert_get_and_overwrite():
    ix = Index(delta_limit=4)
    for k in range(10):
        ix.insert(k, Loc(1, k * 10, 10))
    assert ix.get(3) == Loc(1, 30, 10)
    ix.insert(3, Loc(2, 0, 5))
    assert ix.get(3) == Loc(2, 0, 5)
    assert len(ix) == 10
    assert ix.contains(np.array([3, 11], dtype=np.int64)).tolist() == [True, False]


def test_remove_if_match_keeps_a_newer_write():
    ix = Index(delta_limit=2)
    ix.insert(7, Loc(1, 0, 8))
    ix.insert(7, Loc(2, 0, 8))  # newer write of the same key
    assert not ix.remove_if_match(7, Loc(1, 0, 8))
    assert ix.get(7) == Loc(2, 0, 8)
    assert ix.remove_if_match(7, Loc(2, 0, 8))
    assert ix.get(7) is None and len(ix) == 0


def test_scan_never_overwrites_newer_entries():
    ix = Index()
    ix.insert(1, Loc(5, 0, 8))
    ix.insert_arrays(np.array([1, 2], np.int64), np.array([3, 3], np.uint32), np.array([0, 8], np.uint64),
                     np.array([8, 8], np.uint32), if_absent=True)
    assert ix.get(1) == Loc(5, 0, 8) and ix.get(2) == Loc(3, 8, 8)


def test_drop_unit_forgets_its_entries():
    ix = Index(delta_limit=3)
    for k in range(6):
        ix.insert(k, Loc(k % 2, k, 1))
    assert ix.drop_unit(0) == 3
    assert [ix.get(k) is not None for k in range(6)] == [False, True, False, True, False, True]


def test_memory_per_entry_is_compact():
    ix = Index()
    n = 200_000
    keys = np.random.default_rng(0).integers(-2**63, 2**63 - 1, n, dtype=np.int64)
    ix.insert_arrays(keys, np.zeros(n, np.uint32), np.arange(n, dtype=np.uint64), np.ones(n, np.uint32))
    assert ix.memory_bytes() / len(ix) <= 32
    assert ix.contains(keys[:300]).all()
