"""The index's recent changes: dicts of key -> Loc (None = removed) read and turned into sorted columns.

Writers put changes into the active delta; a full one is frozen (never written again) and merged into
main by index.Index. What is here is stateless: lookups through a (active, frozen) pair of deltas, and
the conversions of deltas into sorted columns that a merge, a bulk insert or an export needs. The
caller holds whatever lock the deltas it passes need.
"""

from __future__ import annotations

import time
from operator import attrgetter

import numpy as np

from .order import Loc, member, mix_keys, unmix_keys

MISSING = object()                 # resolve(): no delta mentions the key (None means "removed")
DELTA_CHUNK = 512                  # delta entries converted per GIL release (~0.1-0.2 ms of work)

_NO_LOC = Loc(0, 0, 0)  # stands in for a removal (None) while a delta becomes arrays
_UNIT, _OFFSET, _LENGTH = attrgetter("unit"), attrgetter("offset"), attrgetter("length")


def resolve(key: int, active: dict, frozen: tuple) -> object:
    """The newest delta's value of key: a Loc, None (removed) or MISSING (no delta mentions it)."""
    v = active.get(key, MISSING)
    if v is not MISSING:
        return v
    for f in frozen:
        v = f.get(key, MISSING)
        if v is not MISSING:
            return v
    return MISSING


def in_deltas(keys: np.ndarray, active: dict, frozen: tuple) -> np.ndarray:
    """Positions of `keys` that some delta mentions (C-speed set intersections, no Python loop)."""
    ql = keys.tolist()
    special = active.keys() & ql
    for f in frozen:
        special |= f.keys() & ql
    if not special:
        return np.empty(0, dtype=np.int64)
    return np.flatnonzero(member(keys, np.fromiter(special, dtype=np.int64, count=len(special))))


def merged_deltas(active: dict, frozen: tuple) -> dict[int, Loc | None]:
    """All deltas as one dict, the newest value of each key winning."""
    merged: dict[int, Loc | None] = {}
    for f in reversed(frozen):
        merged.update(f)
    merged.update(active)
    return merged


def delta_arrays(f: dict[int, Loc | None]) -> tuple[np.ndarray, ...]:
    """A frozen delta as arrays (keys, units, offsets, lengths, live), in small chunks that each end
    with a GIL release (sleep(0)): readers in other threads then wait for this thread at most one
    chunk (~0.1-0.2 ms), not a switch interval. No object is created per entry (no tuples), so the
    conversion never triggers a garbage collection of the whole heap while it holds the GIL."""
    n = len(f)
    ks, vs = list(f), list(f.values())  # a frozen delta is never written again
    keys = np.empty(n, dtype=np.int64)
    units, offs = np.empty(n, dtype=np.uint32), np.empty(n, dtype=np.uint64)
    lens, live = np.empty(n, dtype=np.uint32), np.empty(n, dtype=bool)
    for a in range(0, n, DELTA_CHUNK):
        c = vs[a:a + DELTA_CHUNK]
        b = a + len(c)
        keys[a:b] = ks[a:b]
        live[a:b] = [v is not None for v in c]
        c = [v or _NO_LOC for v in c]  # a removal: any location, live=False leaves it out
        units[a:b] = np.fromiter(map(_UNIT, c), dtype=np.uint32, count=len(c))
        offs[a:b] = np.fromiter(map(_OFFSET, c), dtype=np.uint64, count=len(c))
        lens[a:b] = np.fromiter(map(_LENGTH, c), dtype=np.uint32, count=len(c))
        time.sleep(0)
    return keys, units, offs, lens, live


def sorted_mixed(keys: np.ndarray, *cols: np.ndarray) -> tuple[np.ndarray, ...]:
    """(mixed keys sorted, *cols in that order); equal keys keep their input order."""
    x = mix_keys(keys)
    order = np.argsort(x)
    x = x[order]
    if len(x) > 1 and (x[1:] == x[:-1]).any():  # duplicates: their input order must survive
        order = np.argsort(mix_keys(keys), kind="stable")
        x = mix_keys(keys)[order]
    return (x,) + tuple(c[order] for c in cols)


def bulk_vs_deltas(active: dict, frozen: tuple, x: np.ndarray, u: np.ndarray, o: np.ndarray, n: np.ndarray,
                   live: np.ndarray, if_absent: bool) -> tuple[np.ndarray, ...]:
    """Bulk keys a delta mentions: overwrite them in `active` (deltas win over main), or skip them if
    present there; returns the columns left for main. Under the index's write lock."""
    if not active and not frozen:
        return x, u, o, n, live
    keys = unmix_keys(x)
    idx = in_deltas(keys, active, frozen)
    if not len(idx):
        return x, u, o, n, live
    for i in idx.tolist():
        k = int(keys[i])
        if if_absent and resolve(k, active, frozen) is not None:
            continue
        active[k] = Loc(int(u[i]), int(o[i]), int(n[i]))
    keep = np.ones(len(x), dtype=bool)
    keep[idx] = False
    return x[keep], u[keep], o[keep], n[keep], live[keep]


def overlay(cols: list[np.ndarray], dx: np.ndarray, du: np.ndarray, do: np.ndarray, dl: np.ndarray,
            dlive: np.ndarray) -> list[np.ndarray]:
    """Sorted columns with sorted unique changes applied (a change wins; live=False removes)."""
    x = cols[0]
    if len(x):
        pos = np.minimum(np.searchsorted(x, dx), len(x) - 1)
        hit = x[pos] == dx
        if hit.any():
            keep = np.ones(len(x), dtype=bool)
            keep[pos[hit]] = False
            cols = [c[keep] for c in cols]
    adds = [dx[dlive], du[dlive], do[dlive], dl[dlive]]
    at = np.searchsorted(cols[0], adds[0])
    n_old, n_add = len(cols[0]), len(adds[0])
    new_pos = at + np.arange(n_add)
    old_pos = np.arange(n_old) + np.cumsum(np.bincount(at, minlength=n_old + 1))[:n_old]
    out = []
    for old, add in zip(cols, adds):
        dst = np.empty(n_old + n_add, dtype=old.dtype)
        dst[old_pos] = old
        dst[new_pos] = add
        out.append(dst)
    return out
