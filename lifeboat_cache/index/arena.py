"""Memory layout of the index's main part: column arenas, regions, the directory and the lookup window.

Each shard lives in one region of four column arenas (uint64 key, uint32 unit, uint64 offset, uint32
length: 24 B per entry). The arenas are anonymous mmaps reserved up front, so only written pages are
resident and a growing shard is never copied. A directory (top `bits` of the mixed key -> first
position, ~2-4 entries per bucket) makes a batch lookup one gather of a `w`-key row per key from a
strided view of the key arena (`w` = the largest bucket); `w`+ copies of each shard's last entry pad
its region so a row never reads stale memory. What is here holds no lock and knows no shard's count:
main_table.MainTable decides what is written where.
"""

from __future__ import annotations

import mmap
import sys

import numpy as np

from .order import DEAD, SHARDS, SHARD_BITS

MIN_WINDOW = 8                     # narrowest lookup window (and padding) of a region
DEFAULT_CAP = 1 << 21              # entries reserved per region (17 regions: 32M entries, ~0.8 GB virtual)
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)


def reserve(n: int, dtype: type) -> np.ndarray:
    """A zero-filled array whose pages become resident only when written.

    Arena looks this up at each call, so a test can patch it here to simulate a limited address space.
    """
    size = max(n * np.dtype(dtype).itemsize, 1)
    try:
        mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | _MAP_NORESERVE,
                       prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except (OSError, ValueError, AttributeError):  # no anonymous mmap: plain (calloc'd) memory
        return np.zeros(n, dtype=dtype)  # MemoryError if even that is refused (RLIMIT_AS)
    return np.frombuffer(mm, dtype=dtype, count=n)


class Arena:
    """Four columns of (SHARDS + 1) regions of `cap` entries each; one region is the spare."""

    __slots__ = ("cap", "keys", "units", "offsets", "lengths")

    def __init__(self, cap: int) -> None:
        n = (SHARDS + 1) * cap
        self.cap = cap
        self.keys = reserve(n, np.uint64)
        self.units = reserve(n, np.uint32)
        self.offsets = reserve(n, np.uint64)
        self.lengths = reserve(n, np.uint32)

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(keys, units, offsets, lengths): the four columns, in that order."""
        return self.keys, self.units, self.offsets, self.lengths


class MainView:
    """What a lookup reads: arena, directory and window. Replaced whole when the arena or `bits` change."""

    __slots__ = ("arena", "dir", "bits", "shift", "win")

    def __init__(self, arena: Arena, directory: np.ndarray, bits: int, win: tuple[int, np.ndarray]) -> None:
        self.arena = arena
        self.dir = directory
        self.bits = bits
        self.shift = np.uint64(64 - bits)
        self.win = win  # (w, rows of w keys): read as one attribute so both always match


def window(a: Arena, w: int) -> tuple[int, np.ndarray]:
    """(w, view of the key arena as overlapping rows of w keys): row i = keys[i:i+w], no copy."""
    n = len(a.keys) - w + 1
    return w, np.lib.stride_tricks.as_strided(a.keys, shape=(n, w), strides=(a.keys.itemsize,) * 2,
                                              writeable=False)


def dir_dtype(arena_len: int) -> type:
    """The narrowest directory entry type that holds every position of an arena of this length."""
    return np.uint32 if arena_len < 2**32 else np.uint64


def dir_entries(starts: np.ndarray, base: int, dtype: type) -> np.ndarray:
    """Directory entries: the arena position of each bucket's first entry."""
    return (starts.astype(np.uint64) + np.uint64(base)).astype(dtype)


def buckets_of(old: np.ndarray, add: np.ndarray, s: int, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """First position and size of every directory bucket of shard s in the merge of two disjoint
    sorted key arrays (without merging them)."""
    bps = 1 << (bits - SHARD_BITS)
    cnt = np.bincount((old >> np.uint64(64 - bits)).astype(np.int64) - s * bps, minlength=bps)
    if len(add):
        cnt += np.bincount((add >> np.uint64(64 - bits)).astype(np.int64) - s * bps, minlength=bps)
    starts = np.concatenate(([0], np.cumsum(cnt)[:-1]))
    return starts, cnt


def pad(a: Arena, s: int, region: int, count: int, start: int, stop: int) -> None:
    """Fill entries [count+start, count+stop) of a region with its last entry (or a foreign key)."""
    base = region * a.cap
    lo, hi = base + count + start, base + count + stop
    if count:
        for col in a.columns():
            col[lo:hi] = col[base + count - 1]
    else:  # a key of the next shard's range can never be looked up in this one
        a.keys[lo:hi] = np.uint64(((s + 1) % SHARDS) << (64 - SHARD_BITS))
        a.units[lo:hi] = DEAD
        a.offsets[lo:hi] = 0
        a.lengths[lo:hi] = 0
