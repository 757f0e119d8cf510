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


def test_held_counts_again_only_after_enough_changes_and_stays_close():
    """held() is len() counted again only once more than max(64, 1/16 of it) entries changed: every change
    path (insert, insert_many, removal, bulk insert, drop_units, clear) moves it, none makes it wrong
    by more than that bound."""
    ix = Index(delta_limit=1000)  # deltas freeze and merge into main along the way
    for k in range(1, 3001):
        ix.insert(k, Loc(1 + k % 3, k, 10))
    assert ix.held() == len(ix) == 3000
    for k in range(3001, 3041):  # 40 changes: under the bound, the count is not taken again
        ix.insert(k, Loc(1, k, 10))
    assert ix.held() == 3000 and len(ix) == 3040
    ix.insert_many(range(3041, 3301), [Loc(2, k, 10) for k in range(3041, 3301)])
    assert ix.held() == len(ix) == 3300
    ix.drop_units([1])  # a third of the entries go at once: counted again
    assert ix.held() == len(ix) == 3300 - 1040
    for k in range(2, 400, 3):
        ix.remove_if_match(k, Loc(3, k, 10))
    assert abs(ix.held() - len(ix)) <= max(64, ix.held() // 16)
    keys = np.arange(10_000, 20_000, dtype=np.int64)
    ix.insert_arrays(keys, np.full(len(keys), 4), keys.astype(np.uint64), np.full(len(keys), 10))
    assert ix.held() == len(ix)
    ix.clear()
    assert ix.held() == 0


def test_memory_per_entry_is_compact():
    ix = Index()
    n = 200_000
    keys = np.random.default_rng(0).integers(-2**63, 2**63 - 1, n, dtype=np.int64)
    ix.insert_arrays(keys, np.zeros(n, np.uint32), np.arange(n, dtype=np.uint64), np.ones(n, np.uint32))
    assert ix.memory_bytes() / len(ix) <= 32
    assert ix.contains(keys[:300]).all()


# ---------------------------------------------------------------------------- scale layout
import threading  # noqa: E402

import pytest  # noqa: E402
from hypothesis import (  # noqa: E402
    HealthCheck,
    settings,
    strategies as st,  # noqa: E402
)
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule  # noqa: E402


class SmallIndex(Index):
    """Regions of 32 entries: every few inserts grow the arena (the rare path at 10M+ pages)."""

    initial_cap = 32


# a small key pool so operations collide; extremes and sequential keys stress the key mixing
KEYS = [-2**63, 2**63 - 1, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 1 << 60, (1 << 60) + 1, -(1 << 62)] + \
    np.random.default_rng(1).integers(-2**63, 2**63 - 1, 25, dtype=np.int64).tolist()
keys_st = st.sampled_from(KEYS)
locs_st = st.builds(Loc, st.integers(0, 3), st.integers(0, 2**40), st.integers(0, 2**31))


class IndexVsDict(RuleBasedStateMachine):
    """Every Index operation against a plain dict model; merges run in the background meanwhile."""

    def __init__(self) -> None:
        super().__init__()
        self.model: dict[int, Loc] = {}
        self.ix: Index | None = None

    @rule(kind=st.sampled_from(["default", "small"]), limit=st.integers(1, 6))
    def fresh(self, kind: str, limit: int) -> None:
        self.ix = (Index if kind == "default" else SmallIndex)(delta_limit=limit)
        self.model = {}

    def _ix(self) -> Index:
        if self.ix is None:
            self.ix = SmallIndex(delta_limit=3)
        return self.ix

    @rule(k=keys_st, loc=locs_st)
    def insert(self, k: int, loc: Loc) -> None:
        self._ix().insert(k, loc)
        self.model[k] = loc

    @rule(pairs=st.lists(st.tuples(keys_st, locs_st), max_size=8), if_absent=st.booleans())
    def insert_many(self, pairs: list[tuple[int, Loc]], if_absent: bool) -> None:
        n = self._ix().insert_many([k for k, _ in pairs], [v for _, v in pairs], if_absent=if_absent)
        want = 0
        for k, v in pairs:
            if if_absent and k in self.model:
                continue
            self.model[k] = v
            want += 1
        assert n == want

    @rule(pairs=st.lists(st.tuples(keys_st, locs_st), max_size=30), if_absent=st.booleans())
    def insert_arrays(self, pairs: list[tuple[int, Loc]], if_absent: bool) -> None:
        self._ix().insert_arrays(np.array([k for k, _ in pairs], np.int64),
                                 np.array([v.unit for _, v in pairs], np.uint32),
                                 np.array([v.offset for _, v in pairs], np.uint64),
                                 np.array([v.length for _, v in pairs], np.uint32), if_absent=if_absent)
        batch: dict[int, Loc] = {}
        for k, v in pairs:
            batch[k] = v  # the last duplicate wins
        for k, v in batch.items():
            if not (if_absent and k in self.model):
                self.model[k] = v

    @rule(k=keys_st, loc=locs_st, current=st.booleans())
    def remove_if_match(self, k: int, loc: Loc, current: bool) -> None:
        if current and k in self.model:
            loc = self.model[k]
        removed = self._ix().remove_if_match(k, loc)
        assert removed == (self.model.get(k) == loc)
        if removed:
            del self.model[k]

    @rule(unit=st.integers(0, 3))
    def drop_unit(self, unit: int) -> None:
        n = self._ix().drop_unit(unit)
        doomed = [k for k, v in self.model.items() if v.unit == unit]
        assert n == len(doomed)
        for k in doomed:
            del self.model[k]

    @rule()
    def settle(self) -> None:
        self._ix().settle()

    @rule()
    def clear(self) -> None:
        self._ix().clear()
        self.model.clear()

    @rule(data=st.data())
    def export_round_trip(self, data: st.DataObject) -> None:
        arrays = self._ix().export()
        assert {k for k in arrays} == {"keys", "units", "offsets", "lengths"}
        assert len(set(arrays["keys"].tolist())) == len(arrays["keys"])
        other = Index(delta_limit=data.draw(st.integers(1, 5)))
        other.insert_arrays(**arrays)
        assert dict(other.items()) == self.model

    @invariant()
    def lookups_match(self) -> None:
        ix = self._ix()
        q = np.array(KEYS, dtype=np.int64)
        assert ix.contains(q).tolist() == [k in self.model for k in KEYS]
        assert ix.get_many(q) == [self.model.get(k) for k in KEYS]
        assert [ix.get(k) for k in KEYS[:6]] == [self.model.get(k) for k in KEYS[:6]]
        assert len(ix) == len(self.model)
        assert dict(ix.items()) == self.model


TestIndexVsDict = IndexVsDict.TestCase
TestIndexVsDict.settings = settings(max_examples=60, stateful_step_count=40, deadline=None,
                                    suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("cls", [Index, SmallIndex])
def test_readers_never_see_a_wrong_loc_or_miss_a_settled_key(cls: type[Index]) -> None:
    """A writer inserts, overwrites, removes and drops a unit while readers look up without pause."""
    rng = np.random.default_rng(7)
    stable = rng.integers(-2**63, 2**63 - 1, 20_000, dtype=np.int64)
    fresh = rng.integers(-2**63, 2**63 - 1, 30_000, dtype=np.int64)
    churn = stable[:200]  # overwritten with versions 0..9: Loc(unit 1, offset v, length k & 0xffff)
    doomed = rng.integers(-2**63, 2**63 - 1, 3_000, dtype=np.int64)  # all in unit 2, then dropped
    ix = cls(delta_limit=512)
    ix.insert_arrays(stable, np.ones(len(stable), np.uint32), np.zeros(len(stable), np.uint64),
                     (stable & 0xFFFF).astype(np.uint32))
    ix.insert_arrays(doomed, np.full(len(doomed), 2, np.uint32), np.zeros(len(doomed), np.uint64),
                     np.ones(len(doomed), np.uint32))
    done_upto = [0]   # fresh[:done_upto] are inserted (and never touched again)
    dropped = [False]
    stop = threading.Event()
    errors: list[str] = []

    def writer() -> None:
        try:
            for i, k in enumerate(fresh.tolist()):
                ix.insert(k, Loc(3, i, 7))
                done_upto[0] = i + 1
                if i % 100 == 0:
                    v = (i // 100) % 10
                    for c in churn[:20].tolist():
                        ix.insert(c, Loc(1, v, c & 0xFFFF))
                if i == 10_000:
                    ix.drop_unit(2)
                    dropped[0] = True
                if i % 1000 == 999:
                    ix.remove_if_match(int(fresh[i - 999]), Loc(3, i - 999, 7))  # fresh[i-999] goes away
        finally:
            stop.set()

    def reader() -> None:
        r = np.random.default_rng()
        while not stop.is_set() and not errors:
            upto, was_dropped = done_upto[0], dropped[0]
            s = stable[r.integers(0, len(stable), 150)]
            f_idx = r.integers(0, max(upto, 1), 150) if upto else np.empty(0, np.int64)
            f_idx = f_idx[f_idx % 1000 != 0]  # never removed
            q = np.concatenate([s, fresh[f_idx], doomed[:50]])
            hit = ix.contains(q)
            locs = ix.get_many(q)
            if not hit[:len(s) + len(f_idx)].all():
                errors.append("a settled key was missed")
            for k, loc in zip(s.tolist(), locs[:len(s)]):
                ok = loc is not None and loc.unit == 1 and loc.length == (k & 0xFFFF) and loc.offset < 10
                if not ok:
                    errors.append(f"stable key {k}: {loc}")
            for j, loc in zip(f_idx.tolist(), locs[len(s):len(s) + len(f_idx)]):
                if loc != Loc(3, j, 7):
                    errors.append(f"fresh key {j}: {loc}")
            if was_dropped and (hit[-50:].any() or any(x is not None for x in locs[-50:])):
                errors.append(f"a dropped unit's key was found: hit {hit[-50:].sum()} locs {[x for x in locs[-50:] if x is not None][:3]} dead {ix.layout()['dead']}")

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]
    ix.settle()
    assert len(ix) == len(stable) + len(fresh) - len(fresh) // 1000
    assert not ix.contains(doomed).any()
    assert ix.contains(stable).all()


def test_export_survives_a_snapshot_file_round_trip(tmp_path) -> None:
    rng = np.random.default_rng(3)
    keys = rng.integers(-2**63, 2**63 - 1, 50_000, dtype=np.int64)
    ix = Index(delta_limit=1000)
    ix.insert_arrays(keys[:40_000], np.arange(40_000, dtype=np.uint32) % 7, np.arange(40_000, dtype=np.uint64),
                     np.full(40_000, 9, np.uint32))
    for i, k in enumerate(keys[40_000:].tolist()):  # some still in deltas when exported
        ix.insert(k, Loc(8, i, 10))
    ix.remove_if_match(int(keys[0]), Loc(0, 0, 9))
    ix.drop_unit(3)
    arrays = ix.export()
    assert arrays["keys"].dtype == np.int64 and arrays["units"].dtype == np.uint32
    assert arrays["offsets"].dtype == np.uint64 and arrays["lengths"].dtype == np.uint32
    np.savez(tmp_path / "snap.npz", **arrays)
    with np.load(tmp_path / "snap.npz") as z:
        back = Index()
        back.insert_arrays(z["keys"], z["units"], z["offsets"], z["lengths"])
    assert dict(back.items()) == dict(ix.items())
    assert len(back) == 50_000 - 1 - sum(1 for i in range(1, 40_000) if i % 7 == 3)


def test_sequential_keys_spread_over_the_directory() -> None:
    """Keys 0..n-1 (not hashes) must not pile into one bucket: the window stays small."""
    ix = Index()
    n = 100_000
    ix.insert_arrays(np.arange(n, dtype=np.int64), np.zeros(n, np.uint32), np.zeros(n, np.uint64),
                     np.ones(n, np.uint32))
    assert ix.layout()["window"] <= 64
    assert ix.contains(np.arange(-5, n + 5, dtype=np.int64)).sum() == n


def test_scale_benchmark_runs_end_to_end() -> None:
    """The `lifeboat bench` index section, tiny and in-process: it runs and reports every figure."""
    from lifeboat_cache.bench.index_scale import measure, table

    r = measure(3000, quick=True)
    assert r["pages"] == 3000 and r["lookups_with_writer"] > 0 and r["writer_inserts"] == 1500
    assert all(r[k] > 0 for k in ("bulk_insert_s", "exists_idle_p50_ms", "exists_writer_p99_ms",
                                  "B_per_page_estimate"))
    assert "| index | 3,000 |" in table([r])
    from lifeboat_cache.bench.index_reopen import measure_reopen, reopen_table

    ro = measure_reopen(5000)
    assert all(ro[f"{m}_full_s"] >= ro[f"{m}_first_hit_s"] > 0 and ro[f"{m}_cpu_s"] > 0
               for m in ("clean", "stale", "crash"))
    assert ro["units"] == 3 and "| 5,000 | 3 |" in reopen_table([ro])


def test_limited_address_space_starts_small_and_still_works(monkeypatch) -> None:
    """Under `ulimit -v` the 0.8 GB reservation fails: the index starts at 65,536 entries per shard."""
    import lifeboat_cache.index.arena as arena_mod

    real = arena_mod.reserve

    def limited(n: int, dtype: type) -> np.ndarray:
        if n > 17 * 65536:
            raise MemoryError("address space limit")
        return real(n, dtype)

    monkeypatch.setattr(arena_mod, "reserve", limited)
    ix = Index(delta_limit=100)
    assert ix.layout()["cap"] == 65536
    keys = np.random.default_rng(5).integers(-2**63, 2**63 - 1, 50_000, dtype=np.int64)
    ix.insert_arrays(keys, np.ones(len(keys), np.uint32), np.zeros(len(keys), np.uint64),
                     np.ones(len(keys), np.uint32))
    for k in keys[:500].tolist():
        ix.insert(k, Loc(2, 1, 1))
    ix.settle()
    assert len(ix) == 50_000 and ix.contains(keys).all() and ix.get(int(keys[0])) == Loc(2, 1, 1)


def test_digest_cache_gives_the_keyed_digests_and_stays_bounded() -> None:
    """The store's digest cache returns exactly what keys.digests computes, per namespace, for str and
    bytes keys (also unhashable ones), through put/get's call and exists' `index_keys`; only
    `index_keys` fills it, and it empties itself when full."""
    import os

    from lifeboat_cache.records.keys import DigestCache, digests

    ns1, ns2 = os.urandom(16), os.urandom(16)
    ks: list = [f"{i:064x}" for i in range(100)] + [b"raw-bytes", "raw-bytes"]
    c = DigestCache(limit=150)
    for _ in range(2):  # computed, then cached
        for ns in (ns1, ns2):
            ds, ik = c(ns, ks)
            want_ds, want_ik = digests(ns, ks)
            assert ds == want_ds and ik.dtype == np.int64 and ik.tolist() == want_ik.tolist()
    assert not set(c(ns1, ks)[0]) & set(c(ns2, ks)[0])  # the namespace is in every digest
    assert c(ns1, [bytearray(b"raw-bytes")])[0] == digests(ns1, [b"raw-bytes"])[0]
    assert c._size == 0  # put / get (`__call__`) remember nothing
    for _ in range(2):  # exists (`index_keys`): computed and remembered, then joined from the cache
        for ns in (ns1, ns2):
            got = c.index_keys(ns, ks)
            assert got.dtype == np.int64 and got.tolist() == digests(ns, ks)[1].tolist()
    assert 0 < c._size <= 150  # 204 entries asked for: emptied once on the way, bounded
    assert c.index_keys(ns1, ks[:100]).tolist() == digests(ns1, ks[:100])[1].tolist()  # refilled
    assert c(ns2, ks)[0] == digests(ns2, ks)[0]  # what exists remembered serves put / get exactly
    assert c.index_keys(ns1, [bytearray(b"raw-bytes"), "raw-bytes"]).tolist() == [digests(ns1, [b"raw-bytes"])[1][0]] * 2
    assert c(ns1, [])[1].shape == (0,) and c.index_keys(ns1, []).shape == (0,)
    with pytest.raises(TypeError, match="str or bytes"):
        c(ns1, [5])
    with pytest.raises(TypeError, match="str or bytes"):
        c.index_keys(ns1, [5])


def test_reopen_of_many_segments_indexes_every_entry(tmp_path) -> None:
    """The initial rebuild batches its inserts: after a crash (no snapshot) and with a stale snapshot
    (segments newer than it, one changed under it), every trailer entry is indexed at its location."""
    import os

    from lifeboat_cache.bench.index_reopen import PER_UNIT, make_store, open_dir
    from lifeboat_cache.tiers.segments.snapshot_file import SNAPSHOT_NAME

    root = str(tmp_path)
    n_old = 12 * PER_UNIT + 17
    keys = make_store(root, n_old)
    d = open_dir(root)
    d.open(background=False)
    d.close()
    assert os.path.exists(os.path.join(root, SNAPSHOT_NAME))
    keys = np.concatenate([keys, make_store(root, 9 * PER_UNIT, first_unit=13)])

    def check() -> None:
        d = open_dir(root)
        d.open(background=False)
        try:
            assert d.rebuilt and len(d.index) == len(keys)
            locs = d.index.get_many(keys)
            names = sorted(f for f in os.listdir(root) if f.endswith(".seg"))
            for i in range(0, len(keys), 997):
                unit = i // PER_UNIT if i < n_old else 13 + (i - n_old) // PER_UNIT
                assert d.unit_name(locs[i].unit) == names[unit] and locs[i].offset == (i % PER_UNIT if i < n_old
                                                                                       else (i - n_old) % PER_UNIT) << 16
        finally:
            d.stop_refresh()

    check()  # stale snapshot
    os.unlink(os.path.join(root, SNAPSHOT_NAME))
    check()  # crash: no snapshot


def test_delta_arrays_converts_in_chunks_without_a_garbage_collection() -> None:
    """A frozen delta (several chunks, with removals) becomes exactly its arrays, and the conversion
    creates no object per entry: no garbage collection (of SGLang's whole heap, under the GIL) can
    start in the middle of a merge because of it."""
    import gc

    from lifeboat_cache.index.deltas import DELTA_CHUNK, delta_arrays

    n = 3 * DELTA_CHUNK + 7
    ks = np.random.default_rng(9).integers(-2**63, 2**63 - 1, n, dtype=np.int64).tolist()
    f = {k: None if i % 5 == 0 else Loc(i, 2**40 + i, 4096 + i) for i, k in enumerate(ks)}
    starts: list[int] = []

    def seen(phase: str, info: dict) -> None:
        if phase == "start":
            starts.append(info["generation"])

    gc.collect()
    gc.callbacks.append(seen)
    try:
        keys, units, offs, lens, live = delta_arrays(f)
    finally:
        gc.callbacks.remove(seen)
    assert starts == []
    assert keys.tolist() == ks and live.tolist() == [i % 5 != 0 for i in range(n)]
    want = [(i, 2**40 + i, 4096 + i) for i in range(n) if i % 5]
    assert list(zip(units[live].tolist(), offs[live].tolist(), lens[live].tolist())) == want
    assert (units.dtype, offs.dtype, lens.dtype) == (np.uint32, np.uint64, np.uint32)
