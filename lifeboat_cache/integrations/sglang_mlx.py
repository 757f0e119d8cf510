"""SGLang MLX radix-cache backend ``lifeboat`` (``--radix-cache-backend lifeboat``).

On Apple silicon SGLang runs its MLX backend (``SGLANG_USE_MLX=1``), which has no HiCache. There the
plugin (``integrations/sglang_plugin.py``) registers :func:`create_lifeboat_radix_cache` under the name
``lifeboat``; it builds :class:`LifeboatMlxRadixCache`, SGLang's own ``UnifiedRadixCache`` with three
additions, all on the scheduler thread that owns the MLX pool:

* **write** (``checkpoint`` of a finished request): the request's full 64-token chunks that the store
  does not hold yet are gathered out of ``MlxAttentionKVPool``, evaluated, and handed as numpy views to
  the background writer (``runtimes/mlx.py``), which stores them uncompressed in the local tier;
  so is the prompt's partial last chunk (its *tail*, up to 63 tokens, in its own namespace), so the
  same prompt again restores all SGLang matches (all but its last token) and prefills one token.
* **read** (``match_prefix``): a short in-memory match is extended with the consecutive chunks the
  store holds (and the prompt's tail when every chunk before it is stored): pool slots are allocated
  (evicting if needed), the K/V rows installed (one slice update per layer and K/V), the tokens
  inserted into the tree, and the longer match returned. The read
  itself starts when the request *arrives* (``on_request_arrival``, called from the scheduler's
  ``_prefetch_kvcache`` which we wrap), so it overlaps the request's wait in the queue.
* **hybrid models** (linear attention / mamba + attention): the recurrent state is stored at the chunk
  boundary where SGLang's runner snapshots it during prefill, and a restored prefix is only as long as
  the deepest boundary with a stored state, so it comes back with its state. Hybrid requests are
  served one at a time: a second concurrent one is refused with a clear message (SGLang's MLX runtime
  crashes on concurrent hybrid requests otherwise).

Storage trouble never raises into the scheduler: every hook degrades to "no extension" / "not
written" and is counted and logged. Private SGLang names used (pin ``sglang==0.5.23``):
``tp_worker._mlx_runner``, ``_ensure_mlx_pool_initialized``, ``MlxModelRunner._attention_kv_pool``,
``_cache_layout``, ``_req_caches``, ``_store_tracked_auxiliary_state``, ``Scheduler._prefetch_kvcache``.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from sglang.srt.mem_cache.base_prefix_cache import (
    BasePrefixCache,
    CacheRequestHandle,
    CacheRequestOutcome,
    EvictParams,
    InsertParams,
    MatchPrefixParams,
    MatchResult,
)
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.components import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from ..config import ConfigError, Settings, load_settings
from ..runtimes.mlx import (CHUNK_TOKENS, ChunkRead, MlxChunkEngine, ModelFingerprint, drain_at_exit, gather_chunks,
                             gather_request_rows, mx_dtype_name, settle_pool, weights_identity)
from ..statsfile import StatsReporter
from ..runtimes.mlx_hybrid import HybridState

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.registry import TreeCacheBuildContext

log = logging.getLogger(__name__)

HYBRID_CONCURRENCY_MESSAGE = (
    "LifeboatCache serves hybrid (linear-attention / mamba) models on MLX one request at a time; "
    "another request is running. Retry when it finishes, or send requests sequentially."
)
ENV_REBUILD_WAIT = "LIFEBOAT_MLX_REBUILD_WAIT_S"
DEFAULT_REBUILD_WAIT_S = 10.0
EXIT_DRAIN_S = 10.0  # a clean exit writes the queued chunks for at most this long
_LOG_EVERY_S = 30.0


class _LogGate:
    """One warning per interval per topic: storage trouble must not flood the scheduler's log."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def warn(self, topic: str, msg: str, *args: Any, exc_info: bool = False) -> None:
        now = time.monotonic()
        if now - self._last.get(topic, -1e9) >= _LOG_EVERY_S:
            self._last[topic] = now
            log.warning(msg, *args, exc_info=exc_info)


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
        self._gate = _LogGate()

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
            self._gate.warn("arrival", "lifeboat: arrival read failed; the request is served without it",
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
            self._gate.warn("extend", "lifeboat: extending a prefix from the store failed; serving the "
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
                self._capture(req, up_to)
            except Exception:
                self.lifeboat.counters.add("mlx_capture_errors")
                self._gate.warn("capture", "lifeboat: copying a finished request's chunks failed; they "
                                "are not persisted", exc_info=True)
        super().checkpoint(req, up_to=up_to, **kwargs)

    def _computed_len(self, req: "Req") -> int:
        """Tokens whose KV the runner actually computed for this request (0 if it never ran)."""
        cache = self._runner._req_caches.get(req.rid)
        if cache is None:
            return 0
        return int(self._runner._first_attention_cache(cache).offset)

    def _capture(self, req: "Req", up_to: int) -> None:
        from sglang.srt.managers.schedule_batch import FINISH_ABORT

        eng = self.lifeboat
        tracked = self.hybrid.take_tracked(req.rid) if self.hybrid is not None else None
        if isinstance(req.finished_reason, FINISH_ABORT) or req.kv.req_pool_idx is None:
            return
        n = min(up_to, self._computed_len(req))
        n_full = n // eng.chunk
        if n_full <= 0:
            return
        tokens = req.full_untruncated_fill_ids
        keys = eng.keys(eng.seed(req.extra_key, req.cache_salt), tokens, n_full)
        affinity = eng.affinity(keys)
        todo = eng.missing(keys)
        if todo:
            req_cache = self._runner._req_caches.get(req.rid)
            layers = self._runner._cache_layout.full_attention_layer_indices
            if req_cache is not None and all(req_cache[li].keys is not None for li in layers):
                # the request's own caches hold the bytes SGLang copies into the pool rows; reading
                # them leaves the pool's deferred writes deferred
                eng.capture_from_request([req_cache[li] for li in layers], todo, [keys[i] for i in todo],
                                         affinity)
            else:
                pool = self._pool()
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
        eng = self.lifeboat
        stop = len(req.origin_input_ids) - 1  # SGLang matches all but the last prompt token
        if stop > n:
            return
        tail = eng.tail_of(keys, tokens, stop)
        if tail is None or eng.writer.is_pending(tail[0]) or eng.has_tail(tail[0]):
            return
        t0 = time.perf_counter()
        start = stop - tail[1]
        req_cache = self._runner._req_caches.get(req.rid)
        layers = self._runner._cache_layout.full_attention_layer_indices
        if req_cache is not None and all(req_cache[li].keys is not None for li in layers):
            kv = gather_request_rows([req_cache[li] for li in layers], start, stop)
        else:
            pool = self._pool()
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
        eng = self.lifeboat
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


# ---------------------------------------------------------------------------------------- factory

def auxiliary_state_component() -> type:
    """SGLang's ``MlxAuxiliaryStateComponent`` with the fields its MAMBA match path reads.

    In sglang 0.5.23 ``MlxAuxiliaryStateComponent.__init__`` skips ``MambaComponent.__init__``, so
    ``mamba_cache_chunk_size``, ``mamba_checkpoint_grid`` and ``mamba_max_states_per_path`` are never
    set and the first prefix match of a hybrid model raises ``AttributeError`` (reproduced on Linux
    CPU with a tiny Qwen3-Next). We set them exactly as ``MambaComponent.__init__`` does.
    """
    from sglang.srt.hardware_backend.mlx.kv_cache.auxiliary_state import MlxAuxiliaryStateComponent
    from sglang.srt.runtime_context import get_exec, mamba_cache_chunk_size, mamba_checkpoint_grid

    class LifeboatAuxiliaryStateComponent(MlxAuxiliaryStateComponent):
        def __init__(self, cache: Any, params: Any) -> None:
            super().__init__(cache, params)
            defaults = {
                "mamba_cache_chunk_size": lambda: mamba_cache_chunk_size(),
                "mamba_checkpoint_grid": lambda: mamba_checkpoint_grid(params.page_size),
                "mamba_max_states_per_path": lambda: get_exec().mamba.mamba_max_states_per_path,
            }
            for name, make in defaults.items():
                if not hasattr(self, name):
                    setattr(self, name, make())

    return LifeboatAuxiliaryStateComponent


def install_arrival_hook() -> bool:
    """Let the tree cache see each request when it arrives, through two SGLang scheduler methods.

    * ``Scheduler._abort_on_queued_limit(req)`` is SGLang's admission check in
      ``_add_request_to_queue`` ("the request queue is full"): returning True makes SGLang send the
      abort (HTTP 503 with our message) and drop the request before it is queued or run. We ask
      ``tree_cache.refuse_on_arrival(req)`` first (the hybrid one-request-at-a-time guard).
    * ``Scheduler._prefetch_kvcache(req)`` runs next for every queued request (HiCache's prefetch
      hook, a no-op without HiCache): we call ``tree_cache.on_request_arrival(req)`` first, which
      starts the store read while the request waits.
    """
    try:
        from sglang.srt.managers import scheduler as scheduler_mod
    except Exception:  # noqa: BLE001 - no scheduler module: reads start at scheduling instead
        log.warning("lifeboat: cannot import SGLang's scheduler; store reads start at scheduling time")
        return False
    Scheduler = scheduler_mod.Scheduler
    ok = True
    original_prefetch = Scheduler._prefetch_kvcache
    if not getattr(original_prefetch, "_lifeboat_wrapped", False):
        if list(inspect.signature(original_prefetch).parameters)[:2] == ["self", "req"]:
            @functools.wraps(original_prefetch)
            def _prefetch_kvcache(self: Any, req: Any, *args: Any, **kwargs: Any) -> Any:
                hook = getattr(getattr(self, "tree_cache", None), "on_request_arrival", None)
                if hook is not None and not args and not kwargs:  # first arrival, not a HiCache retry
                    hook(req)
                return original_prefetch(self, req, *args, **kwargs)

            _prefetch_kvcache._lifeboat_wrapped = True  # type: ignore[attr-defined]
            Scheduler._prefetch_kvcache = _prefetch_kvcache
        else:
            log.warning("lifeboat: Scheduler._prefetch_kvcache changed shape; store reads start at scheduling")
            ok = False
    original_limit = Scheduler._abort_on_queued_limit
    make_abort = getattr(scheduler_mod, "_make_abort_req", None)
    if not getattr(original_limit, "_lifeboat_wrapped", False):
        if make_abort is not None and list(inspect.signature(original_limit).parameters)[:2] == ["self", "recv_req"]:
            from http import HTTPStatus

            @functools.wraps(original_limit)
            def _abort_on_queued_limit(self: Any, recv_req: Any) -> bool:
                refuse = getattr(getattr(self, "tree_cache", None), "refuse_on_arrival", None)
                message = refuse(recv_req) if refuse is not None else None
                if message:
                    self.send_abort_output(
                        make_abort(recv_req, finished_reason={
                            "type": "abort", "status_code": HTTPStatus.SERVICE_UNAVAILABLE, "message": message}),
                        recv_req)
                    recv_req.time_stats.trace_ctx.abort(abort_info={"reason": message})
                    return True
                return original_limit(self, recv_req)

            _abort_on_queued_limit._lifeboat_wrapped = True  # type: ignore[attr-defined]
            Scheduler._abort_on_queued_limit = _abort_on_queued_limit
        else:
            log.warning("lifeboat: Scheduler._abort_on_queued_limit changed shape; concurrent hybrid "
                        "requests cannot be refused")
            ok = False
    return ok


def mlx_settings(settings: Settings | None = None) -> Settings:
    """LifeboatCache settings for the MLX path: as configured, but chunks are stored uncompressed.

    KV on Apple silicon is read back into unified memory at memory speed; zstd would cost more CPU
    time than the bytes it saves.
    """
    settings = settings or load_settings()
    return replace(settings, engine=replace(settings.engine, compression="none"))


def model_fingerprint(runner: Any, model_path: str, settings: Settings,
                      hybrid: HybridState | None = None) -> ModelFingerprint:
    """Fingerprint of the model SGLang's MLX runner serves (weights, dtype, pool geometry)."""
    from ..config import default_cache_dir

    n_kv_heads, head_dim, dtype = runner._get_attn_config()
    if settings.model_id:
        weights = f"model_id:{settings.model_id}"
    else:
        weights = weights_identity(resolve_model_dir(runner, model_path), memo_dir=default_cache_dir())
    return ModelFingerprint(
        weights=weights,
        dtype=mx_dtype_name(dtype),
        num_layers=int(runner._cache_layout.num_full_attention_layers),
        n_kv_heads=int(n_kv_heads),
        head_dim=int(head_dim),
        chunk_tokens=CHUNK_TOKENS,
        state_layout=hybrid.layout() if hybrid is not None else None,
        key_namespace=settings.key_namespace,
    )


def resolve_model_dir(runner: Any, model_path: str) -> str:
    """The local directory the runner loaded (an HF repo id resolves to its snapshot, offline)."""
    if os.path.isdir(model_path):
        return model_path
    from sglang.srt.hardware_backend.mlx.remote_code_gate import resolve_model_directory

    return str(resolve_model_directory(model_path, revision=getattr(runner, "revision", None)))


def parse_rebuild_wait(env: Any) -> float:
    """`LIFEBOAT_MLX_REBUILD_WAIT_S`: seconds the launch waits for the store's index (0 .. 3600)."""
    raw = (env.get(ENV_REBUILD_WAIT) or "").strip()
    if not raw:
        return DEFAULT_REBUILD_WAIT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 3600.0:
        raise ConfigError(f"{ENV_REBUILD_WAIT}={raw!r} is invalid: allowed values are seconds from 0 to 3600 "
                          f"(default {DEFAULT_REBUILD_WAIT_S:.0f}), e.g. {ENV_REBUILD_WAIT}=30")
    return value


def _fallback(ctx: "TreeCacheBuildContext", why: str) -> BasePrefixCache:
    from sglang.srt.mem_cache.registry import default_radix_cache_factory

    log.warning("lifeboat: %s; serving with SGLang's default radix cache (nothing is persisted)", why)
    return default_radix_cache_factory(ctx)


def create_lifeboat_radix_cache(ctx: "TreeCacheBuildContext") -> BasePrefixCache:
    """``--radix-cache-backend lifeboat`` factory (registered by the plugin on MLX launches)."""
    from ..store import ChunkStore

    if ctx.enable_hierarchical_cache:
        raise ValueError("--radix-cache-backend lifeboat is SGLang's MLX prefix cache and HiCache does not "
                         "exist on MLX; drop --enable-hierarchical-cache (LifeboatCache persists the prefix "
                         "cache itself)")
    runner = getattr(ctx.tp_worker, "_mlx_runner", None)
    if runner is None:
        raise ValueError("--radix-cache-backend lifeboat works with SGLang's MLX backend only "
                         "(SGLANG_USE_MLX=1); on CUDA use the HiCache storage backend instead")
    if ctx.disable_radix_cache:
        return _fallback(ctx, "the radix cache is disabled (--disable-radix-cache)")
    layout = runner._cache_layout
    if ctx.is_hybrid_swa or layout.has_sliding_window_layers:
        return _fallback(ctx, "sliding-window models have no shared MLX KV pool (a prefix hit recomputes)")
    if layout.num_full_attention_layers == 0:
        return _fallback(ctx, "the model has no full-attention layers to persist")

    settings = mlx_settings()  # ConfigError (a typo in lifeboat.yaml) stops the launch with its message
    wait_s = parse_rebuild_wait(os.environ)  # a bad value stops the launch naming the variable
    hybrid = None
    if ctx.is_hybrid_ssm or layout.has_auxiliary_state:
        hybrid = HybridState.probe(runner)
    try:
        fp = model_fingerprint(runner, str(runner.model_path), settings, hybrid)
    except Exception as e:  # noqa: BLE001 - without a weights identity, persisting would be unsafe
        return _fallback(ctx, f"cannot fingerprint the model's weights ({e}); set model_id in lifeboat.yaml")
    try:
        store = ChunkStore.open(settings)
    except ConfigError:
        raise
    except OSError as e:
        return _fallback(ctx, f"cannot open the LifeboatCache store ({e})")
    if not store.wait_rebuilt(wait_s):
        log.warning("lifeboat: the store index is still rebuilding after %.0f s; early requests may miss", wait_s)
    engine = MlxChunkEngine(store, fp, queue_bytes=settings.engine.copy_queue_bytes)
    store.counters.name_namespace(engine.ns, model=str(runner.model_path), kind="mlx-kv", dtype=fp.dtype)
    store.counters.name_namespace(engine.tail_ns, model=str(runner.model_path), kind="mlx-kv-tail", dtype=fp.dtype)
    if hybrid is not None:
        store.counters.name_namespace(engine.state_ns, model=str(runner.model_path), kind="mlx-state")
    engine.reporter = StatsReporter(store, role="mlx", labels={"model": str(runner.model_path), "rank": "0"})
    # a clean exit writes what is queued, within a bounded time (a killed process loses only that
    # tail, which is recomputed next time, never served wrong)
    drain_at_exit(engine, EXIT_DRAIN_S)

    params = ctx.params
    components = [ComponentType.FULL]
    if hybrid is not None:
        components.append(ComponentType.MAMBA)
        params.component_registry_override = {
            **(params.component_registry_override or {}),
            ComponentType.MAMBA: auxiliary_state_component(),
        }
        hybrid.watch_runner()
    params.tree_components = tuple(components)
    cache = LifeboatMlxRadixCache(params, engine=engine, tp_worker=ctx.tp_worker, hybrid=hybrid)
    install_arrival_hook()
    log.info("lifeboat: MLX prefix cache on %s (model %s, %s KV, %d layers x %d heads x %d; %s)",
             settings.source, fp.weights[:16], fp.dtype, fp.num_layers, fp.n_kv_heads, fp.head_dim,
             "hybrid, one request at a time" if hybrid else "attention")
    return cache
