"""Copying rows between SGLang's ``MlxAttentionKVPool`` and numpy (scheduler thread only).

The pool holds per layer an ``mx.array`` of shape ``(slots, n_kv_heads, head_dim)``, token-granular
(page size 1, slot 0 is padding). Gathers copy chunks out (and evaluate them, which needs the thread
that owns the MLX stream: ``There is no Stream(cpu, 0) in current thread`` otherwise); installs write
stored rows back. bf16 travels as its uint16 bit pattern (numpy has no bfloat16 buffer format).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from .fingerprint import mx_dtype_name
from .keys import CHUNK_TOKENS

if TYPE_CHECKING:  # imported lazily: the package must import without MLX
    import mlx.core as mx


def _contiguous(slots: np.ndarray) -> tuple[int, int] | None:
    """(start, stop) when the slots are one ascending run (the common case): slices beat gathers."""
    if len(slots) == 0:
        return None
    a = int(slots[0])
    if int(slots[-1]) - a + 1 != len(slots):
        return None
    return (a, a + len(slots)) if np.array_equal(slots, np.arange(a, a + len(slots))) else None


def settle_pool(pool: Any) -> None:
    """Evaluate the pool's pending lazy writes (SGLang's own deferred prefill/decode syncs)."""
    import mlx.core as mx

    mx.eval(*pool.all_buffers())


def gather_chunks(pool: Any, slot_ids: np.ndarray, chunk_tokens: int = CHUNK_TOKENS) -> "mx.array":
    """Copy whole chunks out of an ``MlxAttentionKVPool`` and evaluate them.

    ``slot_ids`` holds ``n * chunk_tokens`` pool slots in token order. Returns an evaluated, contiguous
    ``[n, layers, 2, chunk_tokens, heads, head_dim]`` array. Must run on the thread that owns the
    pool (SGLang's scheduler thread): it evaluates lazy pool writes.
    """
    import mlx.core as mx

    n = len(slot_ids) // chunk_tokens
    if n * chunk_tokens != len(slot_ids) or n == 0:
        raise ValueError(f"gather_chunks: {len(slot_ids)} slots is not a positive multiple of {chunk_tokens}")
    slot_ids = np.asarray(slot_ids)
    run = _contiguous(slot_ids)
    shape = (n, chunk_tokens, pool.n_kv_heads, pool.head_dim)
    if run is not None:
        a, b = run
        ks = [pool.k_buffer[layer][a:b].reshape(shape) for layer in range(pool.num_layers)]
        vs = [pool.v_buffer[layer][a:b].reshape(shape) for layer in range(pool.num_layers)]
    else:
        idx = mx.array(slot_ids.astype(np.int32))
        ks = [pool.k_buffer[layer][idx].reshape(shape) for layer in range(pool.num_layers)]
        vs = [pool.v_buffer[layer][idx].reshape(shape) for layer in range(pool.num_layers)]
    kv = mx.stack([x for pair in zip(ks, vs) for x in pair], axis=1).reshape(
        n, pool.num_layers, 2, chunk_tokens, pool.n_kv_heads, pool.head_dim)
    mx.eval(kv)
    return kv


def gather_request_chunks(layer_caches: Sequence[Any], chunk_ids: Sequence[int],
                          chunk_tokens: int = CHUNK_TOKENS) -> "mx.array":
    """Copy whole chunks out of one request's own per-layer KV caches and evaluate them.

    ``layer_caches`` are the request's full-attention caches in pool-layer order (SGLang's
    ``ContiguousAttentionKVCache``: ``keys``/``values`` of shape ``(1, heads, max_len, head_dim)``,
    evaluated after every forward). These hold exactly the bytes SGLang copies into the pool rows, but
    reading them does not force the pool's lazy writes (work SGLang defers to the next prefix hit).
    Returns ``[n, layers, 2, chunk_tokens, heads, head_dim]`` like :func:`gather_chunks`.
    """
    import mlx.core as mx

    chunk_ids = list(chunk_ids)
    if not chunk_ids:
        raise ValueError("gather_request_chunks: no chunks")
    runs: list[tuple[int, int]] = []
    for i in chunk_ids:  # consecutive chunk ids become one slice
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))

    def rows(buf: "mx.array") -> "mx.array":
        parts = [buf[0, :, a * chunk_tokens:b * chunk_tokens, :] for a, b in runs]
        x = parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=1)
        heads, _, dim = x.shape
        return x.transpose(1, 0, 2).reshape(len(chunk_ids), chunk_tokens, heads, dim)

    # one stack of [k0, v0, k1, v1, ...] along axis 1 is already the record layout (one copy, not two)
    per_layer = [x for c in layer_caches for x in (rows(c.keys), rows(c.values))]
    n, _, heads, dim = per_layer[0].shape
    kv = mx.stack(per_layer, axis=1).reshape(n, len(layer_caches), 2, chunk_tokens, heads, dim)
    mx.eval(kv)
    return kv


def gather_request_rows(layer_caches: Sequence[Any], start: int, stop: int) -> "mx.array":
    """Rows ``start..stop-1`` of a request's own per-layer caches as ``[layers, 2, r, heads, head_dim]``
    (a prompt tail record), evaluated; see :func:`gather_request_chunks`."""
    import mlx.core as mx

    per_layer = [x[0, :, start:stop, :].transpose(1, 0, 2) for c in layer_caches for x in (c.keys, c.values)]
    r, heads, dim = per_layer[0].shape
    kv = mx.stack(per_layer, axis=0).reshape(len(layer_caches), 2, r, heads, dim)
    mx.eval(kv)
    return kv


def numpy_view(arr: "mx.array") -> np.ndarray:
    """Read-only zero-copy numpy view of an *evaluated* MLX array (bf16 as uint16 bits)."""
    import mlx.core as mx

    if arr.dtype == mx.bfloat16:
        arr = arr.view(mx.uint16)
    view = np.asarray(arr)
    view.flags.writeable = False  # writes through a view would reach the MLX buffer
    return view


def install_chunks(pool: Any, slots: np.ndarray, chunks: np.ndarray, skip: int = 0) -> None:
    """Scatter stored chunks into pool slots (scheduler thread).

    ``chunks`` is ``[n, layers, 2, C, heads, head_dim]`` as read from the store; the first ``skip``
    token rows are already in the tree and are not installed. ``slots`` has ``n*C - skip`` entries.
    One ascending run of slots (what a fresh allocation usually gives) is written with slice updates;
    anything else goes through the pool's own ``set_kv_all_layers``.
    """
    import mlx.core as mx

    n, layers, _, c, heads, dim = chunks.shape
    rows = n * c - skip
    slots = np.asarray(slots)
    if len(slots) != rows or rows <= 0:
        raise ValueError(f"install_chunks: {len(slots)} slots for {rows} rows")
    # [n, L, 2, C, H, D] -> [L, 2, n*C, H, D] in numpy (one pass), then a single copy into MLX
    host = np.ascontiguousarray(chunks.transpose(1, 2, 0, 3, 4, 5)).reshape(layers, 2, n * c, heads, dim)
    arr = mx.array(host[:, :, skip:] if skip else host)
    if pool.dtype == mx.bfloat16:
        arr = arr.view(mx.bfloat16)
    elif arr.dtype != pool.dtype:
        raise ValueError(f"install_chunks: chunk dtype {arr.dtype} does not match the pool's {pool.dtype}")
    run = _contiguous(slots)
    if run is not None:
        a, b = run
        for layer in range(pool.num_layers):
            pool.k_buffer[layer][a:b] = arr[layer, 0]
            pool.v_buffer[layer][a:b] = arr[layer, 1]
    else:
        pool.set_kv_all_layers(mx.array(slots.astype(np.int32)), arr[:, 0], arr[:, 1])
    mx.eval(*pool.all_buffers())


@dataclass(frozen=True)
class PoolLayout:
    """What :func:`prepare_pool` learned once about a pool, so each install skips the questions.

    ``numpy_writes``: a numpy view of an evaluated buffer of this dtype is writable and aliases the
    MLX buffer (checked by writing through one into a scratch array, never into the pool). Then an
    install is one memcpy per layer and K/V straight into the pool's memory; otherwise it goes
    through MLX slice updates.
    """

    num_layers: int
    n_kv_heads: int
    head_dim: int
    dtype: Any            # the pool's mx.Dtype
    bf16: bool
    numpy_writes: bool

    def fits(self, pool: Any) -> bool:
        return (pool.num_layers, pool.n_kv_heads, pool.head_dim, pool.dtype) == (
            self.num_layers, self.n_kv_heads, self.head_dim, self.dtype)


def _bits_view(arr: "mx.array", bf16: bool) -> np.ndarray:
    """Writable zero-copy numpy view of an evaluated MLX array (bf16 as its uint16 bits)."""
    import mlx.core as mx

    return np.asarray(arr.view(mx.uint16) if bf16 else arr)


def prepare_pool(pool: Any) -> PoolLayout:
    """Learn once per pool how rows can be installed into it (scheduler thread; touches no pool row)."""
    import mlx.core as mx

    bf16 = pool.dtype == mx.bfloat16
    ok = False
    try:
        # a scratch array built like the pool's buffers: zeros, then a scatter, evaluated
        shape = (4, pool.n_kv_heads, pool.head_dim)
        scratch = mx.zeros(shape, dtype=pool.dtype)
        scratch[1:2] = mx.ones((1, pool.n_kv_heads, pool.head_dim), dtype=pool.dtype)
        mx.eval(scratch)
        view = _bits_view(scratch, bf16)
        if view.flags.writeable and view.flags.c_contiguous and view.shape == shape:
            view[2] = view[1]  # the bit pattern of 1.0, written behind MLX's back
            del view
            ok = bool(mx.array_equal(scratch[2], scratch[1]).item())  # MLX reads it back
    except Exception:  # any surprise: the MLX path, which is always right
        ok = False
    return PoolLayout(pool.num_layers, pool.n_kv_heads, pool.head_dim, pool.dtype, bf16, ok)


def _pool_views(pool: Any, layout: PoolLayout) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
    """Numpy views of every K and V buffer of an evaluated pool, or None where one is not a plain
    writable C-contiguous buffer of the pool's shape (then the MLX path is taken)."""
    shape = (pool.k_buffer[0].shape[0], layout.n_kv_heads, layout.head_dim)
    ks = [_bits_view(b, layout.bf16) for b in pool.k_buffer]
    vs = [_bits_view(b, layout.bf16) for b in pool.v_buffer]
    for v in (*ks, *vs):
        if not (v.flags.writeable and v.flags.c_contiguous and v.shape == shape):
            return None
    return ks, vs


def install_rows(pool: Any, slots: np.ndarray, rows: np.ndarray, skip: int = 0,
                 layout: PoolLayout | None = None) -> None:
    """Scatter stored rows in pool layout into pool slots (scheduler thread); the fast restore path.

    ``rows`` is ``[layers, 2, R, heads, head_dim]`` (what :class:`ChunkReader` reads records into:
    each layer's K or V rows already contiguous, token-major like the pool). Rows ``skip..R-1`` go
    to ``slots``. The pool's pending writes are evaluated first (left lazy inside SGLang's prefill
    graph, the prefill's own rows came out different in the last float bits: tests/integration/
    test_mlx_radix_cache.py::test_short_in_memory_match_is_extended_mid_chunk). Then, when the
    ``layout`` (:func:`prepare_pool`) allows it, each layer's K and V rows are copied straight into
    the pool's memory through numpy views (one memcpy each, no MLX op; the views are dropped before
    returning, so MLX can still update the buffers in place). Otherwise: one copy into MLX and one
    slice update per layer and K/V (or the pool's own ``set_kv_all_layers`` for scattered slots).
    """
    import mlx.core as mx

    layers, _, r, heads, dim = rows.shape
    slots = np.asarray(slots)
    n = r - skip
    if len(slots) != n or n <= 0:
        raise ValueError(f"install_rows: {len(slots)} slots for {n} rows")
    if layers != pool.num_layers or (heads, dim) != (pool.n_kv_heads, pool.head_dim):
        raise ValueError(f"install_rows: rows {rows.shape} do not fit the pool ({pool.num_layers} layers x "
                         f"{pool.n_kv_heads} heads x {pool.head_dim})")
    bf16 = pool.dtype == mx.bfloat16
    want = np.dtype(np.uint16) if bf16 else np.dtype(mx_dtype_name(pool.dtype))
    if rows.dtype != want:
        raise ValueError(f"install_rows: row dtype {rows.dtype} does not match the pool's {pool.dtype} "
                         f"(rows must be {want})")
    run = _contiguous(slots)
    mx.eval(*pool.all_buffers())  # the pool's pending writes, before its memory is written
    views = _pool_views(pool, layout) if layout is not None and layout.numpy_writes and layout.fits(pool) else None
    if views is not None:
        ks, vs = views
        if run is not None:
            a, b = run
            for layer in range(layers):
                ks[layer][a:b] = rows[layer, 0, skip:]
                vs[layer][a:b] = rows[layer, 1, skip:]
        else:
            for layer in range(layers):
                ks[layer][slots] = rows[layer, 0, skip:]
                vs[layer][slots] = rows[layer, 1, skip:]
        del ks, vs, views
        return

    def to_mx(x: np.ndarray) -> "mx.array":
        a = mx.array(x)
        return a.view(mx.bfloat16) if bf16 else a

    if run is not None:
        a, b = run
        for layer in range(layers):
            pool.k_buffer[layer][a:b] = to_mx(rows[layer, 0, skip:])
            pool.v_buffer[layer][a:b] = to_mx(rows[layer, 1, skip:])
    else:
        idx = mx.array(slots.astype(np.int32))
        pool.set_kv_all_layers(idx, to_mx(rows[:, 0, skip:]), to_mx(rows[:, 1, skip:]))
    mx.eval(*pool.all_buffers())
