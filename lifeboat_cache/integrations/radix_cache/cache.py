"""The MLX radix cache ``lifeboat``: SGLang's own tree cache, extended from and persisted to the store.

:class:`LifeboatMlxRadixCache` is SGLang's ``UnifiedRadixCache`` with three additions, all on the
scheduler thread that owns the MLX pool (the factory in ``factory.py`` builds it):

* **write** (``checkpoint`` of a finished request; ``capture.ChunkCapture`` does it): the
  request's full 64-token chunks that the store does not hold yet are gathered out of
  ``MlxAttentionKVPool``, evaluated, and handed as numpy views to the background writer
  (``runtimes/mlx/writer.py``), which stores them uncompressed in the local tier; so is the prompt's
  partial last chunk (its *tail*, up to 63 tokens, in its own namespace), so the same prompt again
  restores all SGLang matches (all but its last token) and prefills one token.
* **read** (``match_prefix``): a short in-memory match is extended with the consecutive chunks the
  store holds (and the prompt's tail when every chunk before it is stored): pool slots are allocated
  (evicting if needed), the K/V rows installed (one copy per layer and K/V into the pool's memory), the tokens
  inserted into the tree, and the longer match returned. The read
  itself starts when the request *arrives* (``on_request_arrival``, called from the scheduler's
  ``_prefetch_kvcache``, which ``patches.py`` wraps), so it overlaps the request's wait in
  the queue.
* **hybrid models** (linear attention / mamba + attention): the recurrent state is stored at the chunk
  boundary where SGLang's runner snapshots it during prefill, and a restored prefix is only as long as
  the deepest boundary with a stored state, so it comes back with its state. Hybrid requests are
  served one at a time: a second concurrent one is refused with a clear message (SGLang's MLX runtime
  crashes on concurrent hybrid requests otherwise).

Storage trouble never raises into the scheduler: every hook degrades to "no extension" / "not
written" and is counted and logged. Private SGLang names used (pin ``sglang==0.5.23``):
``tp_worker._mlx_runner``, ``_ensure_mlx_pool_initialized``, ``MlxModelRunner._attention_kv_pool``,
``_cache_layout``, ``_req_caches``, ``_store_tracked_auxiliary_state``.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import torch

from sglang.srt.mem_cache.base_prefix_cache import (
    CacheRequestHandle,
    CacheRequestOutcome,
    EvictParams,
    InsertParams,
    MatchPrefixParams,
    MatchResult,
)
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from ...cooldown import RateLimitedLog
from ...runtimes.mlx import ChunkRead, HybridState, MlxChunkEngine
from .capture import ChunkCapture

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req

log = logging.getLogger(__name__)

HYBRID_CONCURRENCY_MESSAGE = (
    "LifeboatCache serves hybrid (linear-attention / mamba) models on MLX one request at a time; "
    "another request is running. Retry when it finishes, or send requests sequentially."
)
_LOG_EVERY_S = 30.0  # one warning per topic per interval: trouble must not flood the scheduler's log


class LifeboatMlxRadixCache(UnifiedRadixCache):
    """SGLang's unified radix cache, extended from and persisted to LifeboatCache (see module doc)."""

    def __init__(self, params: Any, *, engine: MlxChunkEngine, tp_worker: Any,
                 hybrid: HybridState | None = None) -> None:
        super().__init__(params)
        self.lifeboat = engine
        self._tp_worker = tp_worker
        self._runner = tp_worker._mlx_runner
        self.hybrid = hybrid
        self._active_hybrid: set[str] = set()
        self._gate = RateLimitedLog(_LOG_EVERY_S, log)
        self._writes = ChunkCapture(engine, self._runner, self.req_to_token_pool, hybrid, self._pool)

    # ------------------------------------------------------------------ plumbing
    def _pool(self) -> Any | None:
        """The MLX KV pool, created now if the first forward has not happened yet (as the worker would)."""
        pool = self._runner._attention_kv_pool
        if pool is None:
            ensure = getattr(self._tp_worker, "_ensure_mlx_pool_initialized", None)
            if ensure is not None:
                ensure()
            pool = self._runner._attention_kv_pool
        return pool

    def lifeboat_stats(self) -> dict[str, Any]:
        return self.lifeboat.stats()

    # ------------------------------------------------------------------ arrival
    def refuse_on_arrival(self, req: "Req") -> str | None:
        """Hybrid guard, asked before the request is queued: a message to refuse it with, or None."""
        if self.hybrid is None:
            return None
        if req.rid in self._active_hybrid:
            return None  # a retracted request coming back
        if self._active_hybrid:
            self.lifeboat.counters.add("mlx_hybrid_refused")
            log.warning("lifeboat: refusing request %s: %s", req.rid, HYBRID_CONCURRENCY_MESSAGE)
            return HYBRID_CONCURRENCY_MESSAGE
        self._active_hybrid.add(req.rid)
        return None

    def on_request_arrival(self, req: "Req") -> None:
        """Called when a request enters the waiting queue: start reading its stored chunks."""
        try:
            self._prefetch(req)
        except Exception:
            self.lifeboat.counters.add("mlx_arrival_errors")
            self._gate.log("arrival", "lifeboat: arrival read failed; the request is served without it",
                           exc_info=True)

    def _prefetch(self, req: "Req") -> None:
        if self.disable or req.finished() or getattr(req, "positional_embed_overrides", None) is not None:
            return
        tokens = req.origin_input_ids
        limit = len(tokens) - 1  # SGLang never matches the last input token (it needs its logits)
        n_full = limit // self.lifeboat.chunk
        if n_full <= 0:
            return
        key = RadixKey(tokens, req.extra_key, limit=limit, cache_salt=req.cache_salt)
        m = super().match_prefix(MatchPrefixParams(key=key)).device_prefix_len
        c0 = m // self.lifeboat.chunk
        if c0 >= n_full:
            return
        keys = self.lifeboat.keys(self.lifeboat.seed(req.extra_key, req.cache_salt), tokens, n_full)
        h = self.lifeboat.stored_run(keys[c0:])
        if h > 0:
            tail = self._stored_tail(keys, tokens, limit) if c0 + h == n_full else None
            self.lifeboat.prefetch(req.rid, keys[c0 + h - 1], keys[c0:c0 + h], c0, self.lifeboat.affinity(keys),
                                   tail)

    def _stored_tail(self, keys: list[bytes], tokens: Any, stop: int) -> tuple[bytes, int] | None:
        """The stored prompt tail after the full chunks of ``tokens[:stop]``, if any (not for hybrid
        models: their recurrent state is only stored at chunk boundaries)."""
        if self.hybrid is not None:
            return None
        tail = self.lifeboat.tail_of(keys, tokens, stop)
        return tail if tail is not None and self.lifeboat.has_tail(tail[0]) else None

    # ------------------------------------------------------------------ read path
    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        result = super().match_prefix(params)
        if self.disable or params.req is None:
            return result
        try:
            extended = self._extend_from_store(params, result)
        except Exception:
            self.lifeboat.counters.add("mlx_extend_errors")
            self._gate.log("extend", "lifeboat: extending a prefix from the store failed; serving the "
                           "in-memory match", exc_info=True)
            extended = None
        if self.hybrid is not None:
            self._copy_matched_state(params.req)
        return extended if extended is not None else result

    def _copy_matched_state(self, req: "Req") -> None:
        """Perform the MAMBA component's deferred copy-on-write of the matched state, now.

        The unified tree's match allocates the request an auxiliary slot and records the tree node's
        slot in ``req.kv.mamba_cow_src_index`` for the forward to copy. SGLang's CUDA model runner
        does that copy; its MLX worker (0.5.23) never does, so the MLX runner finds an empty slot and
        recomputes the whole prompt. ``MlxAuxiliaryStatePool.copy_from`` clones the snapshot here.
        """
        src = getattr(req.kv, "mamba_cow_src_index", None)
        dst = getattr(req.kv, "mamba_pool_idx", None)
        if src is None or dst is None:
            return
        self.req_to_token_pool.auxiliary_state_pool.copy_from(src, dst)
        req.kv.mamba_cow_src_index = None
        req.kv.mamba_needs_clear = False
        self.lifeboat.counters.add("mlx_state_copies")

    def _extend_from_store(self, params: MatchPrefixParams, result: MatchResult) -> MatchResult | None:
        key = params.key
        if key.is_bigram:
            return None
        eng = self.lifeboat
        c = eng.chunk
        m = result.device_prefix_len
        n_full = len(key) // c
        c0 = m // c
        if c0 >= n_full:
            return None
        t0 = time.perf_counter()
        tokens = key.raw_token_ids()
        keys = eng.keys(eng.seed(key.extra_key, key.cache_salt), tokens, n_full)
        req = params.req
        read = eng.take_prefetch(req.rid, keys, c0) if req is not None else None
        if read is None:
            h = eng.stored_run(keys[c0:])
            if h <= 0:
                return None
            tail = self._stored_tail(keys, tokens, len(key)) if c0 + h == n_full else None
            read = eng.read(keys[c0:c0 + h], c0, eng.affinity(keys), tail)
        upto = read.first + read.n_ok  # chunks [0, upto) are available (tree + store)
        state_slot = None
        if self.hybrid is not None:
            upto, state_slot = self._restore_state(keys, read, upto, m)
        tail_rows = 0
        if read.tail and upto == n_full and read.first + len(read.keys) == n_full:
            want = eng.tail_of(keys, tokens, len(key))
            if want is not None and want == (read.tail_key, read.tail):
                tail_rows = read.tail  # the prompt's own tail, verified: restore all SGLang would match
        end = upto * c + tail_rows
        if end <= m:
            self._free_state_slot(state_slot)
            return None
        slots = self._alloc_slots(end - m, result.last_device_node)
        if slots is None:
            self._free_state_slot(state_slot)
            eng.counters.add("mlx_extend_no_room")
            return None
        prefix = self.path_device_indices(result.last_device_node)
        if len(prefix) != m:
            self.token_to_kv_pool_allocator.free(slots)
            self._free_state_slot(state_slot)
            return None
        pool = self._pool()
        if pool is None:
            self.token_to_kv_pool_allocator.free(slots)
            self._free_state_slot(state_slot)
            return None
        eng.install(pool, slots.numpy(), read, upto, m - read.first * c, tail_rows)
        insert = InsertParams(
            key=RadixKey(tokens[:end], key.extra_key, cache_salt=key.cache_salt),
            value=torch.cat([prefix.to(torch.int64), slots.to(torch.int64)]),
            prev_prefix_len=m,
        )
        if state_slot is not None:
            insert.mamba_value = torch.tensor([state_slot], dtype=torch.int64)
        ins = self.insert(insert)
        if state_slot is not None and ins.mamba_exist:
            self._free_state_slot(state_slot)
        new = super().match_prefix(params)
        restored = max(0, new.device_prefix_len - m)
        eng.counters.add("mlx_extensions")
        eng.counters.add("mlx_tokens_restored", restored)
        eng.counters.add("mlx_chunks_restored", upto - c0)
        if tail_rows:
            eng.counters.add("mlx_tails_restored")
        eng.clock.add("extend", time.perf_counter() - t0)
        eng.counters.observe("mlx_restore", time.perf_counter() - t0)
        log.debug("lifeboat: %s: prefix %d -> %d tokens from the store (read %.1f ms)",
                  getattr(req, "rid", "?"), m, new.device_prefix_len, read.seconds * 1e3)
        return new

    def _alloc_slots(self, n: int, node: Any) -> torch.Tensor | None:
        """n pool slots, evicting unlocked tree leaves if needed; the matched path stays locked."""
        alloc = self.token_to_kv_pool_allocator
        lock = self.lock(node)
        try:
            short = n - alloc.available_size()
            if short > 0:
                self.evict(EvictParams(num_tokens=short))
            return alloc.alloc(n)
        finally:
            self.unlock(lock)

    # ------------------------------------------------------------------ hybrid restore
    def _restore_state(self, keys: list[bytes], read: ChunkRead, upto: int, m: int) -> tuple[int, int | None]:
        """Deepest chunk boundary <= upto with a stored state; its state written to a fresh aux slot."""
        assert self.hybrid is not None
        c = self.lifeboat.chunk
        lo = max(read.first, m // c)  # a boundary must add at least one chunk past the tree's match
        cands = list(range(upto, lo, -1))
        if not cands:
            return 0, None
        has = self.lifeboat.has_states([keys[j - 1] for j in cands])
        aux_pool = self.req_to_token_pool.auxiliary_state_pool
        for j, ok in zip(cands, has):
            if not ok or j * c <= m:
                continue
            buf = self.lifeboat.get_state(keys[j - 1], self.hybrid.nbytes, self.lifeboat.affinity(keys))
            if buf is None:
                continue
            slot = aux_pool.alloc(1)
            if slot is None:
                self.evict(EvictParams(num_tokens=0, mamba_num=1))
                slot = aux_pool.alloc(1)
            if slot is None:
                self.lifeboat.counters.add("mlx_state_no_room")
                return 0, None
            self.hybrid.restore_into_slot(aux_pool, int(slot[0]), buf)
            self.lifeboat.counters.add("mlx_states_restored")
            return j, int(slot[0])
        return 0, None

    def _free_state_slot(self, slot: int | None) -> None:
        if slot is not None:
            self.req_to_token_pool.auxiliary_state_pool.free(torch.tensor([slot], dtype=torch.int64))

    # ------------------------------------------------------------------ write path
    def checkpoint(self, req: "Req", *, up_to: int, **kwargs: Any) -> None:
        if not self.disable and req.finished():
            try:
                pool = self._pool()
                if pool is not None:  # once per pool: the first restore does not pay it
                    self.lifeboat.prepare_pool(pool)
                self._writes.capture(req, up_to)
            except Exception:
                self.lifeboat.counters.add("mlx_capture_errors")
                self._gate.log("capture", "lifeboat: copying a finished request's chunks failed; they "
                               "are not persisted", exc_info=True)
        super().checkpoint(req, up_to=up_to, **kwargs)

    # ------------------------------------------------------------------ request end
    def _forget(self, rid: str) -> None:
        self._active_hybrid.discard(rid)
        self.lifeboat.prefetches.drop(rid)
        if self.hybrid is not None:
            self.hybrid.take_tracked(rid)

    def on_release(self, req: "Req", *, checkpointed: bool) -> None:
        try:
            super().on_release(req, checkpointed=checkpointed)
        finally:
            if req.finished():
                self._forget(req.rid)

    def release_aborted_request(self, handle: CacheRequestHandle) -> None:
        try:
            super().release_aborted_request(handle)
        finally:
            self._forget(handle.rid)

    def finish(self, handle: CacheRequestHandle, outcome: CacheRequestOutcome) -> None:
        try:
            super().finish(handle, outcome)
        finally:
            self._forget(handle.rid)

    def shutdown(self) -> None:
        try:
            self.lifeboat.close()
        finally:
            super().shutdown()
