"""Sizing rules of an SGLang launch with LifeboatCache: host pool, staging buffer, ranks per host, and
the backend's identity in SGLang's `dynamic` storage factory. Pure functions, nothing from SGLang or
torch; `rules.py` turns them into a launch plan.

Units: SGLang's `--hicache-size` is a whole number of GB (10**9 bytes) per rank, so every host-pool
result is an `int` in those units. The reserve is SGLang's own host reserve (10 GiB), so what we
choose also passes SGLang's "enough host memory" check at pool allocation.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional

from ...config import ConfigError
from .env import ENV_HOST_GB

GB = 10**9
GIB = 1 << 30

DEFAULT_PAGE_SIZE = 64
DEFAULT_STAGING_TOKENS = 1024
DEFAULT_HOST_FRACTION = 0.10
DEFAULT_HOST_MIN_GB = 2
DEFAULT_HOST_MAX_GB = 16
AUTO_GPU_MULTIPLE = 2
HOST_RESERVE_BYTES = 10 * GIB  # SGLang's HICACHE_HOST_MEMORY_RESERVE_BYTES
SGLANG_STAGING_PAGE_CHUNK = 64  # SGLang 0.5.23 `_WRITE_BACK_STAGING_PAGE_CHUNK` (pages)

# The storage backend LifeboatCache registers through SGLang's `dynamic` factory.
BACKEND_NAME = "lifeboat"
BACKEND_MODULE = "lifeboat_cache.integrations.sglang_backend"
BACKEND_CLASS = "LifeboatHiCacheStorage"
BACKEND_EXTRA_CONFIG: Mapping[str, Any] = {
    "backend_name": BACKEND_NAME,
    "module_path": BACKEND_MODULE,
    "class_name": BACKEND_CLASS,
    "interface_v1": 1,
}


def default_host_pool_gb(available_ram_bytes: int) -> int:
    """Default pool per rank: 10% of available RAM, clamped to 2-16 GB.

    Why a clamp: below 2 GB the pool holds too few pages for prefetches to land; above 16 GB a
    default would claim memory the operator did not offer. Larger pools are opt-in.
    """
    gb = int(max(0, available_ram_bytes) * DEFAULT_HOST_FRACTION // GB)
    return max(DEFAULT_HOST_MIN_GB, min(DEFAULT_HOST_MAX_GB, gb))


def auto_host_budget_gb(available_ram_bytes: int, ranks_per_host: int) -> int:
    """Per-rank share of half the host RAM left after the reserve (whole GB, floor)."""
    ranks = max(1, int(ranks_per_host))
    spare = max(0, available_ram_bytes - HOST_RESERVE_BYTES)
    return int(spare // 2 // ranks // GB)


def auto_host_pool_gb(gpu_memory_bytes: int, available_ram_bytes: int, ranks_per_host: int) -> int:
    """`auto` pool per rank: twice the GPU's memory, within half the RAM left after the reserve.

    Raises ConfigError when that leaves less than 1 GB per rank: SGLang would refuse such a pool
    anyway, and a number is then the only honest setting.
    """
    want = int(AUTO_GPU_MULTIPLE * max(0, gpu_memory_bytes) // GB)
    budget = auto_host_budget_gb(available_ram_bytes, ranks_per_host)
    gb = min(want, budget)
    if gb < 1:
        raise ConfigError(
            f"{ENV_HOST_GB}=auto leaves {gb} GB per rank (GPU {gpu_memory_bytes / GB:.1f} GB, available RAM "
            f"{available_ram_bytes / GB:.1f} GB, {max(1, ranks_per_host)} rank(s) on this host, "
            f"{HOST_RESERVE_BYTES / GIB:.0f} GiB reserve): allowed values are a positive whole number of GB per rank "
            "or 'auto' on a host with room for it"
        )
    return gb


def staging_pages(staging_tokens: int, page_size: int) -> int:
    """Pages in the bounded write-back staging buffer: whole pages within the bound, at least one.

    SGLang allocates `min(64, host pages) * page_size` tokens of all-layer KV for it, so without a
    bound it grows with the page size; the bound never raises SGLang's own 64-page chunk.
    """
    if staging_tokens <= 0 or page_size <= 0:
        raise ValueError("staging_tokens and page_size must be positive")
    return max(1, min(SGLANG_STAGING_PAGE_CHUNK, staging_tokens // page_size))


def ranks_on_host(tp_size: int, pp_size: int, dp_size: int, nnodes: int) -> int:
    """Scheduler ranks on this host (each builds its own host pool), assuming uniform placement."""
    world = max(1, tp_size) * max(1, pp_size) * max(1, dp_size)
    return max(1, world // max(1, nnodes))


def is_lifeboat_extra_config(extra_config: Optional[Mapping[str, Any]]) -> bool:
    """True when a `dynamic` backend's extra config names LifeboatCache's backend."""
    if not isinstance(extra_config, Mapping):
        return False
    return extra_config.get("module_path") == BACKEND_MODULE or extra_config.get("backend_name") == BACKEND_NAME


def backend_extra_config_json() -> str:
    """The `--hicache-storage-backend-extra-config` value the one-variable start uses."""
    return json.dumps(dict(BACKEND_EXTRA_CONFIG), separators=(",", ":"))


#: Share of available RAM SGLang 0.5.23's CPU token pool took with no --max-total-tokens (measured on a
#: 24 GiB host: 1 GB of host pool asked, "-4.57 GB free" left after the 10 GiB reserve).
CPU_TOKEN_POOL_SHARE = 0.7


def cpu_token_pool_warning(available_ram_bytes: int, host_pool_gb: int,
                           max_total_tokens: Optional[int]) -> Optional[str]:
    """One line naming the flags to change when a CPU launch would stop with SGLang's "Not enough host
    memory available": without --max-total-tokens its token pool takes most of the RAM first, then the
    HiCache host pool is checked against what is left less the 10 GiB reserve. None when it fits."""
    if max_total_tokens is not None or available_ram_bytes <= 0 or host_pool_gb <= 0:
        return None
    left = available_ram_bytes * (1 - CPU_TOKEN_POOL_SHARE) - HOST_RESERVE_BYTES
    if left >= host_pool_gb * GB:
        return None
    return (f"a CPU launch without --max-total-tokens: SGLang's token pool takes about "
            f"{CPU_TOKEN_POOL_SHARE:.0%} of the {available_ram_bytes / GB:.1f} GB of available RAM, leaving "
            f"{max(left, 0) / GB:.1f} GB for the {host_pool_gb} GB HiCache host pool after its "
            f"{HOST_RESERVE_BYTES // GIB} GiB reserve, so SGLang will stop with 'Not enough host memory "
            "available'; pass --max-total-tokens (e.g. 16384) or a smaller --hicache-size")

