"""The ghost: a page written again after a long absence is cache-averse; one that just missed the cut,
or was never evicted, is not; the table stays bounded and forgets on collision (never the unsafe way)."""

from __future__ import annotations

from lifeboat_cache.retention import GHOST_SPAN, Ghost
from lifeboat_cache.retention.ghost import MAX_SLOTS


def test_a_page_back_after_a_long_absence_is_averse_one_back_soon_is_not() -> None:
    g = Ghost()
    held = 10
    g.evicted([7], held)
    g.evicted(range(1000, 1000 + GHOST_SPAN * held - 1), held)  # 7 went GHOST_SPAN x held evictions ago
    assert not g.averse(7, held), "a page that just missed the cut must go to the tail as usual"
    g.evicted([8], held)
    g.evicted(range(5000, 5000 + GHOST_SPAN * held + 1), held)
    assert g.averse(8, held), "a page evicted long ago and written again is cache-averse"


def test_never_evicted_pages_are_not_averse_and_a_page_is_judged_once_per_return() -> None:
    g = Ghost()
    g.evicted([1], 1)
    g.evicted(range(100, 100 + GHOST_SPAN + 5), 1)
    assert not g.averse(2, 1), "a page never evicted is not averse"
    assert g.averse(1, 1)
    assert not g.averse(1, 1), "once judged it is forgotten until it is evicted again"


def test_negative_keys_and_growth_keep_what_was_evicted() -> None:
    g = Ghost()
    g.evicted([-5, -(1 << 62)], 1)
    g.evicted(range(10, 10 + 10 * GHOST_SPAN), 1000)  # grows the table: older entries are carried over
    assert g.averse(-5, 1) and g.averse(-(1 << 62), 1)


def test_the_table_is_bounded() -> None:
    g = Ghost()
    g.evicted([1], 10 ** 9)
    assert len(g._keys) == MAX_SLOTS
