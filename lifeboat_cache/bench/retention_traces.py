"""Traces of returning users, and what an exact LRU and Belady's optimum keep of them (offline).

A trace is a list of requests; a request is the page ids of a prompt in prefix order, as HiCache sees
it: a request is served from storage up to its first missing page (`batch_exists` counts a prefix),
and every page from there on is recomputed and written back. The offline caches follow the same rule,
so their hit rates are comparable with the backends' (hits = pages served, of pages asked for).
"""

from __future__ import annotations

import heapq
import random
from collections import OrderedDict
from dataclasses import dataclass

Request = list[int]


@dataclass(frozen=True)
class Outcome:
    hits: int
    returning: int  # pages asked for that were asked for before (a first request can never hit)
    written: int  # pages written back (missing when asked for)

    @property
    def hit_rate(self) -> float:
        """Hits per returning page: 1.0 is every page that came back served from storage."""
        return self.hits / self.returning if self.returning else 0.0


def returning_pages(trace: list[Request]) -> int:
    seen: set[int] = set()
    n = 0
    for req in trace:
        n += sum(p in seen for p in req)
        seen.update(req)
    return n


def hot_set(rounds: int, hot: int = 24, one_off: int = 24) -> list[Request]:
    """Each round: the same `hot` pages (a returning user's prefix), then `one_off` new pages."""
    out: list[Request] = []
    fresh = hot
    for _ in range(rounds):
        out.append(list(range(hot)))
        out.append(list(range(fresh, fresh + one_off)))
        fresh += one_off
    return out


def zipf(docs: int, pages_per_doc: int, requests: int, alpha: float = 0.9, seed: int = 1) -> list[Request]:
    """Requests for documents of `pages_per_doc` pages, document popularity Zipf(alpha)."""
    rng = random.Random(seed)
    weights = [1.0 / (r + 1) ** alpha for r in range(docs)]
    picks = rng.choices(range(docs), weights=weights, k=requests)
    return [list(range(d * pages_per_doc, (d + 1) * pages_per_doc)) for d in picks]


def multi_turn(conversations: int, turns: int, pages_per_turn: int, active: int = 8, seed: int = 2) -> list[Request]:
    """Conversations that grow by `pages_per_turn` each turn and come back after others: `active` of
    them are open at a time, the next turn goes to a random open one, a finished one is replaced."""
    rng = random.Random(seed)
    span = turns * pages_per_turn
    progress: dict[int, int] = {}
    waiting = list(range(conversations))
    out: list[Request] = []
    while waiting or progress:
        while waiting and len(progress) < active:
            progress[waiting.pop(0)] = 0
        c = rng.choice(sorted(progress))
        progress[c] += 1
        out.append(list(range(c * span, c * span + progress[c] * pages_per_turn)))
        if progress[c] == turns:
            del progress[c]
    return out


def round_robin(conversations: int, turns: int, first_pages: int, pages_per_turn: int, seed: int = 3) -> list[Request]:
    """The serving bench's conversations (bench/serving_trace.py): turn 1 of every conversation (seeded
    order), then turn 2 of every one, ...; each starts with `first_pages` and grows by `pages_per_turn`.
    A conversation comes back after all the others: its reuse distance is the whole cycle, so a store
    smaller than the cycle loses it under any recency order (LRU serves ~0) while Belady keeps a subset."""
    order = list(range(conversations))
    random.Random(seed).shuffle(order)
    span = first_pages + turns * pages_per_turn
    return [list(range(c * span, c * span + first_pages + t * pages_per_turn)) for t in range(turns) for c in order]


def _served(req: Request, cache: object) -> int:
    """Pages of a request served from `cache`: the stored prefix, up to the first missing page."""
    run = 0
    while run < len(req) and req[run] in cache:  # type: ignore[operator]
        run += 1
    return run


def working_set(trace: list[Request]) -> int:
    return len({p for r in trace for p in r})


def lru(trace: list[Request], capacity: int) -> Outcome:
    """An exact page LRU of `capacity` pages, HiCache's prefix rule."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = written = 0
    for req in trace:
        hits += _served(req, cache)
        for p in req:
            if p in cache:
                cache.move_to_end(p)
            else:
                written += 1
                cache[p] = None
                while len(cache) > capacity:
                    cache.popitem(last=False)
    return Outcome(hits, returning_pages(trace), written)


def belady(trace: list[Request], capacity: int) -> Outcome:
    """Belady's optimum (evict the page used again farthest in the future), HiCache's prefix rule: the
    limit no online policy reaches."""
    flat = [p for r in trace for p in r]
    nxt = [0] * len(flat)
    seen: dict[int, int] = {}
    for i in range(len(flat) - 1, -1, -1):
        nxt[i] = seen.get(flat[i], len(flat) + i)  # never again: farthest, oldest first
        seen[flat[i]] = i
    cache: dict[int, int] = {}  # page -> its next use
    heap: list[tuple[int, int]] = []  # (-next use, page), stale entries skipped
    hits = written = 0
    i = 0
    for req in trace:
        hits += _served(req, cache)
        for p in req:
            if p not in cache:
                written += 1
                while len(cache) >= capacity and heap:
                    use, victim = heapq.heappop(heap)
                    if cache.get(victim) == -use:
                        del cache[victim]
            cache[p] = nxt[i]
            heapq.heappush(heap, (-nxt[i], p))
            i += 1
    return Outcome(hits, returning_pages(trace), written)
