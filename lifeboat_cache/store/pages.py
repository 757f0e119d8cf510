"""A page as the store takes it: flat uint8 views of the caller's buffers, no copy.

`put` and `get_into` take a page as one C-contiguous buffer, a list/tuple of them that make the page
in order (scatter-gather), or a `PageBlocks` an integration built (and checked) once.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..records import DTYPE_CODES, DTYPE_ITEMSIZE, DTYPE_NAMES, as_bytes_view, dtype_code


class PageBlocks(NamedTuple):
    """A page as flat uint8 blocks in page order, already checked by its maker (an integration that
    checked its pool's layout once): `put` / `get_into` take it as is. A plain list of arrays is
    checked and viewed as bytes block by block (~2 us a block in Python: a small model's
    layer_first page is 48 blocks, and that was a third of the store's Python time per page).

    pieces: 1-D C-contiguous uint8 arrays (views of the caller's memory); itemsize / dtype: the
    element width and codec dtype code of the page (codec.dtype_code). `writable`: whether the
    blocks may be read into (get_into refuses a page that is not)."""
    pieces: list[np.ndarray]
    itemsize: int
    dtype: int
    writable: bool = True


def page_view(buf: object) -> tuple[list[np.ndarray], int, int]:
    """(flat uint8 pieces, itemsize, dtype code) of a page, no copy.

    A page is one C-contiguous buffer, or a list/tuple of them that make the page in order
    (scatter-gather: an SGLang layer_first KV page is 2*L separate blocks of the host pool), or a
    PageBlocks (checked by its maker). Raises ValueError for an empty list or a non-contiguous buffer.
    """
    if type(buf) is PageBlocks:
        return buf.pieces, buf.itemsize, buf.dtype
    bufs = list(buf) if isinstance(buf, (list, tuple)) else [buf]
    if not bufs:
        raise ValueError("a page needs at least one buffer")
    first = bufs[0]
    if len(bufs) > 1 and isinstance(first, np.ndarray) and first.ndim == 1:
        # fast path for many blocks (a layer_first page is 2 x layers of them): one dtype, 1-D, contiguous
        dt = first.dtype
        if all(type(b) is np.ndarray and b.dtype == dt and b.ndim == 1 and b.flags.c_contiguous for b in bufs):
            code = dtype_code(first)
            return [b.view(np.uint8) for b in bufs], DTYPE_ITEMSIZE[DTYPE_NAMES[code]], code
    codes = {dtype_code(b) if isinstance(b, np.ndarray) else DTYPE_CODES["u1"] for b in bufs}
    code = codes.pop() if len(codes) == 1 else DTYPE_CODES["u1"]
    return [as_bytes_view(b) for b in bufs], DTYPE_ITEMSIZE[DTYPE_NAMES[code]], code


def writable(buf: object, view: tuple[list[np.ndarray], int, int]) -> bool:
    """Whether a page (and its view) may be read into."""
    return buf.writable if type(buf) is PageBlocks else all(p.flags.writeable for p in view[0])
