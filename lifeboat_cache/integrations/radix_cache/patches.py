"""Patches to SGLang 0.5.23 that the MLX radix cache ``lifeboat`` needs, applied by its factory.

* :func:`install_arrival_hook` wraps two ``Scheduler`` methods so the tree cache sees each request
  when it arrives: the hybrid one-request-at-a-time refusal, and the store read that overlaps the
  request's wait in the queue.
* :func:`auxiliary_state_component` fixes SGLang's ``MlxAuxiliaryStateComponent`` (fields its MAMBA
  match path reads are never set), so hybrid models can match a prefix at all.

Each patch checks the shape of what it wraps and, when SGLang changed it, logs and leaves SGLang as
it is (the feature it serves is then off, serving still works). Private SGLang names used:
``Scheduler._prefetch_kvcache``, ``Scheduler._abort_on_queued_limit``, ``scheduler._make_abort_req``.
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

log = logging.getLogger(__name__)


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
