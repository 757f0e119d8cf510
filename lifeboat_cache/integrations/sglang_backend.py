"""LifeboatHiCacheStorage: LifeboatCache as SGLang's HiCache L3 storage backend (SGLang 0.5.23).

Stock SGLang loads it through its `dynamic` storage backend:

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "lifeboat",
        "module_path": "lifeboat_cache.integrations.sglang_backend",
        "class_name": "LifeboatHiCacheStorage", "interface_v1": 1}'

The shim is thin: it turns host-pool pages into numpy views (`hicache/pages.py`) and SGLang page keys
into keys of one namespace per pool and rank (`hicache/keys.py`), checks each call's arguments
(`hicache/checks.py`), and calls the `ChunkStore`, whose io workers encode, write, read, verify and decode
a 128-page call in parallel. A page is stored as exactly the bytes of SGLang's flat page
(`get_data_page(idx, flat=True)`), so the zero-copy (v1) and copying (`batch_set` / `batch_get`)
interfaces read each other's pages. Zero-copy pages are lists of views of the pool: one or two
blocks for `page_first*`, 2*L (MHA) or L (MLA) blocks for `layer_first`; the store writes them with
`pwritev` straight from the pool when raw, and gathers them into one buffer on its io worker when it compresses.
Pools whose pages are not views of their own buffers go through SGLang's copying accessors.

Nothing here raises into SGLang after construction (the guard, `hicache/guard.py`): an unexpected error
is a miss (or a dropped write), logged at most once per `failure_cooldown_max_s`; storage errors are handled (and cooled
down) by the store. Invalid settings do raise at construction: SGLang then rolls the attach back.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections import deque
from multiprocessing import util as mp_util
from typing import Any, Optional, Sequence

import numpy as np
import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)

from ..config import ConfigError, load_settings
from ..cooldown import RateLimitedLog
from ..ops import StatsReporter
from ..store import ChunkStore
from ..tracing import trace_calls
from .hicache import (
    INT_OF_WIDTH, MAX_CALL_PAGES, TRACE_LINES, BadCall, HostPool, as_numpy, check_extra_info, check_indices,
    check_keys, check_pages, count, dialog_affinity, guarded, no_pages, no_transfers, page_tensors, pool_namespace)
from .launch import EXTRA_CONFIG, SGLANG_KEYS, parse_zero_copy

log = logging.getLogger(__name__)

_METRIC_SAMPLES = 4096  # per-call samples kept for get_stats() between two scrapes
# SGLang 0.5.23 never closes its storage backend on a graceful shutdown (release_host_resources only
# frees the host pools), and SIGKILLs a scheduler still alive 15 s after its ShutdownReq
# (tokenizer_manager._SCHEDULER_EXIT_TIMEOUT_SECS): the store closes itself at process exit, within this.
EXIT_COPY_TIMEOUT_S = 8.0


def _leading(hits: Sequence[bool]) -> int:
    return hits.index(False) if False in hits else len(hits)


def _check_indices(pool: HostPool, host_indices: Any, n: int) -> None:
    """Whole pages of this pool only (hicache.check_indices); capacity in logical slots."""
    capacity = getattr(pool.host, "logical_size", None) or getattr(pool.host, "size", None)
    check_indices(host_indices, n, pool.page_size, capacity, pool.page_bytes,
                  lambda s: sum(t.numel() * t.element_size() for t in page_tensors(pool.host, s)))


def _check_pages(pool: HostPool, tensors: Any, n: int, what: str, writable: bool = False) -> None:
    check_pages(tensors, n, pool.page_bytes, what, writable, INT_OF_WIDTH)


class LifeboatHiCacheStorage(HiCacheStorage):
    """SGLang HiCache L3 backend over a LifeboatCache ChunkStore (see the module docstring).

    Construction raises ConfigError (a bad extra-config key or value, a bad lifeboat.yaml or
    `LIFEBOAT_SGLANG_ZERO_COPY`) or OSError (the store cannot be opened); SGLang then rolls the attach
    back. After that no method raises: a failure does nothing and is counted (`hicache/guard.py`).
    """

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None) -> None:
        self._closed = True  # until the store is open
        self.config = storage_config
        extra = storage_config.extra_config if storage_config.extra_config is not None else {}
        if not isinstance(extra, dict):
            raise ConfigError(f"{EXTRA_CONFIG}: expected a JSON object, got {type(extra).__name__}")
        ours = {k: v for k, v in extra.items() if k not in SGLANG_KEYS}
        affinity_chunks = ours.pop("affinity_chunks", None)
        settings = load_settings(overrides=ours, overrides_source=EXTRA_CONFIG)
        self.affinity_chunks = self._affinity_chunks(affinity_chunks, settings.storage[0].affinity_chunks)
        self.trace = settings.engine.trace  # one line per SGLang call (TRACE_LINES): the store's own is off
        self.model_id = settings.model_id or storage_config.model_name or ""
        self.key_namespace = settings.key_namespace
        # a call that did nothing is logged at most once per failure_cooldown_max_s (_failed)
        self._fail_log = RateLimitedLog(settings.engine.failure_cooldown_max_s, log)
        self.zero_copy = parse_zero_copy(os.environ)  # same rule as the launch check; bad value: ConfigError
        if storage_config.extra_config is not None:  # SGLang reads it after construction to pick v1
            storage_config.extra_config["interface_v1"] = int(
                self.zero_copy and bool(storage_config.extra_config.get("interface_v1", 1)))
        if not self.model_id:
            log.warning("lifeboat: no model_id and no SGLang model name; pages are keyed by geometry only")
        self.pools: dict[str, HostPool] = {}
        self._metrics_lock = threading.Lock()
        self._metrics: dict[str, deque] = {k: deque(maxlen=_METRIC_SAMPLES) for k in
                                           ("prefetch_pgs", "backup_pgs", "prefetch_bandwidth", "backup_bandwidth")}
        self.store = ChunkStore.open(dataclasses.replace(
            settings, engine=dataclasses.replace(settings.engine, trace=False)))
        self.reporter = StatsReporter(self.store, role="sglang-hicache",  # stats file + lifeboat_* metrics
                                      labels={"model": self.model_id, "rank": storage_config.tp_rank})
        if self.trace:
            trace_calls(self, TRACE_LINES, log)
        self._closed = False
        # runs in SGLang's scheduler process (a multiprocessing child) when it exits, and in a main process;
        # cancelled by close(): the hook holds this backend, and SGLang's runtime detach drops a closed
        # backend expecting it (its store, index and the host pool's views) to be freed
        self._at_exit = mp_util.Finalize(None, self.close, kwargs={"copy_timeout_s": EXIT_COPY_TIMEOUT_S},
                                         exitpriority=10)
        log.info("lifeboat: HiCache L3 backend (tp %d/%d, pp %d/%d, %s, %s) on %s",
                 storage_config.tp_rank, storage_config.tp_size, storage_config.pp_rank,
                 storage_config.pp_size, "MLA" if storage_config.is_mla_model else "MHA",
                 "zero-copy" if self.zero_copy else "copying interface", settings.source)

    @staticmethod
    def _affinity_chunks(value: Any, default: int) -> int:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            shown = "a number below 1" if isinstance(value, int) else f"a {type(value).__name__}"
            raise ConfigError(f"{EXTRA_CONFIG}.affinity_chunks: expected an integer >= 1 "
                              f"(pages of a dialog that choose its drive), got {shown}")
        return value

    # ------------------------------------------------------------------ registration
    # Guarded too: a pool the backend cannot handle stays unregistered, and its calls are misses.
    @guarded(lambda *a, **k: None)
    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        self._add_pool(str(PoolName.KV), mem_pool_host)

    @guarded(lambda *a, **k: None)
    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        self._add_pool(str(host_pool_name), host_pool)

    @guarded(lambda *a, **k: None)
    def on_host_pools_registered(self) -> None:
        for p in self.pools.values():
            log.info("lifeboat: pool %s: %s %s, %d tokens/page, %d bytes/page, %s, keys %s",
                     p.name, type(p.host).__name__, p.host.layout, p.page_size, p.page_bytes,
                     "zero-copy" if p.zero_copy else "copied pages",
                     "shared by all TP ranks (rank 0 writes)" if p.replicated else f"of TP rank {self.config.tp_rank}")

    finalize_mem_pool_registration = on_host_pools_registered  # the name on SGLang's main branch

    def _add_pool(self, name: str, host: Any) -> None:
        ns, replicated = pool_namespace(self.config, self.model_id, self.key_namespace, name, host)
        self.pools[name] = HostPool(name, host, ns, replicated, self.zero_copy)
        self.store.counters.name_namespace(self.pools[name].ns, model=self.model_id, pool=name,
                                           rank=None if replicated else self.config.tp_rank)

    def _pool(self, name: Any) -> HostPool:
        pool = self.pools.get(str(name))
        if pool is None:
            raise LookupError(f"host pool {str(name)!r} is not registered (registered: {sorted(self.pools)})")
        return pool

    # ------------------------------------------------------------------ KV pages (v1 and copying)
    @guarded(lambda *a, **k: 0)
    def batch_exists(self, keys: list[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        check_keys(keys)
        return self.store.count_leading_hits(self._pool(PoolName.KV).ns, keys)

    @guarded(lambda *a, **k: False)
    def exists(self, key: str) -> bool:
        check_keys([key], "key")
        return self.store.contains(self._pool(PoolName.KV).ns, [key])[0]

    @guarded(no_pages)
    def batch_set_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> list[bool]:
        pool = self._pool(PoolName.KV)
        _check_indices(pool, host_indices, len(check_keys(keys)))
        check_extra_info(extra_info)
        return self._write(pool, keys, host_indices, extra_info, "batch_set_v1")

    @guarded(no_pages)
    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> list[bool]:
        pool = self._pool(PoolName.KV)
        _check_indices(pool, host_indices, len(check_keys(keys)))
        return self._read(pool, keys, host_indices, "batch_get_v1")

    @guarded(lambda *a, **k: False)
    def batch_set(self, keys: list[str], values: Optional[Any] = None, target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        """Copying interface: `values` are SGLang's flat page copies (get_data_page(idx))."""
        pool = self._pool(PoolName.KV)
        _check_pages(pool, values, len(check_keys(keys)), "values")
        t0 = time.perf_counter()
        ok = self.store.put(pool.ns, keys, [as_numpy(v.contiguous()) for v in values])
        self._record("backup", t0, sum(ok), pool.page_bytes)
        return all(ok)

    @guarded(lambda keys=None, *a, **k: [None] * count(keys))
    def batch_get(self, keys: list[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> list[Optional[torch.Tensor]]:
        """Copying interface: decode into SGLang's flat dummy pages; None per miss."""
        pool = self._pool(PoolName.KV)
        _check_pages(pool, target_locations, len(check_keys(keys)), "target_locations", writable=True)
        t0 = time.perf_counter()
        ok = self.store.get_into(pool.ns, keys, [as_numpy(t) for t in target_locations])
        self._record("prefetch", t0, _leading(ok), pool.page_bytes)
        return [t if good else None for t, good in zip(target_locations, ok)]

    @guarded(lambda *a, **k: False)
    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], None if value is None else [value])

    @guarded(lambda *a, **k: None)
    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> Optional[torch.Tensor]:
        return self.batch_get([key], None if target_location is None else [target_location])[0]

    # ------------------------------------------------------------------ hybrid-model pools (v2)
    @guarded(lambda *a, **k: PoolTransferResult.empty())
    def batch_exists_v2(self, keys: list[str], pool_transfers: Optional[list[PoolTransfer]] = None,
                        extra_info: Optional[HiCacheStorageExtraInfo] = None) -> PoolTransferResult:
        """Longest KV prefix for which every pool it needs is present (all-or-nothing)."""
        check_keys(keys)
        if pool_transfers is not None and not isinstance(pool_transfers, (list, tuple)):
            raise BadCall(f"pool_transfers: expected a list, got {type(pool_transfers).__name__}")
        for t in pool_transfers or []:
            if not isinstance(t, PoolTransfer):
                raise BadCall(f"pool_transfers: expected PoolTransfer items, got {type(t).__name__}")
            if t.keys is not None:
                check_keys(t.keys, "pool_transfers[].keys")
        kv = self.store.count_leading_hits(self._pool(PoolName.KV).ns, keys)
        hits: dict[Any, int] = {PoolName.KV: kv} if kv else {}
        ok = np.arange(kv + 1) >= 1  # ok[p]: a prefix of p pages is restorable
        for t in pool_transfers or []:
            pool_ok = self._restorable(t, keys[:kv])
            if pool_ok.any():
                hits[t.name] = int(np.flatnonzero(pool_ok)[-1])
            ok &= pool_ok
        restorable = np.flatnonzero(ok).tolist()
        final = restorable[-1] if restorable else 0
        return PoolTransferResult(final, hits, restorable)

    def _restorable(self, t: PoolTransfer, keys: list[str]) -> np.ndarray:
        """Per prefix length 0..len(keys): whether pool t has what restoring that prefix needs."""
        pool = self.pools.get(str(t.name))
        if pool is None or t.hit_policy not in (PoolHitPolicy.ALL_PAGES, PoolHitPolicy.TRAILING_PAGES):
            return np.zeros(len(keys) + 1, dtype=bool)  # unknown pool or policy: nothing is restorable
        missing = np.concatenate([[0], np.cumsum(~np.array(self.store.contains(pool.ns, keys), dtype=bool))])
        p = np.arange(len(keys) + 1)
        window = p if t.hit_policy == PoolHitPolicy.ALL_PAGES else np.minimum(p, max(1, len(t.keys or ())))
        return (missing[p] - missing[p - window] == 0) & (p >= 1)

    @guarded(no_transfers)
    def batch_set_v2(self, transfers: list[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> dict[str, list[bool]]:
        self._check_transfers(transfers)
        check_extra_info(extra_info)
        return {t.name: self._write(self._pool(t.name), t.keys or [], t.host_indices, extra_info,
                                    f"batch_set_v2[{t.name}]") for t in transfers}

    @guarded(no_transfers)
    def batch_get_v2(self, transfers: list[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> dict[str, list[bool]]:
        self._check_transfers(transfers)
        return {t.name: self._read(self._pool(t.name), t.keys or [], t.host_indices,
                                   f"batch_get_v2[{t.name}]") for t in transfers}

    def _check_transfers(self, transfers: Any) -> None:
        """Every transfer is checked before any is done, so a bad one cannot leave half a call done."""
        if not isinstance(transfers, (list, tuple)) or len(transfers) > MAX_CALL_PAGES:
            raise BadCall(f"transfers: expected a list of PoolTransfer, got {type(transfers).__name__}")
        names = set()
        for t in transfers:
            if not isinstance(t, PoolTransfer):
                raise BadCall(f"transfers: expected PoolTransfer items, got {type(t).__name__}")
            names.add(t.name)  # an unhashable name raises TypeError: the guard's business
            keys = check_keys(t.keys or [], f"transfers[{str(t.name)!r}].keys")
            _check_indices(self._pool(t.name), t.host_indices, len(keys))
        if len(names) != len(transfers):
            raise BadCall("transfers: one pool named twice")

    # ------------------------------------------------------------------ shared I/O paths
    def _write(self, pool: HostPool, keys: Sequence[str], host_indices: Optional[torch.Tensor],
               extra_info: Optional[HiCacheStorageExtraInfo], what: str) -> list[bool]:
        t0 = time.perf_counter()
        starts = self._starts(pool, host_indices, len(keys), what)
        if starts is None:
            return [False] * len(keys)
        if pool.replicated and not self.config.is_storage_writer:
            return [True] * len(keys)  # replicated pages are written once, by the writer rank
        ok = pool.write(self.store, keys, starts, self._affinity(keys, extra_info))
        self._record("backup", t0, sum(ok), pool.page_bytes)
        return ok

    def _read(self, pool: HostPool, keys: Sequence[str], host_indices: Optional[torch.Tensor],
              what: str) -> list[bool]:
        t0 = time.perf_counter()
        starts = self._starts(pool, host_indices, len(keys), what)
        if starts is None:
            return [False] * len(keys)
        ok = pool.read(self.store, keys, starts)
        self._record("prefetch", t0, _leading(ok), pool.page_bytes)
        return ok

    @staticmethod
    def _starts(pool: HostPool, host_indices: Optional[torch.Tensor], n: int, what: str) -> Optional[list[int]]:
        starts = pool.starts(host_indices, n)
        if starts is None:
            log.warning("lifeboat: %s: %d keys but host_indices do not hold %d pages of %d slots",
                        what, n, n, pool.page_size)
        return starts

    def _affinity(self, keys: Sequence[str], extra_info: Optional[HiCacheStorageExtraInfo]) -> Optional[int]:
        return dialog_affinity(keys, getattr(extra_info, "prefix_keys", None), self.affinity_chunks)

    # ------------------------------------------------------------------ observability, lifecycle
    def _record(self, kind: str, t0: float, pages: int, page_bytes: int) -> None:
        dt = time.perf_counter() - t0
        with self._metrics_lock:
            self._metrics[f"{kind}_pgs"].append(pages)
            self._metrics[f"{kind}_bandwidth"].append(pages * page_bytes / dt / 1e9 if dt > 0 else 0.0)

    def _failed(self, what: str, err: Exception) -> None:
        """Count and log (at most once per failure_cooldown_max_s) a call that did nothing."""
        try:
            bad = isinstance(err, BadCall)
            self.store.counters.add("sglang_bad_calls" if bad else "sglang_call_errors")
            self._fail_log.log("", "lifeboat: %s %s (%s: %s); it did nothing. Next report in %.0f s at the "
                               "earliest", what, "called with bad arguments" if bad else "failed",
                               type(err).__name__, str(err)[:300], self._fail_log.interval_s, exc_info=not bad)
        except Exception:  # noqa: BLE001 - reporting must not raise into SGLang either
            pass

    @guarded(lambda *a, **k: None)
    def get_stats(self) -> Any:
        """SGLang's StorageMetrics: pages and GB/s per call since the last scrape."""
        try:
            from sglang.srt.observability.metrics_collector import StorageMetrics

            with self._metrics_lock:
                out = StorageMetrics(**{k: list(v) for k, v in self._metrics.items()})
                for v in self._metrics.values():
                    v.clear()
            return out
        except Exception as e:
            self._failed("get_stats", e)
            return None

    @guarded(lambda *a, **k: None)
    def clear(self) -> None:
        """Not supported: the store may be shared by other ranks, servers and hosts."""
        log.warning("lifeboat: clear is not supported (the store may be shared); "
                    "use `lifeboat gc` or remove the storage directory while no server uses it")

    def close(self, copy_timeout_s: Optional[float] = None) -> None:
        """Flush and close the store (segments sealed, index snapshot saved, the last stats written);
        idempotent. `copy_timeout_s` bounds the wait for queued background copies to lower tiers (at
        process exit: what is still queued then is dropped and counted; acknowledged pages are on tier 0)."""
        if self._closed:
            return
        self._closed = True
        self._at_exit.cancel()  # safe when it is the hook that runs this close
        try:
            if copy_timeout_s is None:
                self.store.flush()
            self.reporter.close()
            self.store.close(copy_timeout_s)
            log.info("lifeboat: store closed")
        except Exception as e:
            log.warning("lifeboat: close failed: %s", e)
