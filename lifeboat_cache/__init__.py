"""LifeboatCache: KV-cache persistence for SGLang (HiCache L3 on CUDA, prefix cache on MLX)."""

from .config import ConfigError, Settings, load_settings
from .keys import namespace_fingerprint
from .store import ChunkStore

__all__ = ["ChunkStore", "ConfigError", "Settings", "load_settings", "namespace_fingerprint"]
__version__ = "0.1.0"
