"""`--radix-cache-backend lifeboat` for SGLang's MLX runtime (imports torch and SGLang: load on demand).

The plugin (integrations/sglang_plugin.py) registers `create_lifeboat_radix_cache` by this folder's
name under `SGLANG_USE_MLX=1` and `LIFEBOAT_CACHE=1`.

  factory.py  the registered factory: settings, model fingerprint, writer queue, store, engine, the cache
  cache.py    LifeboatMlxRadixCache: a short prefix match extended with the chunks the store holds
  capture.py  ChunkCapture: a finished request's chunks, tail and state, to the background writer
  patches.py  SGLang scheduler arrival hook, MlxAuxiliaryStateComponent fix
"""

from __future__ import annotations

from .cache import HYBRID_CONCURRENCY_MESSAGE, LifeboatMlxRadixCache
from .factory import context_tokens, create_lifeboat_radix_cache

__all__ = ["HYBRID_CONCURRENCY_MESSAGE", "LifeboatMlxRadixCache", "context_tokens", "create_lifeboat_radix_cache"]
