"""Hybrid models on MLX: saving and restoring the recurrent (auxiliary) state next to the KV chunks.

A linear-attention / mamba layer's state cannot be rebuilt from attention KV, so a restored prefix
needs the state at its end. SGLang 0.5.23's MLX runner snapshots it during prefill; this module
observes that snapshot, turns it into one flat byte vector for the store, and writes a stored one
back into an auxiliary pool slot. All MLX work here runs on the scheduler thread. Private SGLang
names used (pin ``sglang==0.5.23``): ``_new_native_cache``, ``_new_cache_skeleton``,
``_cache_layout``, ``_store_tracked_auxiliary_state``, ``MlxAuxiliaryStatePool._snapshots``.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence

import numpy as np

from .fingerprint import mx_dtype_name

if TYPE_CHECKING:
    import mlx.core as mx

log = logging.getLogger(__name__)


def state_to_numpy(arrays: Sequence["mx.array"]) -> np.ndarray:
    """Pack evaluated recurrent-state arrays into one flat byte vector (scheduler thread).

    Layout: each array's raw bytes, in order; shapes and dtypes are fixed by the model and recorded
    in the fingerprint's ``state_layout``, so a record only returns to a model with the same layout.
    """
    import mlx.core as mx

    parts = []
    for a in arrays:
        if a.dtype == mx.bfloat16:
            a = a.view(mx.uint16)
        parts.append(np.asarray(a).reshape(-1).view(np.uint8))
    return np.concatenate(parts) if parts else np.zeros(0, np.uint8)


def numpy_to_state(buf: np.ndarray, specs: Sequence[tuple[tuple[int, ...], str]]) -> list["mx.array"]:
    """Inverse of :func:`state_to_numpy` for the given (shape, dtype-name) specs (scheduler thread)."""
    import mlx.core as mx

    out = []
    off = 0
    for shape, dname in specs:
        np_dt = np.dtype(np.uint16) if dname == "bfloat16" else np.dtype(dname)
        n = int(np.prod(shape)) * np_dt.itemsize
        a = mx.array(buf[off:off + n].view(np_dt).reshape(shape))
        if dname == "bfloat16":
            a = a.view(mx.bfloat16)
        out.append(a)
        off += n
    if off != buf.nbytes:
        raise ValueError(f"state record is {buf.nbytes} bytes, layout wants {off}")
    return out


def state_specs_bytes(specs: Iterable[tuple[tuple[int, ...], str]]) -> int:
    total = 0
    for shape, dname in specs:
        total += int(np.prod(shape)) * (2 if dname == "bfloat16" else np.dtype(dname).itemsize)
    return total


class HybridState:
    """How a hybrid model's recurrent (auxiliary) state is saved and restored around the radix tree.

    SGLang's MLX runner snapshots the auxiliary layers' native mlx-lm caches into
    ``MlxAuxiliaryStatePool`` slots; during prefill it takes one snapshot at the last boundary that is
    a multiple of ``mamba_cache_chunk_size`` (64 for GatedDeltaNet models) via
    ``_store_tracked_auxiliary_state``. We observe that call (per request), and when the request
    finishes, store that snapshot as a state record keyed by the chain key of the chunk ending at
    that boundary.
    """

    def __init__(self, runner: Any, specs: list[tuple[int, list[tuple[tuple[int, ...], str]]]],
                 templates: dict[int, Any]) -> None:
        self.runner = runner
        self.layer_specs = specs  # [(layer_idx, [(shape, dtype), ...]), ...]
        self.templates = templates  # layer_idx -> the native cache's ``state`` structure (arrays as slots)
        self.flat_specs = [s for _, layer in specs for s in layer]
        self.nbytes = state_specs_bytes(self.flat_specs)
        self.tracked: dict[str, tuple[int, int]] = {}  # rid -> (boundary, aux pool slot)
        self._lock = threading.Lock()

    @classmethod
    def probe(cls, runner: Any) -> "HybridState":
        """Learn the state layout by one 1-token forward on a fresh cache (shapes do not depend on length)."""
        import mlx.core as mx

        cache = runner._new_native_cache()
        out = runner.model(mx.array([[0]], dtype=mx.int32), cache=cache)
        mx.eval(out)
        specs = []
        templates = {}
        for li in runner._cache_layout.auxiliary_layer_indices:
            templates[li] = cache[li].state
            arrays = _state_arrays(cache[li])
            mx.eval(*arrays)
            specs.append((li, [(tuple(a.shape), mx_dtype_name(a.dtype) if a.dtype in (
                mx.float32, mx.float16, mx.bfloat16) else str(a.dtype).rsplit(".", 1)[-1]) for a in arrays]))
        return cls(runner, specs, templates)

    def layout(self) -> str:
        return ";".join(f"{li}:" + ",".join(f"{'x'.join(map(str, s))}/{d}" for s, d in layer)
                        for li, layer in self.layer_specs)

    def watch_runner(self) -> None:
        """Wrap the runner instance's tracked-state store to learn each request's snapshot boundary."""
        runner = self.runner
        original = runner._store_tracked_auxiliary_state
        if getattr(original, "_lifeboat_wrapped", False):
            return

        @functools.wraps(original)
        def tracked(req: Any, cache: Any, track_len: Optional[int]) -> None:
            original(req, cache, track_len)
            try:
                buf = getattr(req.kv, "mamba_ping_pong_track_buffer", None) if req is not None else None
                if (req is not None and track_len is not None and buf is not None
                        and req.kv.mamba_last_track_seqlen == track_len):
                    with self._lock:
                        self.tracked[req.rid] = (int(track_len), int(buf[0]))
            except Exception:  # observing must never break the forward
                log.debug("lifeboat: cannot observe the tracked state", exc_info=True)

        tracked._lifeboat_wrapped = True  # type: ignore[attr-defined]
        runner._store_tracked_auxiliary_state = tracked

    def take_tracked(self, rid: str) -> tuple[int, int] | None:
        with self._lock:
            return self.tracked.pop(rid, None)

    def snapshot_bytes(self, aux_pool: Any, slot: int) -> np.ndarray | None:
        """The pool slot's snapshot as one flat byte vector, or None if it holds none."""
        snap = aux_pool._snapshots.get(int(slot))
        if snap is None:
            return None
        arrays = []
        for li, layer in self.layer_specs:
            cs = snap.get(li)
            if cs is None:
                return None
            got = _tree_arrays(cs.state)
            if [tuple(a.shape) for a in got] != [s for s, _ in layer]:
                return None
            arrays.extend(got)
        return state_to_numpy(arrays)

    def restore_into_slot(self, aux_pool: Any, slot: int, buf: np.ndarray) -> None:
        """Write a stored state into an auxiliary pool slot through the pool's own ``store_cache``."""
        arrays = numpy_to_state(buf, self.flat_specs)
        cache = self.runner._new_cache_skeleton()
        it = iter(arrays)
        for li, _ in self.layer_specs:
            # the native cache's own state setter, fed the structure its getter produced (mlx-lm
            # changes that structure between versions; we never assume it)
            cache[li].state = _refill(self.templates[li], it)
        aux_pool.store_cache(slot, cache, [li for li, _ in self.layer_specs])


def _refill(structure: Any, arrays: Any) -> Any:
    """``structure`` with each MLX array replaced by the next one from ``arrays``."""
    import mlx.core as mx

    if isinstance(structure, mx.array):
        return next(arrays)
    if isinstance(structure, list):
        return [_refill(x, arrays) for x in structure]
    if isinstance(structure, tuple):
        return tuple(_refill(x, arrays) for x in structure)
    return structure


def _state_arrays(cache: Any) -> list[Any]:
    return _tree_arrays(getattr(cache, "state", ()))


def _tree_arrays(value: Any) -> list[Any]:
    import mlx.core as mx

    out: list[Any] = []

    def walk(v: Any) -> None:
        if isinstance(v, mx.array):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)

    walk(value)
    return out
