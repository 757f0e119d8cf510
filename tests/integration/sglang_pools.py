"""SGLang 0.5.23's own host pools and HiCache controller, built on CPU, for the L3 backend tests.

Nothing of SGLang is stubbed. Device pools are SGLang's `MHATokenToKVPool` / `MLATokenToKVPool` on
`device="cpu"`; host pools are built from their `get_device_pool_infos()` buffer descriptions with
`pin_memory=False`. `CpuHiCache` is SGLang's `HybridCacheController` built through its own
constructor on CPU (a `TokenToKVPoolAllocator` over the device pool, a `HostPoolGroup`, no process
groups: a single rank), which attaches the storage backend itself (StorageBackendFactory, pool
registration, backend threads) and runs its real backup / prefetch threads. What is not SGLang's:
this module plays the scheduler thread's part (allocating host slots for a storage hit and handing
the operation to the prefetch I/O thread), and no device<->host (L1<->L2) transfer is driven.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle
from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig, PoolHitPolicy, PoolName, PoolTransfer
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.pool_host import HostPoolGroup, PoolEntry
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.mem_cache.storage import StorageBackendFactory
from sglang.srt.mem_cache.utils import get_storage_hash_str
from sglang.srt.runtime_context import get_parallel

LAYOUTS = ("layer_first", "page_first", "page_first_direct")
BACKEND = {"backend_name": "lifeboat", "module_path": "lifeboat_cache.integrations.sglang_backend",
           "class_name": "LifeboatHiCacheStorage", "interface_v1": 1}
CPU = torch.device("cpu")


def lifeboat_extra(path: Path, **settings: Any) -> dict:
    """The extra-config object of a launch: SGLang's keys plus lifeboat.yaml settings."""
    return {**BACKEND, "storage": [{"type": "local", "path": str(path)}], **settings}


def mha_pools(layout: str, *, page_size: int = 4, layers: int = 4, heads: int = 2, head_dim: int = 16,
              tokens: int = 2048, dtype: torch.dtype = torch.bfloat16) -> tuple[Any, Any]:
    """(device pool, host pool) of an MHA model on CPU."""
    dev = MHATokenToKVPool(size=tokens, page_size=page_size, dtype=dtype, head_num=heads, head_dim=head_dim,
                           layer_num=layers, device="cpu", enable_memory_saver=False)
    host = MHATokenToKVPoolHost(dev.get_device_pool_infos()[0].buffer_info, 2.0, 0, page_size, layout,
                                pin_memory=False, device="cpu", device_capacity_tokens=tokens,
                                start_layer=0, end_layer=layers)
    return dev, host


def mla_pools(layout: str, *, page_size: int = 4, layers: int = 4, kv_lora_rank: int = 32, rope_dim: int = 16,
              tokens: int = 2048, dtype: torch.dtype = torch.bfloat16) -> tuple[Any, Any]:
    """(device pool, host pool) of an MLA model on CPU."""
    dev = MLATokenToKVPool(size=tokens, page_size=page_size, dtype=dtype, kv_lora_rank=kv_lora_rank,
                           qk_rope_head_dim=rope_dim, layer_num=layers, device="cpu", enable_memory_saver=False)
    host = MLATokenToKVPoolHost(dev.get_device_pool_infos()[0].buffer_info, 2.0, 0, page_size, layout,
                                pin_memory=False, device="cpu", device_capacity_tokens=tokens,
                                start_layer=0, end_layer=layers, target_layer_num=layers,
                                override_kv_cache_dim=kv_lora_rank + rope_dim)
    return dev, host


def mamba_host_pool(*, layers: int = 2, slots: int = 32, layout: str = "page_first") -> Any:
    """A Mamba state host pool (fp32 temporal state, bf16 conv state), one state per slot."""
    temporal = torch.zeros(layers, slots, 4, 8, dtype=torch.float32)
    conv = (torch.zeros(layers, slots, 6, 5, dtype=torch.bfloat16),)
    return MambaPoolHost(MambaStateBufferInfo(temporal=temporal, conv=conv), 2.0, 0, device_capacity=slots,
                         pin_memory=False, device="cpu", layout=layout)


def fill_random(host: Any, host_indices: torch.Tensor, seed: int = 0) -> None:
    """Random bits in the given slots of a host pool, for every buffer of the pool."""
    gen = torch.Generator().manual_seed(seed)
    page = host.page_size
    for start in host_indices[::page].tolist():
        flat = host.get_data_page(start, flat=True)
        raw = torch.randint(0, 256, (flat.numel() * flat.element_size(),), dtype=torch.uint8, generator=gen)
        host.set_from_flat_data_page(start, raw.view(flat.dtype))


def flat_pages(host: Any, host_indices: torch.Tensor) -> list[bytes]:
    """Each page's bytes in SGLang's flat page order (what both interfaces store)."""
    out = []
    for start in host_indices[:: host.page_size].tolist():
        flat = host.get_data_page(start, flat=True).contiguous()
        out.append(bytes(flat.view(torch.uint8).numpy()))
    return out


def page_keys(tokens: Any, page_size: int, prior: Optional[str] = None) -> list[str]:
    """SGLang's own storage page keys (SHA-256 chain) for a token list or a RadixKey (whose
    extra_key / cache_salt seed the chain)."""
    return get_storage_hash_str(tokens, prior, page_size=page_size)


def storage_config(*, tp_rank: int = 0, tp_size: int = 1, mla: bool = False, extra: Optional[dict] = None,
                   model: str = "test-model", **kw: Any) -> HiCacheStorageConfig:
    """A HiCacheStorageConfig as SGLang's controller builds it (by keyword)."""
    fields = dict(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                  is_mla_model=mla, enable_storage_metrics=True, is_page_first_layout=False, model_name=model,
                  extra_config=dict(extra or {}))
    fields.update(kw)
    return HiCacheStorageConfig(**fields)


def create_backend(cfg: HiCacheStorageConfig, pools: dict[str, Any]) -> Any:
    """StorageBackendFactory('dynamic') plus SGLang's registration order (anchor, v2 per pool, done)."""
    anchor = pools[PoolName.KV]
    backend = StorageBackendFactory.create_backend("dynamic", cfg, anchor)
    backend.register_mem_pool_host(anchor)
    for name, pool in pools.items():
        backend.register_mem_host_pool_v2(pool, name)
    backend.on_host_pools_registered()
    return backend


class CpuHiCache:
    """SGLang's HybridCacheController with storage attached, driven as the scheduler would."""

    def __init__(self, dev: Any, host: Any, extra: dict, *, tp_rank: int = 0, tp_size: int = 1,
                 mamba: Any = None, model: str = "test-model", storage_backend: str = "dynamic") -> None:
        entries = [PoolEntry(name=PoolName.KV, host_pool=host, device_pool=dev, layer_mapper=lambda i: i,
                             is_primary_index_anchor=True)]
        if mamba is not None:
            entries.append(PoolEntry(name=PoolName.MAMBA, host_pool=mamba, device_pool=None,
                                     layer_mapper=lambda i: i))
        self.host, self.mamba, self.page_size = host, mamba, host.page_size
        self.group = HostPoolGroup(entries)
        allocator = TokenToKVPoolAllocator(size=dev.size, dtype=dev.dtype, device="cpu", kvcache=dev,
                                           need_sort=False)
        with get_parallel().override(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1,
                                     attn_dcp_size=1, attn_dcp_rank=0):
            c = HybridCacheController(
                token_to_kv_pool_allocator=allocator, mem_pool_host=self.group, page_size=host.page_size,
                tp_group=None, load_cache_event=threading.Event(), storage_backend=storage_backend,
                prefetch_threshold=host.page_size, model_name=model,
                storage_backend_extra_config=dict(extra), enable_storage_metrics=True)
        self.ctl = c
        self.backend = c.storage_backend
        self._rid = 0

    def backup(self, tokens: Sequence[int], host_indices: torch.Tensor, *, keys: Optional[list[str]] = None,
               prefix_keys: Optional[list[str]] = None, mamba_slot: Optional[int] = None,
               timeout: float = 120.0) -> int:
        """write_storage through the backup thread; returns the tokens the controller marks done."""
        keys = keys if keys is not None else page_keys(tokens, self.page_size)
        extra_pools = None
        if mamba_slot is not None:
            extra_pools = [PoolTransfer(name=PoolName.MAMBA, host_indices=torch.tensor([mamba_slot]),
                                        keys=[keys[-1]], hit_policy=PoolHitPolicy.TRAILING_PAGES)]
        self.ctl.write_storage(host_indices, list(tokens), hash_value=keys, prefix_keys=prefix_keys,
                               extra_pools=extra_pools)
        return self.ctl.ack_backup_queue.get(timeout=timeout).completed_tokens

    def prefetch(self, tokens: Sequence[int], *, prefix_keys: Optional[list[str]] = None,
                 with_mamba: bool = False, timeout: float = 120.0) -> dict[str, Any]:
        """Hit query, host allocation and transfer through the prefetch threads.

        Returns hit_tokens (after the query), loaded_tokens (last progress ACK), host_indices of the
        loaded pages, pool_hits (sidecar ACK) and the operation.
        """
        self._rid += 1
        extra_pools = None
        if with_mamba:
            extra_pools = [PoolTransfer(name=PoolName.MAMBA, keys=["placeholder"],
                                        hit_policy=PoolHitPolicy.TRAILING_PAGES)]
        handle = CacheRequestHandle(rid=f"r{self._rid}", attempt_id=0)
        self.ctl.prefetch(handle, list(tokens), None, prefix_keys=prefix_keys, extra_pools=extra_pools)
        op = self.ctl.prefetch_hit_queue.get(timeout=timeout)
        out: dict[str, Any] = {"hit_tokens": op.storage_hit_count, "loaded_tokens": 0, "host_indices": None,
                               "pool_hits": None, "operation": op}
        if op.storage_hit_count == 0:
            return out
        op.hash_value = op.hash_value[: op.storage_hit_count // self.page_size]
        op.host_indices = self.host.alloc(len(op.hash_value) * self.page_size)
        for t in op.pool_transfers or []:
            t.host_indices = self.mamba.alloc(1)
        self.ctl.prefetch_buffer.put(op)
        while True:
            ack = self.ctl.ack_prefetch_queue.get(timeout=timeout)
            if ack.completed_tokens is not None:
                out["loaded_tokens"] = ack.completed_tokens
            if ack.pool_hits is not None:
                out["pool_hits"] = ack.pool_hits
            if ack.completed_req:
                break
        out["host_indices"] = op.host_indices[: out["loaded_tokens"]]
        return out

    def close(self) -> None:
        """detach_storage_backend: stops the storage threads and closes the backend."""
        self.ctl.detach_storage_backend()



def _backup_pages(path: str, layout: str, kind: str, tp_rank: str, tp_size: str, pages: str, seed: str, out: str,
                  close: bool) -> None:
    import numpy as np

    dev, host = (mla_pools if kind == "mla" else mha_pools)(layout)
    cache = CpuHiCache(dev, host, lifeboat_extra(Path(path)), tp_rank=int(tp_rank), tp_size=int(tp_size))
    tokens = list(range(int(seed) * 100_000, int(seed) * 100_000 + int(pages) * host.page_size))
    slots = host.alloc(len(tokens))
    fill_random(host, slots, seed=int(seed))
    done = cache.backup(tokens, slots, prefix_keys=[])
    np.save(out, np.frombuffer(b"".join(flat_pages(host, slots)), dtype=np.uint8))
    if close:
        cache.close()
    print(f"backed up {done} tokens", flush=True)


def _child_main() -> None:
    """`python sglang_pools.py DIR LAYOUT {mha,mla} TP_RANK TP_SIZE PAGES SEED OUT [noclose]`: back up PAGES
    random pages through the controller in this process, save their flat bytes to OUT (.npy), exit.
    `noclose`: the backup runs in a multiprocessing spawn child that returns without detaching the
    backend, as SGLang 0.5.23's scheduler process does on a graceful shutdown.

    The restart and cross-rank tests run it as a separate process.
    """
    import multiprocessing
    import sys

    args = sys.argv[1:9]
    if sys.argv[9:10] != ["noclose"]:
        _backup_pages(*args, close=True)
        return
    proc = multiprocessing.get_context("spawn").Process(target=_backup_pages, args=(*args, False))
    proc.start()
    proc.join()
    sys.exit(proc.exitcode)


if __name__ == "__main__":
    _child_main()
