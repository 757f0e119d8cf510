"""The write path of the MLX radix cache ``lifeboat`` (``cache.py``): a finished request's chunks.

``ChunkCapture.capture`` hands the request's full 64-token chunks that the store does not hold yet to
the engine's background writer (from the request's own caches when they hold the bytes, else gathered
out of ``MlxAttentionKVPool``), then the prompt's partial last chunk (its *tail*) and, for a hybrid
model, the recurrent state at the chunk boundary SGLang's runner tracked. It runs on the scheduler
thread that owns the MLX pool; the caller counts and logs what it raises. Private SGLang names used
(pin ``sglang==0.5.23``): ``MlxModelRunner._req_caches``, ``_first_attention_cache``, ``_cache_layout``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

import torch

from ...runtimes.mlx import HybridState, MlxChunkEngine, gather_chunks, gather_request_rows, settle_pool

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req


class ChunkCapture:
    """Copies finished requests' chunks, tails and states to the engine (see the module docstring).

    `runner`: the worker's MlxModelRunner; `req_to_token_pool`: the cache's request-to-slot table;
    `pool`: returns the MLX KV pool (creating it if needed) or None.
    """

    def __init__(self, engine: MlxChunkEngine, runner: Any, req_to_token_pool: Any,
                 hybrid: HybridState | None, pool: Callable[[], Any | None]) -> None:
        self.engine, self.runner, self.req_to_token_pool = engine, runner, req_to_token_pool
        self.hybrid, self.pool = hybrid, pool

    def computed_len(self, req: "Req") -> int:
        """Tokens whose KV the runner actually computed for this request (0 if it never ran)."""
        cache = self.runner._req_caches.get(req.rid)
        if cache is None:
            return 0
        return int(self.runner._first_attention_cache(cache).offset)

    def capture(self, req: "Req", up_to: int) -> None:
        """Store a finished request's full chunks the store lacks, its prompt tail (non-hybrid models) and,
        for a hybrid model, the recurrent state at its tracked chunk boundary."""
        from sglang.srt.managers.schedule_batch import FINISH_ABORT

        eng = self.engine
        tracked = self.hybrid.take_tracked(req.rid) if self.hybrid is not None else None
        if isinstance(req.finished_reason, FINISH_ABORT) or req.kv.req_pool_idx is None:
            return
        n = min(up_to, self.computed_len(req))
        n_full = n // eng.chunk
        if n_full <= 0:
            return
        tokens = req.full_untruncated_fill_ids
        keys = eng.keys(eng.seed(req.extra_key, req.cache_salt), tokens, n_full)
        affinity = eng.affinity(keys)
        todo = eng.missing(keys)
        if todo:
            req_cache = self.runner._req_caches.get(req.rid)
            layers = self.runner._cache_layout.full_attention_layer_indices
            if req_cache is not None and all(req_cache[li].keys is not None for li in layers):
                # the request's own caches hold the bytes SGLang copies into the pool rows; reading
                # them leaves the pool's deferred writes deferred
                eng.capture_from_request([req_cache[li] for li in layers], todo, [keys[i] for i in todo],
                                         affinity)
            else:
                pool = self.pool()
                if pool is None:
                    return
                row = self.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
                slots = [row[i * eng.chunk:(i + 1) * eng.chunk].to(torch.int64).numpy() for i in todo]
                eng.capture(pool, slots, [keys[i] for i in todo], affinity)
        if self.hybrid is None:
            self._capture_tail(req, keys, tokens, n, affinity)
        if tracked is not None:
            self._capture_state(req, tracked, keys, affinity)

    def _capture_tail(self, req: "Req", keys: list[bytes], tokens: Any, n: int, affinity: int | None) -> None:
        """Store the prompt's partial last chunk (what SGLang matches of the prompt past its full
        chunks), so the same prompt restores as far as an in-memory hit would."""
        eng = self.engine
        stop = len(req.origin_input_ids) - 1  # SGLang matches all but the last prompt token
        if stop > n:
            return
        tail = eng.tail_of(keys, tokens, stop)
        if tail is None or eng.writer.is_pending(tail[0]) or eng.has_tail(tail[0]):
            return
        t0 = time.perf_counter()
        start = stop - tail[1]
        req_cache = self.runner._req_caches.get(req.rid)
        layers = self.runner._cache_layout.full_attention_layer_indices
        if req_cache is not None and all(req_cache[li].keys is not None for li in layers):
            kv = gather_request_rows([req_cache[li] for li in layers], start, stop)
        else:
            pool = self.pool()
            if pool is None:
                return
            settle_pool(pool)
            row = self.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
            kv = gather_chunks(pool, row[start:stop].to(torch.int64).numpy(), tail[1])[0]
        eng.capture_tail(kv, tail[0], affinity)
        eng.clock.add("capture", time.perf_counter() - t0)

    def _capture_state(self, req: "Req", tracked: tuple[int, int], keys: list[bytes],
                       affinity: int | None) -> None:
        boundary, slot = tracked
        eng = self.engine
        if boundary % eng.chunk or boundary // eng.chunk > len(keys) or boundary <= 0:
            return
        buf = req.kv.mamba_ping_pong_track_buffer
        if buf is None or int(buf[0]) != slot:
            return  # the slot was reused: its content is no longer the boundary's state
        key = keys[boundary // eng.chunk - 1]
        if eng.has_states([key])[0]:
            return
        state = self.hybrid.snapshot_bytes(self.req_to_token_pool.auxiliary_state_pool, slot)
        if state is not None:
            eng.put_state(key, state, affinity)
            eng.counters.add("mlx_states_captured")
