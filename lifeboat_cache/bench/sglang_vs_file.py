"""LifeboatCache vs SGLang's `file` backend, through SGLang 0.5.23's own StorageBackendFactory and
HybridCacheController over one real MHA host pool, per shape x layout x data kind.

Both contenders are attached by the controller's real `attach_storage_backend` (`dynamic` ->
LifeboatHiCacheStorage with its default settings, `file` -> HiCacheFile) and driven through the
controller's own per-batch page functions, as its backup / prefetch threads call them (LifeboatCache:
batch_set_v1 / batch_get_v1 zero copy; `file`: batch_set / batch_get plus SGLang's page copies).
Per rep and contender (the order rotates every rep), in a fresh sibling directory on one disk:
  write   after a pause (`write_pause_ms`, as between a server's bursts of backups): all batches, then
          the backend's close (LifeboatCache seals its segments there);
  burst   the same write again at once, into another directory (a burst's second write);
  cold    reattach on the same directory, page cache dropped and checked (mincore: 0 pages resident),
          read everything back (and compare the bytes);
  warm    read everything again (page cache: the software path).
A `sync` precedes each timed phase, so no dirty backlog of one contender lands on the other, and a
`gc.collect(); gc.freeze()`, so no full collection of the long-lived objects lands inside a phase
(unfrozen again before the next collection and when a case ends, so its pools are freed).
Figures: GB/s of raw page bytes and process CPU seconds per GB, medians over reps with (min, max), and
the per-rep ratio LifeboatCache / file (ratios are of the same rep).
"""

from __future__ import annotations

import gc
import hashlib
import math
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..fsio import WriteCallBound, unreported_free_bytes
from .common import Series, drop_page_cache, log, timed
from .sizes import Sizes, names

SHAPES = {"small": (24, 2, 64), "8b": (32, 8, 128)}  # layers, KV heads, head dim
SHAPE_LABELS = {"small": "small (24 layers, 2 KV heads, 64 dim)", "8b": "8B-like (32 layers, 8 KV heads, 128 dim)"}
PAGE_TOKENS = 64
SIDES = ("lifeboat", "file")
PHASES = ("write", "write_burst", "cold_read", "warm_read")
BACKEND = {"backend_name": "lifeboat", "module_path": "lifeboat_cache.integrations.sglang_backend",
           "class_name": "LifeboatHiCacheStorage", "interface_v1": 1}


def pools(layout: str, layers: int, heads: int, head_dim: int, tokens: int) -> tuple[Any, Any]:
    """(device pool, host pool): SGLang's MHATokenToKVPool on CPU and its MHATokenToKVPoolHost."""
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    dev = MHATokenToKVPool(size=tokens, page_size=PAGE_TOKENS, dtype=torch.bfloat16, head_num=heads,
                           head_dim=head_dim, layer_num=layers, device="cpu", enable_memory_saver=False)
    host = MHATokenToKVPoolHost(dev.get_device_pool_infos()[0].buffer_info, 2.0, 0, PAGE_TOKENS, layout,
                                pin_memory=False, device="cpu", device_capacity_tokens=tokens,
                                start_layer=0, end_layer=layers)
    return dev, host


class Controller:
    """SGLang's HybridCacheController with a storage backend attached by its own attach_storage_backend.

    Its constructor creates CUDA streams, so it is skipped and the attributes it sets are set here
    (as the integration tests do); everything from attach_storage_backend on is SGLang's code.
    """

    def __init__(self, dev: Any, host: Any, backend: str, extra: dict) -> None:
        from sglang.srt.mem_cache.hicache_storage import PoolName
        from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
        from sglang.srt.mem_cache.pool_host import HostPoolGroup, PoolEntry
        from sglang.srt.runtime_context import get_parallel

        group = HostPoolGroup([PoolEntry(name=PoolName.KV, host_pool=host, device_pool=dev,
                                         layer_mapper=lambda i: i, is_primary_index_anchor=True)])
        c = object.__new__(HybridCacheController)
        state = dict(
            mem_pool_host=group, storage_host_pool=host, mem_pool_device=dev, page_size=host.page_size,
            host_memory_mode="cache", enable_storage=False, enable_storage_metrics=True,
            storage_stop_event=threading.Event(), tp_group=None, attn_cp_group=None, attn_tp_group=None,
            pp_group=None, pp_prefetch_command_group=None, pp_prefetch_command_thread=None,
            prefetch_hits_sync_groups=[], prefetch_completion_sync_groups=[],
            pp_prefetch_state_lock=threading.Lock(), pp_prefetch_states={}, pp_prefetch_decisions={},
            extra_host_mem_release_queues={})
        for k, v in state.items():
            setattr(c, k, v)
        with get_parallel().override(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_dcp_size=1, attn_dcp_rank=0):
            c.attach_storage_backend(backend, prefetch_threshold=host.page_size, model_name="bench",
                                     storage_backend_extra_config=dict(extra), host_pools=group.entries)
        self.ctl, self.backend = c, c.storage_backend

    def write(self, keys: list[list[str]], slots: Any) -> None:
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorageExtraInfo

        for b, kb in enumerate(keys):
            prefix = [k for prev in keys[:b] for k in prev]
            ok = self.ctl.page_set_func(kb, slots[: len(kb) * PAGE_TOKENS], HiCacheStorageExtraInfo(prefix_keys=prefix))
            if not ok:
                raise RuntimeError(f"backup batch {b} failed")

    def read(self, keys: list[list[str]], slots: Any) -> None:
        from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorageExtraInfo
        from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import PrefetchOperation

        op = PrefetchOperation(CacheRequestHandle(rid="bench", attempt_id=0), [])
        for b, kb in enumerate(keys):
            got = self.ctl.page_get_func(op, kb, slots[: len(kb) * PAGE_TOKENS],
                                         HiCacheStorageExtraInfo(prefix_keys=None))
            if got != len(kb):
                raise RuntimeError(f"prefetch batch {b} got {got} of {len(kb)} pages")

    def close_backend(self) -> None:
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()

    def detach(self) -> None:
        self.ctl.detach_storage_backend()


def extra_for(side: str, path: Path, sizes: Sizes) -> dict:
    if side == "lifeboat":
        extra: dict[str, Any] = {**BACKEND, "storage": [{"type": sizes.lifeboat_tier, "path": str(path)}]}
        if sizes.compression != "default":
            extra["compression"] = sizes.compression
        return extra
    return {"file_storage_path": str(path)}


def attach(side: str, dev: Any, host: Any, path: Path, sizes: Sizes) -> Controller:
    if side == "file":
        os.environ.pop("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", None)
    ctl = Controller(dev, host, "dynamic" if side == "lifeboat" else "file", extra_for(side, path, sizes))
    if side == "lifeboat":
        ctl.backend.store.wait_rebuilt()
    return ctl


def fill(host: Any, slots: Any, kind: str, realkv: np.ndarray | None, seed: int) -> None:
    """Page content: real SmolLM2 KV (tiled from the stream) or random bits (incompressible bf16)."""
    import torch

    rng = np.random.default_rng(seed)
    for start in slots[:: host.page_size].tolist():
        flat = host.get_data_page(start, flat=True)
        n = flat.numel() * flat.element_size()
        if kind == "real" and realkv is not None:
            reps = -(-n // realkv.nbytes) + 1
            src = np.tile(realkv, reps) if reps > 1 else realkv
            off = int(rng.integers(0, max(1, src.nbytes - n) // 2)) * 2
            raw = np.ascontiguousarray(src[off: off + n])
        else:
            raw = rng.integers(0, 256, n, dtype=np.uint8)
        host.set_from_flat_data_page(start, torch.from_numpy(raw.view(np.int16)).view(flat.dtype))


def page_bytes_of(host: Any, slot: int) -> bytes:
    import torch

    return bytes(host.get_data_page(slot, flat=True).contiguous().view(torch.uint8).numpy())


def _settle() -> None:
    """Before a timed phase: no dirty backlog of the other contender (sync), and no full garbage
    collection of the interpreter's millions of long-lived objects (torch, SGLang) inside the phase.
    What the last freeze kept is collectable again first: frozen objects are never collected, so
    garbage in reference cycles (a case's controllers and what they hold) would outlive its case."""
    os.sync()
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def run_case(root: Path, shape: str, layout: str, kind: str, sizes: Sizes,
             realkv: np.ndarray | None) -> dict[str, Any]:
    """LifeboatCache vs SGLang's `file` on one shape / layout / data kind (ratio: lifeboat / file)."""
    out = compare_case(root, shape, layout, kind, sizes, realkv, SIDES,
                       lambda side, dev, host, path: attach(side, dev, host, path, sizes), tag="",
                       numerator="lifeboat")
    out["shape_label"] = SHAPE_LABELS[shape]
    return out


def compare_case(root: Path, shape: str, layout: str, kind: str, sizes: Sizes, realkv: np.ndarray | None,
                 sides: tuple[str, str], attach_side: Callable[[str, Any, Any, Path], Controller],
                 tag: str, numerator: str) -> dict[str, Any]:
    """Two contenders over one real host pool, reps interleaved with their order rotated: write (with the
    backend's close), cold read (page cache dropped and checked), warm read; GB/s, CPU s/GB and
    `numerator / the other side` per phase. `attach_side(side, dev, host, path)` builds a side's controller;
    `tag` keeps the keys and the fill seed of one caller apart from another's."""
    layers, heads, dim = SHAPES[shape]
    page_bytes = 2 * layers * heads * dim * 2 * PAGE_TOKENS
    n_pages = max(1, (sizes.case_mib << 20) // page_bytes)
    batch = min(sizes.batch_pages, n_pages)
    n_batches = math.ceil(n_pages / batch)
    n_pages = n_batches * batch
    dev, host = pools(layout, layers, heads, dim, 2 * batch * PAGE_TOKENS)
    src, dst = host.alloc(batch * PAGE_TOKENS), host.alloc(batch * PAGE_TOKENS)
    fill(host, src, kind, realkv, seed=hash((shape, layout, kind) + ((tag,) if tag else ())) & 0xFFFF)
    expect = page_bytes_of(host, int(src[(batch - 1) * PAGE_TOKENS]))
    total = n_pages * page_bytes
    gbs = {(s, p): Series() for s in sides for p in PHASES}
    cpu = {(s, p): Series() for s in sides for p in PHASES}
    ratio = {p: Series() for p in PHASES}
    resident: list[int] = []
    memory: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}  # before each write after a pause
    prefix = f"{tag}/" if tag else ""
    for rep in range(sizes.reps):
        order = sides[rep % 2:] + sides[: rep % 2]
        keys = [[hashlib.sha256(f"{prefix}{shape}/{layout}/{kind}/{rep}/{b}/{i}".encode()).hexdigest()
                 for i in range(batch)] for b in range(n_batches)]
        this: dict[tuple[str, str], float] = {}
        for side in order:
            path = root / f"{shape}-{layout}-{kind}-r{rep}" / side
            path.mkdir(parents=True)
            ctl = attach_side(side, dev, host, path)
            _settle()
            time.sleep(sizes.write_pause_ms / 1000)  # between bursts: the kernel's state after idling
            free = unreported_free_bytes()  # which reps could meet host faults (fsio.WriteCallBound says why)
            memory[side].append({"unreported_free_gib": None if free is None else round(free / 2**30, 3),
                                 "call_kib": WriteCallBound()() >> 10})  # what LifeboatCache's store would use
            w, _ = timed(lambda: (ctl.write(keys, src), ctl.close_backend()))
            ctl.detach()
            burst_path = path.parent / f"{side}-burst"
            burst_path.mkdir()
            ctl = attach_side(side, dev, host, burst_path)
            wb, _ = timed(lambda: (ctl.write(keys, src), ctl.close_backend()))  # right after the first
            ctl.detach()
            shutil.rmtree(burst_path)
            left = drop_page_cache(path)
            resident.append(left)
            if left:
                log.warning("%s: %d pages still resident before the cold read", path, left)
            ctl = attach_side(side, dev, host, path)
            _settle()
            c, _ = timed(lambda: ctl.read(keys, dst))
            if page_bytes_of(host, int(dst[(batch - 1) * PAGE_TOKENS])) != expect:
                raise RuntimeError(f"{side}: the bytes read back differ from the bytes written")
            r, _ = timed(lambda: ctl.read(keys, dst))
            ctl.detach()
            for phase, ph in zip(PHASES, (w, wb, c, r)):
                this[(side, phase)] = total / ph.wall_s / 1e9
                gbs[(side, phase)].add(this[(side, phase)])
                cpu[(side, phase)].add(ph.cpu_s / (total / 1e9))
            shutil.rmtree(path)
        other = sides[1] if numerator == sides[0] else sides[0]
        for p in PHASES:
            ratio[p].add(this[(numerator, p)] / this[(other, p)])
    gc.unfreeze()  # this case's pools and controllers become collectable once it returns
    return {
        "shape": shape, "layout": layout, "kind": kind,
        "page_bytes": page_bytes, "pages": n_pages, "batch_pages": batch, "reps": sizes.reps,
        "resident_pages_before_cold_read": resident,
        "free_memory_before_write": memory,
        "gb_s": {s: {p: gbs[(s, p)].summary() for p in PHASES} for s in sides},
        "cpu_s_per_gb": {s: {p: cpu[(s, p)].summary() for p in PHASES} for s in sides},
        "ratio": {p: ratio[p].summary() for p in PHASES},
    }


def run(work: Path, sizes: Sizes, realkv: np.ndarray | None) -> dict[str, Any]:
    from .common import pin_torch_threads

    threads = pin_torch_threads(sizes.torch_threads)
    cases = []
    for shape in names(sizes.shapes):
        for layout in names(sizes.layouts):
            for kind in names(sizes.kinds):
                log.info("sglang vs file: %s %s %s", shape, layout, kind)
                cases.append(run_case(work / "sglang", shape, layout, kind, sizes, realkv))
    return {"torch_threads": threads, "page_tokens": PAGE_TOKENS, "write_pause_ms": sizes.write_pause_ms,
            "lifeboat_compression": sizes.compression, "lifeboat_tier": sizes.lifeboat_tier,
            "real_kv": realkv is not None, "cases": cases}
