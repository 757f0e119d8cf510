"""The retention bench's traces and its offline caches (bench/retention_traces.py): the limits the bench
prints beside the backends must be right, or a policy's distance to them means nothing."""

from __future__ import annotations

from lifeboat_cache.bench import retention_traces as traces


def test_conversations_in_turn_come_back_after_every_other_one_and_grow_each_turn() -> None:
    trace = traces.round_robin(5, 3, 4, 2)
    assert len(trace) == 15
    roots = [req[0] for req in trace]
    assert sorted(roots[:5]) == sorted(set(roots)) and roots[:5] == roots[5:10] == roots[10:]  # same order each turn
    for c in range(5):
        visits = [req for req in trace if req[0] == roots[c]]
        assert [len(v) for v in visits] == [4, 6, 8]
        assert visits[0] == visits[1][:4] and visits[1] == visits[2][:6]  # each turn extends the last one's prompt
    assert traces.working_set(trace) == 5 * 8
    assert traces.returning_pages(trace) == 5 * (4 + 6)


def test_a_cycle_longer_than_the_store_defeats_lru_but_not_the_optimum() -> None:
    trace = traces.round_robin(12, 4, 4, 2)
    ws = traces.working_set(trace)
    small = ws // 3
    assert traces.lru(trace, small).hits == 0  # every conversation was pushed out before it came back
    best = traces.belady(trace, small)
    assert 0 < best.hits <= best.returning and best.hit_rate > 0.2
    whole = traces.lru(trace, ws)
    assert whole.hits == whole.returning and whole.written == ws  # room for all: every return served


def test_the_offline_caches_follow_hicaches_prefix_rule() -> None:
    # pages 0-3 once, then a request whose first page was never stored: nothing after a miss is served
    trace = [[0, 1, 2, 3], [9, 0, 1, 2]]
    for outcome in (traces.lru(trace, 8), traces.belady(trace, 8)):
        assert outcome.hits == 0 and outcome.returning == 3
    # two pages of room, a one-off page in between: LRU drops page 0 (the prefix's head: nothing served),
    # the optimum drops page 1, which is needed last, and serves page 0
    trace = [[0, 1], [2], [0, 1]]
    assert traces.lru(trace, 2).hits == 0
    assert traces.belady(trace, 2).hits == 1
