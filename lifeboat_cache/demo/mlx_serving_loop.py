"""Serve requests through SGLang's real MLX classes, one at a time, the way its scheduler does.

Why this exists: ``SGLANG_USE_MLX=1 sglang.launch_server`` refuses to start without an Apple Metal
device, so on Linux (the demo, ``lifeboat bench``'s MLX and real-KV sections, this repo's tests)
nothing launches the scheduler. The pieces the scheduler drives do run on Linux CPU, so
:class:`MlxServing` drives them in the scheduler's order:

1. ``load_plugins()`` (the real ``sglang.srt.plugins`` entry point → ``lifeboat`` registration), then
   ``publish(ServerArgs)`` (the plugin's resolution hook picks ``--radix-cache-backend lifeboat``);
2. ``MlxModelRunner`` (mlx-lm model, ``MlxAttentionKVPool`` created lazily on first use, as
   ``MlxTpModelWorker._ensure_mlx_pool_initialized`` does), ``ReqToTokenPool`` /
   ``MlxAuxiliaryStateReqToTokenPool``, ``TokenToKVPoolAllocator`` over SGLang's ``_DummyKVCache``;
3. the tree cache from ``registry.create_tree_cache(TreeCacheBuildContext)``;
4. per request: arrival through the (wrapped) ``Scheduler._prefetch_kvcache``; ``Req.init_next_round_input``
   (``match_prefix``); ``tree_cache.lock``; row and slot allocation with ``alloc_token_slots``;
   ``MlxModelRunner.prefill`` / ``decode_batch``; ``Req.update_finish_state``;
   ``MlxTpModelWorker.prepare_for_kv_cache_release``; ``release_kv_cache`` (→ ``checkpoint``).

Only two objects are not SGLang's own construction: the ``MlxTpModelWorker`` is created without its
``TpModelWorker.__init__`` (which needs a launched server) and given the runner, and its torch-side
``MlxModelRunnerStub`` is represented by the object holding ``req_to_token_pool``, the one attribute
``_ensure_mlx_pool_initialized`` reads. Requests run one at a time (no batching, no overlap).

Like a launch, :class:`MlxServing` sets ``SGLANG_USE_MLX=1`` and ``LIFEBOAT_CACHE=1`` in this process's
environment, so it runs in a process of its own: a plan process (:func:`run_plan_process`) or the demo's
``visit`` process. It is product code (the demo and the bench run on it), not a test helper: see
docs/architecture.md, "Where the demo and its serving loop live". Plans of serving steps, each in a
process of its own, are ``mlx_serving``'s.
"""

from __future__ import annotations

import logging
import os
import time
from array import array
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Sequence

import numpy as np

log = logging.getLogger(__name__)


@dataclass
class GenerationResult:
    rid: str
    output_ids: list[int]
    prompt_tokens: int
    cached_tokens: int      # prefix served from the cache (SGLang's cached_tokens = prefix_len)
    ttft_s: float           # arrival -> first output token (match, restore, prefill)
    decode_s: float         # all decode steps
    release_s: float        # end-of-request work on the scheduler thread (sync + tree insert + capture)
    aborted: str | None = None
    aux_restores: int = 0   # hybrid: prefills that started from a restored recurrent state (runner's view)


def _preresolve_mlx_gate() -> None:
    """Resolve SGLang's cached ``use_mlx()`` gate to False before ``SGLANG_USE_MLX=1`` is set.

    The gate validates Metal and raises on Linux; nothing driven here needs it (the harness is what
    the gate would have enabled), but server-arg resolution calls it.
    """
    from sglang.srt.hardware_backend.mlx.runtime import use_mlx

    saved = os.environ.pop("SGLANG_USE_MLX", None)
    try:
        use_mlx()
    finally:
        if saved is not None:
            os.environ["SGLANG_USE_MLX"] = saved


class MlxServing:
    """One model, one tree cache, requests served sequentially (see module doc).

    Construction changes ``os.environ`` (``SGLANG_USE_MLX``, ``LIFEBOAT_CACHE``) as a launch would, and
    raises what SGLang's construction raises (a model directory it cannot load, a bad lifeboat.yaml).
    """

    def __init__(self, model_dir: str | os.PathLike[str], *, lifeboat: bool = True, pool_size: int = 8192,
                 max_running_requests: int = 4, context_len: int | None = None, warmup: bool = False,
                 named: bool = False, hicache: bool = False) -> None:
        """``named``: the launch types ``--radix-cache-backend lifeboat`` and LIFEBOAT_CACHE is unset."""
        import torch

        _preresolve_mlx_gate()
        if lifeboat:
            os.environ["SGLANG_USE_MLX"] = "1"
            if named:
                os.environ.pop("LIFEBOAT_CACHE", None)
            else:
                os.environ["LIFEBOAT_CACHE"] = "1"
        from sglang.srt.plugins import load_plugins

        load_plugins()

        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.hardware_backend.mlx.kv_cache.auxiliary_state import MlxAuxiliaryStateReqToTokenPool
        from sglang.srt.hardware_backend.mlx.model_runner import MlxModelRunner
        from sglang.srt.hardware_backend.mlx.model_runner_stub import _DummyKVCache
        from sglang.srt.hardware_backend.mlx.tp_worker import MlxTpModelWorker
        from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.kv_cache_builder import uses_ssm_state
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.mem_cache.registry import TreeCacheBuildContext, create_tree_cache
        from sglang.srt.runtime_context import SpawnRanks, get_memory, publish, reset_context
        from sglang.srt.server_args import ServerArgs

        self.model_dir = str(model_dir)
        reset_context()
        self.server_args = ServerArgs(model_path=self.model_dir, device="cpu", page_size=1,
                                      disable_overlap_schedule=True,
                                      **({"radix_cache_backend": "lifeboat"} if named else {}))
        publish(self.server_args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=None))
        self.backend = get_memory().radix_cache_backend
        self.model_config = ModelConfig.from_server_args(self.server_args)
        ctx_len = context_len or min(int(self.model_config.context_len), pool_size)

        self.runner = MlxModelRunner(model_path=self.model_dir, pool_size=pool_size)
        self.hybrid = bool(uses_ssm_state(self.model_config))
        if self.hybrid:
            self.req_to_token_pool = MlxAuxiliaryStateReqToTokenPool(
                size=max_running_requests, max_context_len=ctx_len, device="cpu", enable_memory_saver=False,
                auxiliary_state_size=max_running_requests * 4)
        else:
            self.req_to_token_pool = ReqToTokenPool(size=max_running_requests, max_context_len=ctx_len,
                                                    device="cpu", enable_memory_saver=False)
        dummy = _DummyKVCache(size=pool_size, dtype=torch.float32, device="cpu")
        self.allocator = TokenToKVPoolAllocator(size=pool_size, dtype=torch.float32, device="cpu",
                                                kvcache=dummy, need_sort=False)
        self.worker = object.__new__(MlxTpModelWorker)
        self.worker._mlx_runner = self.runner
        self.worker._model_runner = SimpleNamespace(req_to_token_pool=self.req_to_token_pool)
        self.worker._mlx_pool_initialized = False
        self.worker._mlx_active_rids = set()
        self.worker._req_retraction_count = {}

        params = CacheInitParams(disable=False, req_to_token_pool=self.req_to_token_pool,
                                 token_to_kv_pool_allocator=self.allocator, page_size=1)
        ctx = TreeCacheBuildContext(
            server_args=self.server_args, params=params, is_hybrid_swa=False, is_hybrid_ssm=self.hybrid,
            enable_hierarchical_cache=hicache, disable_radix_cache=False, tp_worker=self.worker,
            model_config=self.model_config, tp_size=1, tp_rank=0, tp_group=None)
        self.build_context = ctx  # what SGLang handed the radix-cache factory (tests rebuild from it)
        self.cache = create_tree_cache(ctx)
        self._scheduler = self._scheduler_shell()
        self._n = 0
        self._arrived: dict[str, Any] = {}
        self.refusals: list[tuple[str, str | None]] = []
        self.aux_restores = 0
        if self.hybrid:
            self._observe_aux_restores()
        if warmup:
            self.warmup()

    def warmup(self) -> None:
        """A short request, as SGLang's launcher sends after startup: the KV pool and MLX's first-call
        work exist before real traffic (shorter than a chunk, so nothing is stored)."""
        self.generate(list(range(10, 26)), max_new_tokens=2, rid=f"warmup-{os.getpid()}")

    def _observe_aux_restores(self) -> None:
        """Count prefills whose auxiliary state the runner restored (vs. its full-prompt fallback)."""
        original = self.runner._restore_auxiliary_state

        def observed(req_pool_idx: int, cache: Any) -> bool:
            ok = original(req_pool_idx, cache)
            self.aux_restores += int(bool(ok))
            return ok

        self.runner._restore_auxiliary_state = observed

    def _scheduler_shell(self) -> Any:
        """A ``Scheduler`` instance carrying only what ``_prefetch_kvcache`` reads (no launch)."""
        from sglang.srt.managers.scheduler import Scheduler

        shell = object.__new__(Scheduler)
        shell.tree_cache = self.cache
        shell.enable_hicache_storage = False
        shell.enable_lmcache = False
        shell.max_queued_requests = None
        # the one transport call: with no tokenizer process to send to, record the abort instead
        shell.send_abort_output = lambda abort_req, req: self.refusals.append(
            (abort_req.rid, (abort_req.finished_reason or {}).get("message")))
        return shell

    def _admit(self, req: Any) -> str | None:
        """``Scheduler._add_request_to_queue`` for one request: queue-limit check, then arrival read."""
        if self._scheduler._abort_on_queued_limit(req):
            self._scheduler._release_aborted_request(req)
            return next((m for rid, m in reversed(self.refusals) if rid == req.rid), "aborted")
        self._scheduler._prefetch_kvcache(req)
        return None

    @property
    def engine(self) -> Any:
        return getattr(self.cache, "lifeboat", None)

    @property
    def pool(self) -> Any:
        self.worker._ensure_mlx_pool_initialized()
        return self.runner._attention_kv_pool

    # ------------------------------------------------------------------ serving
    def generate(self, input_ids: Sequence[int], max_new_tokens: int = 16, rid: str | None = None,
                 extra_key: str | None = None, cache_salt: str | None = None) -> GenerationResult:
        import torch

        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.mem_cache.allocation import alloc_token_slots
        from sglang.srt.mem_cache.common import release_kv_cache
        from sglang.srt.sampling.sampling_params import SamplingParams

        self._n += 1
        rid = rid or f"req-{os.getpid()}-{self._n}"
        sp = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
        sp.normalize(None)
        req = Req(rid, "", array("q", [int(t) for t in input_ids]), sp, extra_key=extra_key,
                  cache_salt=cache_salt)
        t_arrival = time.perf_counter()
        restores_before = self.aux_restores
        refused = self._admit(req)
        if refused is not None:
            return GenerationResult(rid, [], len(input_ids), 0, 0.0, 0.0, 0.0, aborted=refused)
        req.init_next_round_input(self.cache)
        req.extend_end = len(req.full_untruncated_fill_ids)
        req.lock = self.cache.lock(req.last_node)
        prefix = (self.cache.prefix_device_indices(req) if req.prefix_len
                  else torch.empty(0, dtype=torch.int64))
        cached = int(req.prefix_len)
        self.req_to_token_pool.alloc([req])
        idx = req.kv.req_pool_idx
        new = alloc_token_slots(self.cache, req.extend_end - req.prefix_len)
        self.req_to_token_pool.write((idx, slice(0, req.prefix_len)), prefix)
        self.req_to_token_pool.write((idx, slice(req.prefix_len, req.extend_end)), new)
        req.kv.kv_allocated_len = req.kv.kv_committed_len = req.extend_end
        ids = list(req.full_untruncated_fill_ids)
        self.worker._ensure_mlx_pool_initialized()  # what every MlxTpModelWorker forward does first
        tok = self.runner.prefill(rid, ids[req.prefix_len:], ids, prefix.tolist(), new.tolist(), idx, req=req)
        ttft = time.perf_counter() - t_arrival
        req.output_ids.append(tok)
        req.update_finish_state()
        t_dec = time.perf_counter()
        while not req.finished():
            seq = req.kv.kv_allocated_len
            slot = alloc_token_slots(self.cache, 1)
            self.req_to_token_pool.write((idx, seq), slot.to(torch.int32))
            req.kv.kv_allocated_len += 1
            req.kv.kv_committed_len += 1
            req.output_ids.append(self.runner.decode_batch([rid])[0])
            req.update_finish_state()
        decode_s = time.perf_counter() - t_dec
        t_rel = time.perf_counter()
        self.worker.prepare_for_kv_cache_release(req)
        release_kv_cache(req, self.cache, checkpoint=True)
        release_s = time.perf_counter() - t_rel
        self.runner.remove_request(rid)
        return GenerationResult(rid, [int(t) for t in req.output_ids], len(input_ids), cached, ttft,
                                decode_s, release_s, aux_restores=self.aux_restores - restores_before)

    def arrive(self, input_ids: Sequence[int], rid: str) -> str | None:
        """Only the arrival step of a request (queued, not run); returns the refusal message or None."""
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        sp = SamplingParams(max_new_tokens=1, temperature=0.0)
        sp.normalize(None)
        req = Req(rid, "", array("q", [int(t) for t in input_ids]), sp)
        refused = self._admit(req)
        if refused is None:
            self._arrived[rid] = req
        return refused

    def abort(self, rid: str) -> None:
        """Abort an arrived request as the scheduler's ``_release_aborted_request`` does."""
        from sglang.srt.mem_cache.base_prefix_cache import CacheRequestOutcome

        req = self._arrived.pop(rid)
        self.cache.finish(req.cache_request_handle, CacheRequestOutcome.ABORT)

    # ------------------------------------------------------------------ inspection
    def tree_kv_rows(self, input_ids: Sequence[int], n_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        """K and V pool rows ``[layers, n_tokens, heads, dim]`` the tree holds for a prompt's first tokens.

        A plain tree match (no request, so no store extension); bf16 comes back as uint16 bits.
        Raises AssertionError when the tree holds fewer than ``n_tokens`` tokens of the prompt.
        """
        import mlx.core as mx

        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        key = RadixKey(array("q", [int(t) for t in input_ids]), None, limit=n_tokens)
        res = self.cache.match_prefix(MatchPrefixParams(key=key))
        if res.device_prefix_len < n_tokens:
            raise AssertionError(f"the tree holds {res.device_prefix_len} tokens of this prompt, not {n_tokens}")
        slots = self.cache.path_device_indices(res.last_device_node)[:n_tokens]
        k, v = self.pool.get_kv_all_layers(mx.array(slots.numpy().astype(np.int32)))
        if k.dtype == mx.bfloat16:
            k, v = k.view(mx.uint16), v.view(mx.uint16)
        mx.eval(k, v)
        return np.array(k), np.array(v)

    def reset_tree(self) -> None:
        """Forget the in-memory prefix cache as SGLang's ``Scheduler.flush_cache`` does (tree, request
        rows, token slots, auxiliary-state slots; then the MLX runner's pool); the store is untouched."""
        self.cache.reset()
        self.req_to_token_pool.clear()
        self.allocator.clear()
        self.req_to_token_pool.reset_aux_cache_allocator()
        self.runner.clear()

    def flush(self, timeout: float = 60.0) -> bool:
        eng = self.engine
        return eng.flush(timeout) if eng is not None else True

    def close(self) -> None:
        eng = self.engine
        if eng is not None:
            eng.close()
