"""The MLX writer's queue bound: one full-context request's KV, unless lifeboat.yaml sets it.

Why: at checkpoint a finished request's whole KV is offered to the writer at once, and the queue keeps
only the leading chunks that fit. With a fixed 256 MiB bound a long request of a KV-heavy model kept
only its first chunks (SmolLM2-135M fp32, ~46 KB of KV per token: 5,824 of 8,021 tokens) and the rest
was recomputed on every return. Sized from the model, the queue holds one whole context.

The bound is a bound, not an allocation: the writer's queue holds only the chunks offered to it, until
they are written (``background.BoundedWriter`` keeps a deque and a byte count, nothing preallocated).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ...config import DEFAULT_COPY_QUEUE_BYTES, format_size
from .keys import CHUNK_TOKENS

#: The auto bound is never below this (today's fixed default): many short requests finishing
#: together still fit, as before.
QUEUE_FLOOR_BYTES = DEFAULT_COPY_QUEUE_BYTES

#: The auto bound is never above ``min(QUEUE_CAP_BYTES, physical memory / QUEUE_CAP_MEMORY_SHARE)``.
#: Queued chunks are evaluated copies held in (unified) memory until written, on top of the model and
#: the KV pool, which SGLang sized at launch to ``mem_fraction_static`` (0.8) of what was free: 1/8 of
#: physical memory keeps a full queue inside the headroom that leaves. 4 GiB because a larger queue
#: drains for seconds (local NVMe writes at ~2 GB/s) and its copy runs on the scheduler thread, once
#: per finished request, at a cost linear in bytes (0.45 ms per MB measured on a 2-vCPU Linux VM's
#: mlx[cpu], ~1.9 s for 4 GiB there; Apple silicon's memory is several times faster, not measured
#: here). Contexts longer than that are stored up to the cap; ``engine.copy_queue_size`` raises it.
QUEUE_CAP_BYTES = 4 << 30
QUEUE_CAP_MEMORY_SHARE = 8


def physical_memory_bytes() -> int | None:
    """This machine's physical memory (None where the OS does not say)."""
    try:
        n = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
    return n if n > 0 else None


def queue_cap_bytes(physical_bytes: int | None) -> int:
    """``min(QUEUE_CAP_BYTES, physical_bytes / QUEUE_CAP_MEMORY_SHARE)`` (``QUEUE_CAP_BYTES`` if unknown)."""
    if not physical_bytes:
        return QUEUE_CAP_BYTES
    return min(QUEUE_CAP_BYTES, physical_bytes // QUEUE_CAP_MEMORY_SHARE)


@dataclass(frozen=True)
class QueueSize:
    """The writer queue's bound and why (``message``, logged once at start; ``warning`` when a
    user-set bound cannot hold one context). ``idle_read_bytes`` bounds the restore staging buffers
    kept for reuse: the user's bound when set (as before), else at most the floor, so an auto bound
    that grows with the context never keeps more memory idle than the old default."""

    bytes: int
    explicit: bool
    context_bytes: int | None
    idle_read_bytes: int
    message: str
    warning: str | None = None


def writer_queue_size(kv_bytes_per_token: int, context_tokens: int | None, *, configured: int | None,
                      extra_bytes: int = 0, context_note: str = "", chunk_tokens: int = CHUNK_TOKENS,
                      floor: int | None = None, cap: int | None = None) -> QueueSize:
    """The writer's queue bound for a model with ``kv_bytes_per_token`` whose longest request is
    ``context_tokens`` (None: unknown).

    ``configured`` is ``engine.copy_queue_size`` when the user set it (it always wins), else None: then
    the bound is one context's KV plus ``extra_bytes`` (a hybrid model's state record), never below
    ``floor`` (default ``QUEUE_FLOOR_BYTES``) and otherwise at most ``cap`` (default
    :func:`queue_cap_bytes` of this machine). ``context_note`` says where the context length came from.
    """
    floor = QUEUE_FLOOR_BYTES if floor is None else floor
    cap = queue_cap_bytes(physical_memory_bytes()) if cap is None else cap
    if kv_bytes_per_token <= 0:
        raise ValueError(f"writer_queue_size: kv_bytes_per_token={kv_bytes_per_token}; it must be > 0")
    per_token = f"{format_size(kv_bytes_per_token)}/token"
    need = context_tokens * kv_bytes_per_token + extra_bytes if context_tokens else None
    ctx = (f"one {context_tokens:,}-token context of KV at {per_token}"
           f"{f' ({context_note})' if context_note else ''}") if context_tokens else ""

    if configured is not None:
        msg = f"lifeboat: MLX writer queue {format_size(configured)}, set by engine.copy_queue_size"
        warning = None
        if need is not None and configured < need:
            kept = configured // (kv_bytes_per_token * chunk_tokens) * chunk_tokens
            warning = (f"lifeboat: engine.copy_queue_size ({format_size(configured)}) is less than {ctx}, "
                       f"which is {format_size(need)}: requests longer than {kept:,} tokens keep only their leading "
                       f"chunks and the rest is recomputed on return; set copy_queue_size: "
                       f"{math.ceil(need / (1 << 20))}MiB, or auto (one context, at most {format_size(cap)} "
                       f"on this machine)")
        return QueueSize(configured, True, need, configured, msg, warning)

    if need is None:
        msg = (f"lifeboat: MLX writer queue {format_size(floor)}, the floor: the model's context length is "
               f"unknown (KV at {per_token}); set engine.copy_queue_size for long requests")
        return QueueSize(floor, False, None, floor, msg)
    if need <= floor:
        size = floor
        msg = f"lifeboat: MLX writer queue {format_size(size)}, the floor: {ctx} is {format_size(need)}"
    elif need <= cap:
        size = need
        msg = f"lifeboat: MLX writer queue {format_size(size)} = {ctx}"
    else:
        size = max(cap, floor)
        kept = size // (kv_bytes_per_token * chunk_tokens) * chunk_tokens
        msg = (f"lifeboat: MLX writer queue {format_size(size)}, capped (at most {format_size(QUEUE_CAP_BYTES)} "
               f"and 1/{QUEUE_CAP_MEMORY_SHARE} of physical memory): {ctx} is {format_size(need)}; requests longer than "
               f"{kept:,} tokens keep only their leading chunks (engine.copy_queue_size raises it)")
    return QueueSize(size, False, need, min(size, floor), msg)
