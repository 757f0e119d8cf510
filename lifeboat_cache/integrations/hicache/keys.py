"""Namespaces and dialog marks of SGLang HiCache pages: which pages may be read in place of which.

A page key from SGLang names token content only; the same tokens on another model, pool, dtype, layout
or rank have other bytes. So each registered host pool gets its own namespace, a fingerprint of
everything that shapes its pages: the model, the pool, its geometry, and the ranks that shard it.
Pools of an MLA model are the same on every TP rank (rank 0 writes them) and are keyed without the TP
rank; Mamba state is TP-sharded whatever the attention. Used by `sglang_backend` only.
"""

from __future__ import annotations

import hashlib
from typing import Any, Optional, Sequence

from sglang.srt.mem_cache.hicache_storage import PoolName

from ...records import namespace_fingerprint
from .pages import flat_page_bytes


def pool_namespace(cfg: Any, model_id: str, key_namespace: str, name: str, host: Any) -> tuple[bytes, bool]:
    """(namespace, replicated) of host pool `name` on the rank that `cfg` (a HiCacheStorageConfig) describes.

    replicated: the pool's pages are the same on every TP rank, so the namespace leaves the TP rank out.
    Raises AttributeError when `host` lacks a host pool's `dtype` / `layout` (the backend's guard
    then leaves the pool unregistered).
    """
    replicated = cfg.is_mla_model and name != str(PoolName.MAMBA)  # Mamba state is TP-sharded
    parts: dict[str, Any] = dict(
        model=model_id, key_namespace=key_namespace, pool=name, pool_class=type(host).__name__,
        dtype=str(host.dtype), layout=host.layout, page_size=int(getattr(host, "page_size", 1) or 1),
        page_bytes=flat_page_bytes(host))
    if not replicated:
        parts.update(tp_rank=cfg.tp_rank, tp_size=cfg.tp_size)
    if cfg.pp_size > 1:
        parts.update(pp_rank=cfg.pp_rank, pp_size=cfg.pp_size)
    if cfg.attn_cp_size > 1:
        parts.update(cp_rank=cfg.attn_cp_rank, cp_size=cfg.attn_cp_size)
    if getattr(cfg, "dcp_size", 1) > 1:
        parts.update(dcp_rank=cfg.dcp_rank, dcp_size=cfg.dcp_size, logical_page_size=cfg.logical_page_size)
    return namespace_fingerprint(**parts), replicated


def dialog_affinity(keys: Sequence[str], prefix_keys: Optional[Sequence[str]], n: int) -> Optional[int]:
    """Dialog mark: a hash of the first `n` keys of prefix_keys + keys, or None when SGLang passed no
    prefix keys. Pages with one mark go to one drive, so a returning dialog reads from one place."""
    if prefix_keys is None:
        return None
    mark = list(prefix_keys[:n]) + list(keys[: max(0, n - len(prefix_keys))])
    return int.from_bytes(hashlib.blake2b("/".join(mark).encode(), digest_size=8).digest(), "little")
