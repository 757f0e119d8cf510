"""The index's entry type and its order: Loc, the key mixing that sorts and shards entries, and the
vector membership helpers every part of the index uses.

Entries are sorted by their *mixed* key (key * an odd constant mod 2**64: a bijection that spreads
even sequential keys) and split by the mixed key's top SHARD_BITS bits into SHARDS shards. Files that
store entries in index order (tiers/segments/snapshot_file.py) record MIX_CONSTANT and check it on load.
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass

import numpy as np

DEAD = np.uint32(0xFFFFFFFF)  # unit of a dropped main entry (until the next merge of its shard)

SHARD_BITS = 4
SHARDS = 1 << SHARD_BITS           # shard of a key: its mixed key's top SHARD_BITS bits (shard_of)
_MIX = 0x9E3779B97F4A7C15          # odd, so multiplying mod 2**64 is a bijection
_UNMIX = pow(_MIX, -1, 1 << 64)
MIX_CONSTANT = _MIX  # part of any file that stores entries in index order (tiers/segments/snapshot_file.py checks it)


@dataclass(frozen=True, slots=True)
class Loc:
    """Where a record lives in a tier: unit (segment/object id), byte offset and record length."""

    unit: int
    offset: int
    length: int


_libc_trim = getattr(ctypes.CDLL(None), "malloc_trim", None) if sys.platform.startswith("linux") else None


def trim_heap() -> None:
    """Hand the C heap's free memory back to the OS (glibc's malloc_trim; elsewhere nothing).

    A rebuild frees tens of MB of sorted columns per batch; glibc keeps freed heap memory resident,
    so without this a 10M-page crash reopen stayed at 38 B/page resident where the index holds 27.
    It walks the heap and what it returns is faulted in again when used: once after a rebuild, not
    per batch (per batch cost 0.2 s of a 2.7 s rebuild). Raises nothing.
    """
    if _libc_trim is not None:
        _libc_trim(0)


def mix_keys(keys: np.ndarray) -> np.ndarray:
    """The index's order key of each int64 key (uint64): entries are sorted by it, shard by shard."""
    return np.ascontiguousarray(keys, dtype=np.int64).view(np.uint64) * np.uint64(_MIX)


def unmix_keys(x: np.ndarray) -> np.ndarray:
    """The int64 keys of mixed keys (the inverse of mix_keys)."""
    return (np.asarray(x, dtype=np.uint64) * np.uint64(_UNMIX)).view(np.int64)


def shard_of(x: np.ndarray) -> np.ndarray:
    """Shard of each mixed key."""
    return (np.asarray(x, dtype=np.uint64) >> np.uint64(64 - SHARD_BITS)).astype(np.int64)


def shard_cuts(x: np.ndarray) -> np.ndarray:
    """Positions in sorted mixed keys `x` where each shard starts (SHARDS + 1 cuts, the last is len(x))."""
    return np.searchsorted(x >> np.uint64(64 - SHARD_BITS), np.arange(SHARDS + 1, dtype=np.uint64))


def unit_mask(col: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """col[i] in ids (sorted unique uint32 unit ids): a table gather when ids are small, else a search."""
    if len(ids) == 1:
        return col == ids[0]
    top = int(ids[-1])
    if top < (1 << 22):
        table = np.zeros(top + 2, dtype=bool)
        table[ids] = True
        return table[np.minimum(col, np.uint32(top + 1))]
    return member(col, ids)


def member(values: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """values[i] in pool, by binary search (np.isin can take seconds on wide-range int64 keys)."""
    if not len(pool):
        return np.zeros(len(values), dtype=bool)
    pool = np.sort(pool)
    return pool[np.minimum(np.searchsorted(pool, values), len(pool) - 1)] == values
