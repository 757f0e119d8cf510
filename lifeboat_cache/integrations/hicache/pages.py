"""Page views of SGLang host pools: how a host pool's pages become numpy buffers for the store.

A page is stored as exactly the bytes of SGLang's flat page (`get_data_page(idx, flat=True)`), so the
zero-copy (v1) and copying interfaces read each other's pages. Zero-copy pages are lists of 1-D views
of the pool's own buffer: one or two blocks for `page_first*`, 2*L (MHA) or L (MLA) blocks for
`layer_first`. A pool whose pages are not views of its own buffers goes through SGLang's copying
accessors (`get_data_page` / `set_from_flat_data_page`). Used by `sglang_backend` and `keys.py`
(`HostPool`, `as_numpy`, `page_tensors`, `flat_page_bytes`, `INT_OF_WIDTH` are their public API).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from ...records import DTYPE_ITEMSIZE, DTYPE_NAMES, dtype_code
from ...store import ChunkStore, PageBlocks

log = logging.getLogger(__name__)

INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy view (no copy) of a CPU tensor, as integers of the element's width.

    numpy has no bfloat16; the integer width keeps the codec's byte planes right (2-byte planes
    for bf16/fp16) and is the same for both interfaces, so both write identical records.
    """
    return t.view(INT_OF_WIDTH[t.element_size()]).numpy()


def _blocks(a: np.ndarray) -> list[np.ndarray]:
    """The C-contiguous blocks of a strided view, in flat (row-major) order, as views."""
    if a.flags.c_contiguous:
        return [a]
    if a.ndim <= 1:
        raise ValueError("a page view with a strided last axis cannot be split into blocks")
    return [b for sub in a for b in _blocks(sub)]


def page_tensors(pool: Any, start: int) -> list[torch.Tensor]:
    """The tensors making one page, in the order of SGLang's flat page."""
    if hasattr(pool, "_iter_page_tensors") and pool.layout in ("page_first", "page_first_direct"):
        return list(pool._iter_page_tensors(start))  # MambaPoolHost: its get_data_page concatenates
    return [pool.get_data_page(start, flat=False)]


def flat_page_bytes(pool: Any) -> int:
    page = pool.get_dummy_flat_data_page()
    return page.numel() * page.element_size()


def _pages_are_views(pool: Any) -> bool:
    """True when a page's tensors are views of the pool's own buffers (safe to decode into)."""
    try:
        owned = pool.get_hybrid_pool_buffer() if hasattr(pool, "get_hybrid_pool_buffer") else pool.kv_buffer
        owned = owned if isinstance(owned, (list, tuple)) else [owned]
        storages = {t.untyped_storage().data_ptr() for t in owned}
        tensors = page_tensors(pool, 0)
        blocks = [b for t in tensors for b in _blocks(as_numpy(t))]
        return (all(t.untyped_storage().data_ptr() in storages for t in tensors)
                and sum(b.nbytes for b in blocks) == flat_page_bytes(pool))
    except Exception as e:  # an unknown pool or layout: SGLang's copying accessors still work
        log.info("lifeboat: %s pages are not plain views (%s); using SGLang's page copies",
                 type(pool).__name__, e)
        return False


class _BlockPlan:
    """Where a page's blocks sit in the pool's one buffer, computed once per pool.

    In every SGLang layout a page's blocks move by the same stride per token slot (layer_first:
    one token row of each layer; page_first*: one slot of the page axis), so the page at slot s is
    `flat[off + s * per_slot : ... + length]` for the offsets of the page at slot 0. Slicing those
    costs ~0.2 us a block, where walking the strided tensor view costs ~1 us a block in Python:
    a layer_first page is 2 x layers blocks (48 for a 24-layer model), so this is most of the
    per-page overhead of that layout. The slices are of the buffer's bytes (uint8), handed to the
    store as a PageBlocks with the element type checked here once, so the store does not check and
    re-view each block of each page. The plan is checked against the generic walk on two pages;
    a pool it does not fit (several buffers, uneven strides) keeps the generic walk.
    """

    def __init__(self, flat: np.ndarray, offsets: np.ndarray, lengths: list[int], per_slot: int,
                 itemsize: int, dtype: int) -> None:
        self.flat, self.offsets, self.lengths, self.per_slot = flat, offsets, lengths, per_slot
        self.itemsize, self.dtype, self.writable = itemsize, dtype, bool(flat.flags.writeable)
        self.grid = self._grid()

    def _grid(self) -> Optional[np.ndarray]:
        """Blocks of one length at one stride (every MHA / MLA layout): the buffer as rows that start at
        each block of the page at slot 0 and run to the end of the buffer, so a page's blocks are one
        2-D slice whose rows numpy hands out (~7 us a 48-block page, against ~17 us slicing each)."""
        n, off = len(self.lengths), self.offsets
        if n < 2 or len(set(self.lengths)) != 1:
            return None
        stride = int(off[1] - off[0])
        if stride <= 0 or not np.array_equal(np.diff(off), np.full(n - 1, stride)):
            return None
        row = self.flat.size - int(off[-1])  # the last row ends at the buffer's end; every row fits
        if row < self.lengths[0]:
            return None
        return np.lib.stride_tricks.as_strided(self.flat[int(off[0]):], shape=(n, row), strides=(stride, 1),
                                               writeable=self.writable)

    @classmethod
    def of(cls, host: Any, page_size: int, generic: Callable[[int], list[np.ndarray]]) -> Optional["_BlockPlan"]:
        try:
            buf = host.kv_buffer
            if not isinstance(buf, torch.Tensor) or not buf.is_contiguous() or buf.device.type != "cpu":
                return None
            typed = as_numpy(buf).reshape(-1)
            flat, base = typed.view(np.uint8), typed.ctypes.data  # byte offsets from here on
            b0 = generic(0)
            if any(b.dtype != typed.dtype for b in b0):
                return None
            offsets = np.array([b.ctypes.data - base for b in b0], dtype=np.int64)
            lengths = [b.nbytes for b in b0]
            if int(getattr(host, "logical_page_size", None) or page_size) != int(host.page_size):
                return None  # DCP: slots are translated per rank; keep SGLang's own accessor
            pages = int(getattr(host, "page_num", 0) or 0)
            second = generic(page_size)
            per_slot = (second[0].ctypes.data - base - int(offsets[0])) // page_size
            code = dtype_code(typed)
            plan = cls(flat, offsets, lengths, per_slot, DTYPE_ITEMSIZE[DTYPE_NAMES[code]], code)
            for start in {page_size, max(0, (pages - 1) * page_size)}:
                want = generic(start)
                got = plan.blocks(start)
                if [(b.ctypes.data, b.nbytes) for b in got] != [(b.ctypes.data, b.nbytes) for b in want]:
                    return None
            return plan
        except Exception as e:  # an unknown pool: the generic walk still works
            log.debug("lifeboat: no block plan for %s: %s", type(host).__name__, e)
            return None

    def blocks(self, start: int) -> list[np.ndarray]:
        """The page's blocks as uint8 views of the pool's buffer."""
        if self.grid is not None:
            at = start * self.per_slot
            return list(self.grid[:, at: at + self.lengths[0]])
        flat = self.flat
        return [flat[o: o + n] for o, n in zip((self.offsets + start * self.per_slot).tolist(), self.lengths)]

    def page(self, start: int) -> PageBlocks:
        return PageBlocks(self.blocks(start), self.itemsize, self.dtype, self.writable)


class HostPool:
    """One registered host pool: its namespace and how its pages become buffers."""

    def __init__(self, name: str, host: Any, ns: bytes, replicated: bool, zero_copy: bool) -> None:
        self.name, self.host, self.ns, self.replicated = name, host, ns, replicated
        # slots per page in host_indices (SGLang's logical page; the physical one differs only under DCP)
        self.page_size = int(getattr(host, "logical_page_size", None) or getattr(host, "page_size", 1) or 1)
        self.page_bytes = flat_page_bytes(host)
        self.zero_copy = zero_copy and _pages_are_views(host)
        self._plan = _BlockPlan.of(host, self.page_size, self._walk) if self.zero_copy else None

    def starts(self, host_indices: Optional[torch.Tensor], n: int) -> Optional[list[int]]:
        """First host slot of each page (host_indices are token slots), or None on a mismatch."""
        if host_indices is None or host_indices.numel() != n * self.page_size:
            return None
        return host_indices[:: self.page_size].tolist()

    def _walk(self, start: int) -> list[np.ndarray]:
        return [b for t in page_tensors(self.host, start) for b in _blocks(as_numpy(t))]

    def views(self, start: int) -> list[np.ndarray]:
        """The page's blocks as 1-D views of the pool, in flat page order."""
        if self._plan is not None:
            return self._plan.blocks(start)
        return [b.reshape(-1) for b in self._walk(start)]

    def page(self, start: int) -> object:
        """The page as the store takes it: a PageBlocks by the plan, else its blocks (checked by the store)."""
        return self._plan.page(start) if self._plan is not None else self.views(start)

    def write(self, store: ChunkStore, keys: Sequence[str], starts: list[int],
              affinity: Optional[int]) -> list[bool]:
        if self.zero_copy:
            bufs: list[object] = [self.page(s) for s in starts]
        else:
            bufs = [as_numpy(self.host.get_data_page(s, flat=True)) for s in starts]
        return store.put(self.ns, keys, bufs, affinity=affinity)

    def read(self, store: ChunkStore, keys: Sequence[str], starts: list[int]) -> list[bool]:
        if self.zero_copy:
            return store.get_into(self.ns, keys, [self.page(s) for s in starts])
        flats = [self.host.get_dummy_flat_data_page() for _ in starts]
        ok = store.get_into(self.ns, keys, [as_numpy(f) for f in flats])
        for start, flat, good in zip(starts, flats, ok):
            if good:
                self.host.set_from_flat_data_page(start, flat)
        return ok
