"""AccessTable and the retention policy: counts are capped and used up by keeps, merges never cool a
record, and the policy evicts what was not read, keeps what mostly was, reinserts the rest in budget."""

from __future__ import annotations

import threading
import time

from lifeboat_cache.retention import (
    EVICT, HIT_CAP, KEEP, KEEP_PLACE, KEEP_WHOLE_SHARE, REINSERT, AccessTable, RewriteBudget, choose)


def test_reads_are_counted_up_to_the_cap_and_each_keep_uses_one_up() -> None:
    a = AccessTable()
    for _ in range(HIT_CAP + 5):
        a.hit("seg", 100)
    a.hit("seg", 200)
    assert a.hits_of("seg") == {100: HIT_CAP, 200: 1}
    a.keep("seg", 7)
    assert a.hits_of("seg") == ({100: HIT_CAP - 1} if HIT_CAP > 1 else {})
    assert a.position("seg", 0) == 7 and a.position("other", 3) == 3
    for _ in range(HIT_CAP):
        a.keep("seg", 8)
    assert a.hits_of("seg") == {}, "a record not read again goes after HIT_CAP passes"


def test_a_batch_of_uses_counts_as_the_same_reads_one_by_one() -> None:
    """hit_many (batch_exists's leading hits, under one lock) leaves the table as hit() per record would, and
    moves the version only when a count moved."""
    one, many = AccessTable(), AccessTable()
    uses = {"seg-a": [0, 64, 0], "seg-b": [128]}
    for unit, offsets in uses.items():
        for o in offsets:
            one.hit(unit, o)
    v = many.version
    many.hit_many(uses)
    assert many.version > v
    assert {u: many.hits_of(u) for u in uses} == {u: one.hits_of(u) for u in uses} == {
        "seg-a": {0: min(2, HIT_CAP), 64: 1}, "seg-b": {128: 1}}
    assert many.read_records() == one.read_records() == 3
    for _ in range(HIT_CAP):
        many.hit_many(uses)
    v = many.version
    many.hit_many(uses)  # every count at the cap: nothing moved, so the state publisher has nothing to save
    assert many.version == v


def test_merge_takes_the_larger_count_and_the_later_position() -> None:
    a = AccessTable()
    a.hit("u1", 0)
    a.place("u1", 50)
    a.merge({"u1": {0: HIT_CAP, 64: 1}, "u2": {8: 1}}, {"u1": 40, "u2": 9})
    assert a.hits_of("u1") == {0: HIT_CAP, 64: 1} and a.hits_of("u2") == {8: 1}
    assert a.position("u1", 0) == 50 and a.position("u2", 0) == 9
    a.merge({"u1": {0: 1}}, {"u1": 10})  # an older, colder view changes nothing
    assert a.hits_of("u1")[0] == HIT_CAP and a.position("u1", 0) == 50
    a.merge({"u3": {0: 200}}, {})  # a hostile count is capped
    assert a.hits_of("u3") == {0: HIT_CAP}


def test_export_keeps_only_live_units_and_forget_drops_a_unit() -> None:
    a = AccessTable()
    a.hit("live", 1)
    a.hit("gone", 2)
    a.place("gone", 5)
    hits, order = a.export({"live"})
    assert hits == {"live": {1: 1}} and order == {}
    a.forget(["live"])
    assert a.hits_of("live") == {} and a.export()[0] == {"gone": {2: 1}}


def test_carry_moves_counts_to_a_new_unit() -> None:
    a = AccessTable()
    a.carry("keeper", {0: 1, 96: HIT_CAP + 3})
    assert a.hits_of("keeper") == {0: 1, 96: HIT_CAP}
    v = a.version
    a.carry("keeper", {})
    assert a.version == v, "nothing carried: nothing to publish"


def test_concurrent_hits_and_exports_do_not_break() -> None:
    a = AccessTable()
    stop = threading.Event()
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            while not stop.is_set():
                a.export()
        except BaseException as e:  # noqa: BLE001 - the test reports it
            errors.append(e)

    t = threading.Thread(target=reader)
    t.start()
    for i in range(20000):
        a.hit(f"u{i % 50}", i)
    stop.set()
    t.join()
    assert not errors
    assert a.read_records() == 20000


def test_policy_evicts_unread_keeps_mostly_read_and_reinserts_within_budget() -> None:
    budget = RewriteBudget(share=0.5, slack_bytes=0)
    most = int(1000 * KEEP_WHOLE_SHARE) + 1
    assert choose(1000, 0, budget) == EVICT
    assert choose(1000, most, budget) == KEEP
    assert choose(1000, 100, budget) == EVICT, "nothing written yet: no budget for a rewrite"
    budget.wrote(1000)
    assert budget.allows(500) and not budget.allows(501)
    assert choose(1000, 100, budget) == REINSERT
    budget.spend(450)
    assert choose(1000, 100, budget) == EVICT, "past the budget the unit goes as it is"
    assert choose(1000, most, budget) == KEEP, "keeping a unit whole costs no write"


def test_a_kept_unit_goes_near_its_last_read_and_ties_go_younger_first() -> None:
    a = AccessTable()
    before = int(time.time() * 1000)
    a.hit("u", 0)
    after = int(time.time() * 1000)
    tail = after + 1_000_000
    a.keep("u", tail)
    placed = a.position("u", 0)
    assert before + int(KEEP_PLACE * (tail - before)) <= placed <= after + int(KEEP_PLACE * (tail - after)) + 1
    assert placed < (before + tail) // 2, "near the last read, not halfway to the tail"
    # two units read by one request share a position: the younger (the deeper pages) goes first
    a.place("prefix", 500)
    a.place("tail", 500)
    units = {"prefix": 100, "tail": 200, "fresh": 499}
    order = sorted(units, key=lambda u: a.rank(u, units[u]))
    assert order == ["fresh", "tail", "prefix"]


def test_a_batch_of_uses_is_grouped_by_the_unit_the_index_holds_each_key_in() -> None:
    """offsets_by_unit: keys the index holds (in its main table and its deltas alike), by unit name; keys it
    does not hold, and units without a name (gone since), are left out."""
    import numpy as np

    from lifeboat_cache.index import Index, Loc
    from lifeboat_cache.retention import offsets_by_unit

    ix = Index(delta_limit=3)  # some keys merged into the main table, the last ones still in deltas
    for k, loc in enumerate([Loc(5, 0, 9), Loc(2, 64, 9), Loc(5, 128, 9), Loc(3, 7, 9), Loc(5, 256, 9)]):
        ix.insert(k, loc)
    names = {5: "seg-5", 2: "seg-2"}  # unit 3 is gone
    got = offsets_by_unit(ix, np.array([4, 0, 1, 3, 99, 2], np.int64), names.get)
    assert {u: sorted(o) for u, o in got.items()} == {"seg-5": [0, 128, 256], "seg-2": [64]}
    assert offsets_by_unit(ix, np.array([], np.int64), names.get) == {}
