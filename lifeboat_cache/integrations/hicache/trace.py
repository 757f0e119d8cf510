"""Trace lines of the SGLang HiCache backend (`engine.trace: true`): one line per SGLang call.

`TRACE_LINES` maps each data-path method of `LifeboatHiCacheStorage` to its describer (for
`tracing.trace_calls`); `NOT_TRACED` names every other public method and why it has no line of its own.
A test checks that every public method of the backend is in exactly one of the two tables, so a new
method cannot go untraced by accident. Used by `sglang_backend`.
"""

from __future__ import annotations

from typing import Any, Sequence

from sglang.srt.mem_cache.hicache_storage import PoolTransferResult

from ...tracing import Describer


def _keys_arg(args: tuple, kwargs: dict) -> Sequence[Any]:
    return args[0] if args else kwargs.get("keys", ())


def _trace_pages(name: str) -> Describer:
    """v1 / copying calls: keys in; per-key results (bool or page-or-None), or one bool for batch_set."""
    def describe(args: tuple, kwargs: dict, result: Any) -> Any:
        n = len(_keys_arg(args, kwargs))
        if isinstance(result, bool):  # batch_set: all written, or not
            return [(name, n, str(n) if result else "fewer")]
        if isinstance(result, int):  # batch_exists: leading hits
            return [(name, n, str(result))]
        return [(name, n, str(sum(r is not None and r is not False for r in result)))]
    return describe


def _trace_transfers(name: str) -> Describer:
    """v2 set / get: one line per pool, as `batch_set_v2[<pool>]`."""
    def describe(args: tuple, kwargs: dict, result: dict) -> Any:
        return [(f"{name}[{pool}]", len(ok), str(sum(ok))) for pool, ok in result.items()]
    return describe


def _trace_exists_v2(args: tuple, kwargs: dict, result: PoolTransferResult) -> Any:
    return [("batch_exists_v2", len(_keys_arg(args, kwargs)), str(result.kv_hit_pages))]


#: One trace line per SGLang call (`engine.trace: true`): method -> its describer (tracing.trace_calls).
TRACE_LINES: dict[str, Describer] = {
    "batch_exists": _trace_pages("batch_exists"),
    "batch_set_v1": _trace_pages("batch_set_v1"),
    "batch_get_v1": _trace_pages("batch_get_v1"),
    "batch_set": _trace_pages("batch_set"),  # set() goes through it
    "batch_get": _trace_pages("batch_get"),  # get() goes through it
    "batch_exists_v2": _trace_exists_v2,
    "batch_set_v2": _trace_transfers("batch_set_v2"),
    "batch_get_v2": _trace_transfers("batch_get_v2"),
}
#: Public methods without a line of their own, and why (a test checks every public method is in one table).
NOT_TRACED: dict[str, str] = {
    "set": "one key: traced as its batch_set",
    "get": "one key: traced as its batch_get",
    "exists": "one key, index only: SGLang's v1 path uses batch_exists",
    "register_mem_pool_host": "once per pool: logged by on_host_pools_registered",
    "register_mem_host_pool_v2": "once per pool: logged by on_host_pools_registered",
    "on_host_pools_registered": "logs each pool itself",
    "finalize_mem_pool_registration": "alias of on_host_pools_registered",
    "get_stats": "a metrics scrape, no I/O",
    "clear": "not supported; logs a warning",
    "close": "logged by the store",
}
