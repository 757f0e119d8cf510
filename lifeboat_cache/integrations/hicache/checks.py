"""Argument checks for the SGLang HiCache backend: a call either names whole pages or does nothing.

SGLang's threads call the backend with keys, host slots and page copies. Anything that would make the
store take less than a whole page (slots past the end of the host pool, negative, unaligned or not
consecutive, a page copy of the wrong size) would store a short or foreign page under a real key, and
from then on that key never reads. So each method checks its arguments here before any store call;
a failed check raises `BadCall`, which the backend's guard turns into "nothing done" (counted, logged
with a cooldown). Only plain lists and tuples count as lists: SGLang passes nothing else, and an
iterator's length is unknowable without consuming it.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

import torch

MAX_CALL_PAGES = 1 << 20  # a "list of keys" longer than this is not a call from SGLang


class BadCall(ValueError):
    """A call's arguments break the HiCacheStorage contract: the call does nothing."""


def count(seq: Any) -> int:
    """len(seq) for a list or tuple, else 0 (the length is unknowable): sizes a "nothing done" answer."""
    return len(seq) if isinstance(seq, (list, tuple)) and len(seq) <= MAX_CALL_PAGES else 0


def check_keys(keys: Any, what: str = "keys") -> Sequence[str]:
    """A list (or tuple) of page keys, each a str (bytes are accepted, as by the store)."""
    if not isinstance(keys, (list, tuple)) or len(keys) > MAX_CALL_PAGES:
        raise BadCall(f"{what}: expected a list of page keys (str), got {type(keys).__name__}")
    if not all(isinstance(k, (str, bytes)) for k in keys):
        raise BadCall(f"{what}: every page key must be a str")
    return keys


def check_extra_info(extra_info: Any) -> None:
    """`prefix_keys`, when given, must be keys too (they choose the dialog's drive)."""
    prefix = getattr(extra_info, "prefix_keys", None) if extra_info is not None else None
    if prefix is not None:
        check_keys(prefix, "extra_info.prefix_keys")


def check_indices(host_indices: Any, n: int, page_size: int, capacity: Optional[int], page_bytes: int,
                  page_nbytes: Callable[[int], int]) -> None:
    """`host_indices` must name n whole pages: `page_size` consecutive slots from a multiple of
    `page_size`, inside the host pool's `capacity` slots. For a pool that does not say its capacity,
    each page's bytes (`page_nbytes(start)`) are checked against `page_bytes` instead."""
    if n == 0:
        return  # nothing to transfer, whatever the slots
    if not isinstance(host_indices, torch.Tensor) or host_indices.dim() != 1:
        raise BadCall(f"host_indices: expected a 1-D tensor of slots, got {type(host_indices).__name__}")
    dt = host_indices.dtype
    if dt.is_floating_point or dt.is_complex or dt == torch.bool:
        raise BadCall(f"host_indices: expected integer slots, got {dt}")
    if host_indices.numel() != n * page_size:
        raise BadCall(f"host_indices: {n} keys need {n * page_size} slots ({page_size} per page), "
                      f"got {host_indices.numel()}")
    pages = host_indices.to(device="cpu", dtype=torch.int64).reshape(n, page_size)
    starts = pages[:, 0]
    if (starts % page_size != 0).any() or not torch.equal(pages, starts[:, None] + torch.arange(page_size)):
        raise BadCall(f"host_indices: each page must be {page_size} consecutive slots starting at a multiple "
                      f"of {page_size}")
    lo, hi = int(starts.min()), int(starts.max())
    known = isinstance(capacity, int) and not isinstance(capacity, bool)
    if lo < 0 or (known and hi + page_size > capacity):  # type: ignore[operator]
        raise BadCall(f"host_indices: slots {lo}..{hi + page_size - 1} are outside the host pool "
                      f"(0..{capacity})")
    if not known:
        for s in starts.tolist():
            if page_nbytes(s) != page_bytes:
                raise BadCall(f"host_indices: the page at slot {s} is not a whole page")


def check_pages(tensors: Any, n: int, page_bytes: int, what: str, writable: bool,
                widths: Mapping[int, Any]) -> None:
    """Copying interface: n CPU tensors of exactly one flat page's bytes each (element widths in
    `widths`); `writable` destinations must also be contiguous (they are decoded into in place)."""
    if not isinstance(tensors, (list, tuple)) or len(tensors) != n:
        raise BadCall(f"{what}: expected a list of {n} page tensors, got {type(tensors).__name__}")
    for t in tensors:
        if (not isinstance(t, torch.Tensor) or t.device.type != "cpu" or t.element_size() not in widths
                or t.numel() * t.element_size() != page_bytes or (writable and not t.is_contiguous())):
            raise BadCall(f"{what}: every page must be a CPU tensor of {page_bytes} bytes")
