"""SGLang plugin entry point (`sglang.srt.plugins` group, name `lifeboat`): launch tuning for LifeboatCache.

SGLang's `load_plugins()` calls `register()` in every process it starts (launcher, schedulers,
detokenizer, DP controller) and only logs an exception raised there. So `register()` itself decides
nothing and validates nothing; it installs:

* a resolution hook on the `handle_hicache_ratio_default` step. That step runs for every launch,
  including `--model-path dummy`, before the dummy short-circuit and before anything reads the page
  size, the attention backend or the HiCache settings. The hook reads the launch through
  `resolving_view`, asks `launch.plan_launch_tuning` what to change, declares it with
  `declare_resolution` (the raw flags stay as typed, later SGLang steps see our values exactly as
  if they had been typed), logs each decision once, then runs SGLang's own step. An invalid
  `LIFEBOAT_*` value, a bad lifeboat.yaml / extra-config key or an unwritable store directory
  (`launch/preflight.py`) raises there, which stops resolution and so the launch.
* in processes that build KV pools (the scheduler), two `HookRegistry` AROUND hooks that bound
  SGLang's GPU write-back staging buffer (see `_bound_mha_staging`), inert unless the published
  launch uses the LifeboatCache backend.
* in scheduler processes on a host without CUDA, the CPU-server fixes of `launch/cpu.py` (unpinned host
  pools, a torch `transfer_kv_direct`, rope without vllm, extend attention over the new rows only), inert
  unless the launch turns HiCache on
  (with any storage backend, so SGLang's own `file` backend runs on the same CPU server).
* under `SGLANG_USE_MLX=1`, the MLX radix-cache backend `lifeboat`, so `--radix-cache-backend
  lifeboat` works when named; `LIFEBOAT_CACHE=1` additionally picks it for a launch that names none.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
from typing import Any, Callable, Mapping, Optional

from .launch import (
    DEFAULT_STAGING_TOKENS, ENV_ENABLE, SGLANG_STAGING_PAGE_CHUNK, Decision, LaunchFacts, LaunchPlan,
    check_launch_config, is_lifeboat_extra_config, parse_enable, parse_staging_tokens, plan_launch_tuning,
    ranks_on_host, register_cpu_hooks, staging_pages)

logger = logging.getLogger(__name__)

RESOLUTION_STEP = "handle_hicache_ratio_default"
DECLARATION_SOURCE = "lifeboat_cache.launch_tuning"
RADIX_BACKEND_NAME = "lifeboat"
MLX_MODULE = "lifeboat_cache.integrations.radix_cache.factory"
MLX_FACTORY = "create_lifeboat_radix_cache"
MHA_STAGING_TARGET = "sglang.srt.mem_cache.pool_host.mha.prepare_mha_write_back_staging"
MLA_STAGING_TARGET = "sglang.srt.mem_cache.pool_host.mla.MLATokenToKVPoolHost._init_write_back_staging_buffers"
_SCHEDULER_MODULE = "sglang.srt.managers.scheduler"

_registered = False


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


def register() -> None:
    """Install LifeboatCache's hooks into SGLang (idempotent per process)."""
    global _registered
    if _registered:
        return
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook

    register_resolution_hook(RESOLUTION_STEP)(tune_launch)
    _registered = True
    if _mlx_requested():
        _register_mlx_radix_backend()
    else:
        _register_staging_bound()
        if _SCHEDULER_MODULE in sys.modules:
            register_cpu_hooks(published_launch_uses_hicache)


# --------------------------------------------------------------------------------------------
# Resolution hook (runs once per launch, in the process that resolves the server arguments)
# --------------------------------------------------------------------------------------------


def tune_launch(server_args: Any, previous: Callable[[Any], None]) -> None:
    """Wrapper for SGLang's `handle_hicache_ratio_default`: declare LifeboatCache's choices, then chain.

    Raises what `apply_launch_tuning` raises (ConfigError: the launch stops with its message).
    Our declarations come first so that SGLang's step sees an explicit host-pool size (and therefore
    turns its own host-memory-fraction auto-sizing off, as it does for a typed `--hicache-size`).
    """
    apply_launch_tuning(server_args)
    previous(server_args)


def apply_launch_tuning(server_args: Any, env: Optional[Mapping[str, str]] = None) -> LaunchPlan:
    """Plan and declare the launch's LifeboatCache settings; returns the plan (inactive = untouched).

    Raises ConfigError naming the variable or flag and the allowed values for an invalid `LIFEBOAT_*`
    value or a launch LifeboatCache cannot serve; raised in SGLang's resolution, it stops the launch.
    """
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view

    env = os.environ if env is None else env
    cfg = resolving_view(server_args)
    if _mlx_requested():
        return _apply_mlx(server_args, cfg, env)

    extra_config = parse_extra_config(cfg.hicache_storage_backend_extra_config)
    maybe_ours = cfg.hicache_storage_backend == "dynamic" and is_lifeboat_extra_config(extra_config)
    if not maybe_ours and not parse_enable(env):
        return LaunchPlan(active=False)  # not ours: gather nothing, declare nothing, log nothing

    facts = LaunchFacts(
        page_size=cfg.page_size,
        hicache_size=int(cfg.hicache_size or 0),
        hicache_ratio=cfg.hicache_ratio,
        write_policy=cfg.hicache_write_policy,
        write_policy_given=_flag_given(server_args, "hicache_write_policy", "write_through"),
        host_mode=str(cfg.hicache_host_memory_mode),
        host_mode_given=_flag_given(server_args, "hicache_host_memory_mode", "cache"),
        max_total_tokens=cfg.max_total_tokens,
        enable_hierarchical_cache=bool(cfg.enable_hierarchical_cache),
        storage_backend=cfg.hicache_storage_backend,
        extra_config=extra_config,
        disable_radix_cache=bool(cfg.disable_radix_cache),
        cuda_launch=_is_cuda_launch(cfg.device),
        device=cfg.device,
        available_ram_bytes=available_ram_bytes(),
        ranks_per_host=ranks_on_host(cfg.tp_size, cfg.pp_size, cfg.dp_size, cfg.nnodes),
        mem_layout=str(cfg.hicache_mem_layout),
        io_backend=str(cfg.hicache_io_backend),
        prefetch_policy=str(cfg.hicache_storage_prefetch_policy),
        prefetch_policy_given=_flag_given(server_args, "hicache_storage_prefetch_policy", "timeout"),
    )
    plan = plan_launch_tuning(facts, env, gpu_memory_bytes=lambda: gpu_memory_bytes(cfg.base_gpu_id))
    for warning in plan.warnings:
        logger.warning("LifeboatCache: %s", warning)
    if not plan.active:
        return plan
    fields = plan.fields
    # The backend's own configuration, checked before SGLang loads anything (launch/preflight.py).
    declared = fields.get("hicache_storage_backend_extra_config")
    check_launch_config(parse_extra_config(declared) if declared else extra_config, env)
    if fields:
        declare_resolution(server_args, DECLARATION_SOURCE, **fields)
    for message in plan.messages():
        logger.info("LifeboatCache: %s", message)
    return plan


def _flag_given(server_args: Any, name: str, sglang_default: Any) -> bool:
    """Did the launch set `name` itself? A raw value other than SGLang's default was given; the default
    typed on the command line is seen in sys.argv (`launch_server` parses sys.argv[1:])."""
    if getattr(server_args, name, sglang_default) != sglang_default:
        return True
    flag = "--" + name.replace("_", "-")
    return any(a == flag or a.startswith(flag + "=") for a in sys.argv[1:])


def _apply_mlx(server_args: Any, cfg: Any, env: Mapping[str, str]) -> LaunchPlan:
    """MLX launch: no HiCache; with LIFEBOAT_CACHE=1 pick the `lifeboat` radix-cache backend."""
    from sglang.srt.arg_groups.overrides import declare_resolution

    if not parse_enable(env):
        return LaunchPlan(active=False)
    named = cfg.radix_cache_backend
    if named is None:
        decision = Decision(
            "radix-cache backend",
            RADIX_BACKEND_NAME,
            f"{ENV_ENABLE}=1 on an MLX launch; launch named none",
            {"radix_cache_backend": RADIX_BACKEND_NAME},
        )
        declare_resolution(server_args, DECLARATION_SOURCE, **decision.fields)
    elif named == RADIX_BACKEND_NAME:
        decision = Decision("radix-cache backend", named, "the launch named it")
    else:
        logger.warning(
            "LifeboatCache: %s=1 but the launch named --radix-cache-backend %s; LifeboatCache leaves it",
            ENV_ENABLE,
            named,
        )
        return LaunchPlan(active=False)
    logger.info("LifeboatCache: %s", decision.message())
    if cfg.enable_hierarchical_cache or cfg.hicache_storage_backend is not None:
        logger.info("LifeboatCache: HiCache tuning does not apply on MLX (SGLang's MLX runtime has no HiCache)")
    return LaunchPlan(active=True, decisions=(decision,))


# --------------------------------------------------------------------------------------------
# Facts about the launch and the host
# --------------------------------------------------------------------------------------------


def parse_extra_config(value: Any) -> Optional[dict]:
    """Parse `--hicache-storage-backend-extra-config` like SGLang does (JSON, or @file json/yaml/toml).

    Returns None when absent or unreadable: an unreadable config is not recognisably ours, and
    SGLang reports the error itself when it builds the backend.
    """
    if value is None or value == "":
        return None
    if isinstance(value, Mapping):
        return dict(value)
    if not isinstance(value, str):
        return None
    try:
        if value.startswith("@"):
            path = value[1:]
            ext = os.path.splitext(path)[1].lower()
            if ext == ".json":
                with open(path, encoding="utf-8") as f:
                    parsed = json.load(f)
            elif ext == ".toml":
                import tomllib

                with open(path, "rb") as f:
                    parsed = tomllib.load(f)
            elif ext in (".yaml", ".yml"):
                import yaml

                with open(path, encoding="utf-8") as f:
                    parsed = yaml.safe_load(f)
            else:
                return None
        else:
            parsed = json.loads(value)
    except Exception:  # noqa: BLE001 - any unreadable config is "not ours"; SGLang raises its own error
        return None
    return parsed if isinstance(parsed, dict) else None


def available_ram_bytes() -> int:
    """Allocatable host RAM, bounded by the cgroup limit, measured the way SGLang checks host pools."""
    from sglang.srt.mem_cache.host_memory import available_host_memory_bytes

    return int(available_host_memory_bytes(allow_cgroup_fallback=True))


def gpu_memory_bytes(device_index: int = 0) -> Optional[int]:
    """Total memory of the launch's first GPU via torch, or None where no CUDA GPU exists."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        return int(torch.cuda.get_device_properties(device_index).total_memory)
    except Exception:  # noqa: BLE001 - no usable GPU is the same answer as no GPU
        logger.debug("LifeboatCache: cannot read GPU memory", exc_info=True)
        return None


def _is_cuda_launch(device: Optional[str]) -> bool:
    """The launch runs on CUDA: `--device cuda[:n]`, or no device on a CUDA platform."""
    if device is not None:
        return str(device).split(":", 1)[0] == "cuda"
    from sglang.srt.runtime_context import get_platform

    return bool(get_platform().is_cuda)


def _mlx_requested() -> bool:
    """SGLANG_USE_MLX=1, read as SGLang reads it (without SGLang's Metal validation, which may raise)."""
    from sglang.srt.environ import envs

    return bool(envs.SGLANG_USE_MLX.get())


# --------------------------------------------------------------------------------------------
# GPU write-back staging bound (scheduler processes)
# --------------------------------------------------------------------------------------------


def _register_staging_bound() -> None:
    """Register the staging hooks, only in processes that build KV pools.

    `apply_hooks` imports each target's module; the scheduler has imported them already, while the
    launcher, tokenizer and detokenizer have not and must stay untouched.
    """
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    builds_pools = _SCHEDULER_MODULE in sys.modules
    if builds_pools or "sglang.srt.mem_cache.pool_host.mha" in sys.modules:
        HookRegistry.register(MHA_STAGING_TARGET, _bound_mha_staging, HookType.AROUND)
    if builds_pools or "sglang.srt.mem_cache.pool_host.mla" in sys.modules:
        HookRegistry.register(MLA_STAGING_TARGET, _bound_mla_staging, HookType.AROUND)


def staging_bound_pages(page_size: Optional[int]) -> Optional[int]:
    """Staging pages for this process's launch, or None when the launch does not use LifeboatCache."""
    if not page_size or page_size <= 0 or not published_launch_uses_lifeboat():
        return None
    tokens = parse_staging_tokens(os.environ) or DEFAULT_STAGING_TOKENS
    return staging_pages(tokens, int(page_size))


def published_launch_uses_lifeboat() -> bool:
    """The configuration published in this process names the LifeboatCache storage backend."""
    try:
        from sglang.srt.runtime_context import get_memory

        memory = get_memory()
        backend = memory.hicache_storage_backend
        extra = memory.hicache_storage_backend_extra_config
        enabled = memory.enable_hierarchical_cache
    except Exception:  # noqa: BLE001 - nothing published: not a LifeboatCache launch
        return False
    return bool(enabled) and backend == "dynamic" and is_lifeboat_extra_config(parse_extra_config(extra))


def published_launch_uses_hicache() -> bool:
    """The configuration published in this process turns SGLang's hierarchical cache on."""
    try:
        from sglang.srt.runtime_context import get_memory

        return bool(get_memory().enable_hierarchical_cache)
    except Exception:  # noqa: BLE001 - nothing published: no HiCache here
        return False


def _bound_mha_staging(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """AROUND `prepare_mha_write_back_staging`: cap `page_capacity` at the staging bound.

    Both callers go through it: `prepare_hicache_staging` (the buffer reserved before KV sizing,
    i.e. out of activation memory) and the MHA host pool, which re-validates that buffer. The staged
    copy kernel chunks by the buffer's own length (`staging.shape[0] // page_size`), so a smaller
    buffer only means more, smaller chunks.
    """
    bound = staging_bound_pages(kwargs.get("page_size"))
    if bound is not None:
        requested = kwargs.get("page_capacity", SGLANG_STAGING_PAGE_CHUNK)
        kwargs["page_capacity"] = max(1, min(int(requested), bound))
    return original(*args, **kwargs)


def _bound_mla_staging(original: Callable[..., Any], pool: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND `MLATokenToKVPoolHost._init_write_back_staging_buffers`: same bound for MLA pools.

    SGLang sizes that buffer as `min(pool.page_num, 64)` pages; we present a page count no larger
    than the bound for the duration of the call (the method reads `page_num` for nothing else), so
    the smaller buffer is allocated directly rather than allocated large and shrunk.
    """
    bound = staging_bound_pages(getattr(pool, "page_size", None))
    page_num = getattr(pool, "page_num", None)
    if bound is None or page_num is None or page_num <= bound:
        return original(pool, *args, **kwargs)
    pool.page_num = bound
    try:
        return original(pool, *args, **kwargs)
    finally:
        pool.page_num = page_num


# --------------------------------------------------------------------------------------------
# MLX radix-cache backend
# --------------------------------------------------------------------------------------------


def _register_mlx_radix_backend() -> None:
    """Register `--radix-cache-backend lifeboat` on every MLX launch (idempotent).

    Registering only names a choice: the backend is built only when the launch names it (typed, or
    declared by the resolution hook under LIFEBOAT_CACHE=1), so other launches are untouched.
    """
    from sglang.srt.mem_cache.registry import get_radix_cache_factory, register_radix_cache_backend

    if get_radix_cache_factory(RADIX_BACKEND_NAME) is not None:
        return
    try:
        factory = getattr(importlib.import_module(MLX_MODULE), MLX_FACTORY)
    except Exception:  # noqa: BLE001 - a missing or broken MLX shim must not break other plugins
        logger.exception(
            "LifeboatCache: cannot load %s.%s; the radix-cache backend %r is not registered",
            MLX_MODULE,
            MLX_FACTORY,
            RADIX_BACKEND_NAME,
        )
        return
    register_radix_cache_backend(RADIX_BACKEND_NAME, factory)
    logger.debug("LifeboatCache: registered radix-cache backend %r", RADIX_BACKEND_NAME)
