"""SGLang MLX radix-cache backend ``lifeboat`` (``--radix-cache-backend lifeboat``): its factory.

On Apple silicon SGLang runs its MLX backend (``SGLANG_USE_MLX=1``), which has no HiCache. There the
plugin (``integrations/sglang_plugin.py``) registers :func:`create_lifeboat_radix_cache` under the name
``lifeboat`` (this module path and function name are what it registers). The factory checks the launch,
opens the store, fingerprints the model and builds :class:`LifeboatMlxRadixCache` (``cache.py``:
the write, read and hybrid hooks), then applies the scheduler patches (``patches.py``). A launch
the cache cannot serve (radix cache disabled, sliding-window model, no full-attention layers, an
unreadable store) falls back to SGLang's default radix cache, with a warning; a wrong flag or setting
stops the launch with a message naming it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache
from sglang.srt.mem_cache.unified_cache.components import ComponentType

from ...config import ConfigError, Settings, load_settings
from ...ops import StatsReporter
from ...runtimes.mlx import (
    CHUNK_TOKENS, HybridState, MlxChunkEngine, ModelFingerprint, QueueSize, drain_at_exit, mx_dtype_name,
    parse_rebuild_wait, weights_identity, writer_queue_size)
from .cache import LifeboatMlxRadixCache
from .patches import auxiliary_state_component, install_arrival_hook

if TYPE_CHECKING:
    from sglang.srt.mem_cache.registry import TreeCacheBuildContext

__all__ = ["create_lifeboat_radix_cache", "context_tokens", "mlx_settings", "model_fingerprint", "resolve_model_dir",
           "writer_queue"]

log = logging.getLogger(__name__)

EXIT_DRAIN_S = 10.0  # a clean exit writes the queued chunks for at most this long


def mlx_settings(settings: Settings | None = None) -> Settings:
    """LifeboatCache settings for the MLX path: as configured, but chunks are stored uncompressed.

    KV on Apple silicon is read back into unified memory at memory speed; zstd would cost more CPU
    time than the bytes it saves.
    """
    settings = settings or load_settings()
    return replace(settings, engine=replace(settings.engine, compression="none"))


def model_fingerprint(runner: Any, model_path: str, settings: Settings,
                      hybrid: HybridState | None = None) -> ModelFingerprint:
    """Fingerprint of the model SGLang's MLX runner serves (weights, dtype, pool geometry).

    Raises OSError (or the resolver's error) when the weights cannot be read to identify them; the
    factory then falls back to SGLang's default radix cache.
    """
    from ...config import default_cache_dir

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


def context_tokens(ctx: "TreeCacheBuildContext", runner: Any) -> tuple[int | None, str]:
    """The longest request this launch can serve, and where that number came from.

    SGLang caps a request at ``min(context_len, max_total_num_tokens) - 1`` tokens; on MLX the token
    budget is the runner's KV pool (``MlxModelRunner.pool_size`` slots). None when neither is known.
    """
    model_len = getattr(getattr(ctx, "model_config", None), "context_len", None)
    pool = getattr(runner, "pool_size", None)
    known = {name: int(v) for name, v in (("context length", model_len), ("KV pool slots", pool))
             if isinstance(v, int) and not isinstance(v, bool) and v > 0}
    if not known:
        return None, ""
    name = min(known, key=known.__getitem__)
    note = f"the model's {name}" if name == "context length" else f"the KV pool's {known[name]:,} slots"
    if len(known) == 2 and name != "context length":
        note += f", below the model's context length {known['context length']:,}"
    return known[name], note


def writer_queue(ctx: "TreeCacheBuildContext", runner: Any, fp: ModelFingerprint, settings: Settings,
                 hybrid: HybridState | None = None) -> QueueSize:
    """The MLX writer queue's bound for this launch: ``engine.copy_queue_size`` when lifeboat.yaml sets
    it, else one full-context request's KV (plus a hybrid model's state record), floored and capped
    (``runtimes/mlx/queue_size.py``)."""
    tokens, note = context_tokens(ctx, runner)
    eng = settings.engine
    return writer_queue_size(fp.kv_bytes_per_token, tokens,
                             configured=eng.copy_queue_bytes if eng.copy_queue_explicit else None,
                             extra_bytes=hybrid.nbytes if hybrid is not None else 0, context_note=note)


def resolve_model_dir(runner: Any, model_path: str) -> str:
    """The local directory the runner loaded (an HF repo id resolves to its snapshot, offline).

    Raises SGLang's resolver error when an HF repo id is not in the local cache.
    """
    if os.path.isdir(model_path):
        return model_path
    from sglang.srt.hardware_backend.mlx.remote_code_gate import resolve_model_directory

    return str(resolve_model_directory(model_path, revision=getattr(runner, "revision", None)))


def _fallback(ctx: "TreeCacheBuildContext", why: str) -> BasePrefixCache:
    from sglang.srt.mem_cache.registry import default_radix_cache_factory

    log.warning("lifeboat: %s; serving with SGLang's default radix cache (nothing is persisted)", why)
    return default_radix_cache_factory(ctx)


def create_lifeboat_radix_cache(ctx: "TreeCacheBuildContext") -> BasePrefixCache:
    """``--radix-cache-backend lifeboat`` factory (registered by the plugin on MLX launches).

    Raises ValueError for a launch it can never serve (``--enable-hierarchical-cache``, or not SGLang's
    MLX backend) and ConfigError for a bad lifeboat.yaml or ``LIFEBOAT_MLX_REBUILD_WAIT_S``: the launch
    stops with the message. Launches it cannot persist get SGLang's default radix cache instead.
    """
    from ...store import ChunkStore

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
    queue = writer_queue(ctx, runner, fp, settings, hybrid)
    log.info("%s", queue.message)
    if queue.warning:
        log.warning("%s", queue.warning)
    engine = MlxChunkEngine(store, fp, queue_bytes=queue.bytes, idle_read_bytes=queue.idle_read_bytes)
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
