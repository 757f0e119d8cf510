"""LifeboatCache: KV-cache persistence for SGLang (HiCache L3 on CUDA, prefix cache on MLX).

Imports are lazy: SGLang loads `lifeboat_cache.integrations.sglang_plugin` in every process of
every launch, so importing the package must stay cheap and must not depend on the store's tiers.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"
__all__ = ["ChunkStore", "ConfigError", "Settings", "load_settings", "namespace_fingerprint"]

_WHERE = {"ChunkStore": ".store", "ConfigError": ".config", "Settings": ".config",
          "load_settings": ".config", "namespace_fingerprint": ".records"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(import_module(_WHERE[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
