"""LifeboatHiCacheStorage proven through SGLang 0.5.23's own code, on CPU.

Every backend here is made by SGLang's `StorageBackendFactory` with `"dynamic"`, over SGLang's own
host pools (built from CPU device pools), and most traffic comes from SGLang's
`HybridCacheController` backup / prefetch threads (see sglang_pools.py). Nothing of SGLang, torch
or the store is stubbed; fault tests wrap a real tier in the project's `FaultyTier`.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch

from lifeboat_cache.config import ConfigError
from lifeboat_cache.records.keys import digests
from lifeboat_cache.testing.faults import FaultyTier
from lifeboat_cache.tiers.segments.format import read_table
from lifeboat_cache.tiers.segments.snapshot_file import SNAPSHOT_NAME

sglang_pools = pytest.importorskip("sglang_pools", reason="SGLang 0.5.23 is not installed")
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
)
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.observability.metrics_collector import StorageMetrics  # noqa: E402
from sglang_pools import (  # noqa: E402
    LAYOUTS,
    CpuHiCache,
    create_backend,
    fill_random,
    flat_pages,
    lifeboat_extra,
    mamba_host_pool,
    mha_pools,
    mla_pools,
    page_keys,
    storage_config,
)

POOLS = {"mha": mha_pools, "mla": mla_pools}
CHILD = Path(__file__).with_name("sglang_pools.py")


def _tokens(pages: int, page_size: int = 4, base: int = 0) -> list[int]:
    return list(range(base, base + pages * page_size))


def _backend(tmp_path: Path, host, *, mla: bool = False, tp_rank: int = 0, tp_size: int = 1, **settings):
    cfg = storage_config(mla=mla, tp_rank=tp_rank, tp_size=tp_size, extra=lifeboat_extra(tmp_path, **settings))
    return create_backend(cfg, {PoolName.KV: host})


def _child(tmp_path: Path, layout: str, kind: str, tp_rank: int, tp_size: int, pages: int, seed: int,
           *extra: str):
    out = tmp_path / f"expected-{seed}.npy"
    cmd = [sys.executable, str(CHILD), str(tmp_path / "store"), layout, kind, str(tp_rank), str(tp_size),
           str(pages), str(seed), str(out), *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), out


def _wait_child(proc: subprocess.Popen, out: Path) -> bytes:
    log_text, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, log_text[-3000:]
    return np.load(out).tobytes()


# ------------------------------------------------------------------ backup then prefetch
@pytest.mark.parametrize("kind,layout", [(k, lay) for k in ("mha", "mla") for lay in LAYOUTS] + [("mha", "page_head")])
def test_300_page_backup_then_prefetch(tmp_path, kind, layout):
    """SGLang's controller backs up 300 pages (calls of 128/128/44) and prefetches them back, bit-exact."""
    dev, host = POOLS[kind](layout)
    cache = CpuHiCache(dev, host, lifeboat_extra(tmp_path))
    try:
        assert cache.ctl.page_set_func.__name__ == "_page_set_zero_copy"
        pool = cache.backend.pools["kv"]
        blocks = pool.views(0)  # a page is handed to the store as views of the host pool, no copy
        assert pool.zero_copy and len(blocks) == {"layer_first": 2 * 4 if kind == "mha" else 4}.get(
            layout, 2 if kind == "mha" else 1)
        whole = host.kv_buffer.view(torch.int16).numpy()
        assert all(np.shares_memory(b, whole) for b in blocks)
        tokens = _tokens(300)
        slots = host.alloc(len(tokens))
        fill_random(host, slots, seed=1)
        expected = flat_pages(host, slots)
        assert cache.backup(tokens, slots, prefix_keys=[]) == len(tokens)
        got = cache.prefetch(tokens, prefix_keys=[])
        assert got["hit_tokens"] == got["loaded_tokens"] == len(tokens)
        assert not set(got["host_indices"].tolist()) & set(slots.tolist())  # fresh slots, really read
        assert flat_pages(host, got["host_indices"]) == expected
        stats = cache.backend.get_stats()
        assert isinstance(stats, StorageMetrics)
        assert stats.backup_pgs == [128, 128, 44] and stats.prefetch_pgs == [128, 128, 44]
        assert cache.backend.get_stats().backup_pgs == []  # per scrape, like SGLang's own backends
    finally:
        cache.close()


def test_a_detached_backend_is_freed_and_a_new_one_serves_its_pages(tmp_path):
    """SGLang's runtime detach (detach_storage_backend) closes the backend and drops it, expecting it
    freed: its store, index and views of the host pool. The exit hook used to hold every backend until
    the process ended, so each detach left one behind (the bench held 6 GiB of host pools that way)."""
    import gc

    dev, host = POOLS["mha"]("page_first")
    cache = CpuHiCache(dev, host, lifeboat_extra(tmp_path))
    tokens = _tokens(64)
    slots = host.alloc(len(tokens))
    fill_random(host, slots, seed=3)
    expected = flat_pages(host, slots)
    assert cache.backup(tokens, slots, prefix_keys=[]) == len(tokens)
    gone = weakref.ref(cache.backend)
    cache.close()
    cache.backend = None
    gc.collect()
    assert gone() is None, [type(r).__name__ for r in gc.get_referrers(gone())]
    again = CpuHiCache(dev, host, lifeboat_extra(tmp_path))  # the same store, attached again
    try:
        got = again.prefetch(tokens, prefix_keys=[])
        assert got["loaded_tokens"] == len(tokens)
        assert flat_pages(host, got["host_indices"]) == expected
    finally:
        again.close()


@pytest.mark.parametrize("kind,layout", [(k, lay) for k in ("mha", "mla") for lay in LAYOUTS])
def test_block_plan_matches_sglangs_page_views_for_every_page(tmp_path, kind, layout):
    """The per-pool block plan (slices of the pool's one buffer) gives exactly the blocks SGLang's own
    page view walks to, for every page of the pool: same addresses, sizes and order."""
    dev, host = POOLS[kind](layout, layers=6, page_size=4, tokens=256)
    b = _backend(tmp_path, host, mla=kind == "mla")
    try:
        pool = b.pools["kv"]
        assert pool._plan is not None
        for start in range(0, host.page_num * host.page_size, host.page_size):
            got, want = pool.views(start), pool._walk(start)
            assert [(g.ctypes.data, g.nbytes) for g in got] == [(w.ctypes.data, w.nbytes) for w in want]
    finally:
        b.close()


@pytest.mark.parametrize("compression", ["auto", "zstd"])
def test_layer_first_many_layers_byte_exact_and_readable_by_the_copying_interface(tmp_path, compression):
    """A 24-layer layer_first pool (48 blocks a page): SGLang's controller backs up and prefetches
    bit-exact, raw (the default on a local tier) or compressed, and the copying interface
    (batch_get into SGLang's flat pages) reads the same records."""
    dev, host = mha_pools("layer_first", layers=24, heads=2, head_dim=16, page_size=8, tokens=2048)
    cache = CpuHiCache(dev, host, lifeboat_extra(tmp_path, compression=compression))
    try:
        pool = cache.backend.pools["kv"]
        assert len(pool.views(0)) == 48 and pool._plan is not None
        tokens = _tokens(100, page_size=8)
        slots = host.alloc(len(tokens))
        fill_random(host, slots, seed=7)
        expected = flat_pages(host, slots)
        assert cache.backup(tokens, slots, prefix_keys=[]) == len(tokens)
        got = cache.prefetch(tokens, prefix_keys=[])
        assert got["loaded_tokens"] == len(tokens)
        assert flat_pages(host, got["host_indices"]) == expected
        keys = page_keys(tokens, 8)
        flats = [host.get_dummy_flat_data_page() for _ in keys]
        out = cache.backend.batch_get(keys, flats)
        assert all(t is not None for t in out)
        assert [bytes(f.contiguous().view(torch.uint8).numpy()) for f in flats] == expected
        assert cache.backend.store.tier_compress == [compression == "zstd"]  # auto: a local tier stores raw
    finally:
        cache.close()


def test_partial_hits(tmp_path):
    """Only the leading run of stored pages is a hit; a hole ends the prefix."""
    dev, host = mha_pools("page_first")
    cache = CpuHiCache(dev, host, lifeboat_extra(tmp_path))
    try:
        tokens = _tokens(300)
        keys = page_keys(tokens, 4)
        slots = host.alloc(len(tokens))
        fill_random(host, slots, seed=2)
        expected = flat_pages(host, slots)
        assert cache.backup(tokens[: 200 * 4], slots[: 200 * 4], keys=keys[:200]) == 200 * 4
        got = cache.prefetch(tokens)
        assert got["hit_tokens"] == got["loaded_tokens"] == 200 * 4
        assert flat_pages(host, got["host_indices"]) == expected[:200]
        # pages 250..299 stored too, behind a hole at 200..249: still 200 pages
        assert cache.backup(tokens[250 * 4:], slots[250 * 4:], keys=keys[250:]) == 50 * 4
        assert cache.backend.batch_exists(keys) == 200
        assert cache.prefetch(tokens)["loaded_tokens"] == 200 * 4
    finally:
        cache.close()


# ------------------------------------------------------------------ copy fallback
@pytest.mark.parametrize("layout", LAYOUTS)
def test_copy_fallback_and_zero_copy_read_each_others_pages(tmp_path, monkeypatch, layout):
    """LIFEBOAT_SGLANG_ZERO_COPY=0 makes SGLang use batch_set / batch_get; both store the same bytes."""
    dev, host = mha_pools(layout)
    tokens_a, tokens_b = _tokens(40, base=0), _tokens(40, base=10_000)
    slots = host.alloc(2 * len(tokens_a))
    fill_random(host, slots, seed=3)
    pages = flat_pages(host, slots)
    slots_a, slots_b = slots[: len(tokens_a)], slots[len(tokens_a):]

    zero = CpuHiCache(dev, host, lifeboat_extra(tmp_path))
    assert zero.ctl.page_get_func.__name__ == "_page_get_zero_copy"
    assert zero.backup(tokens_a, slots_a) == len(tokens_a)
    zero.close()

    monkeypatch.setenv("LIFEBOAT_SGLANG_ZERO_COPY", "0")
    copy = CpuHiCache(dev, host, lifeboat_extra(tmp_path))
    try:
        assert copy.backend.store.wait_rebuilt(30)  # the reopened store's index loads in the background
        assert copy.ctl.page_get_func.__name__ == "_generic_page_get"
        got = copy.prefetch(tokens_a)  # written zero-copy, read through batch_get
        assert got["loaded_tokens"] == len(tokens_a) and flat_pages(host, got["host_indices"]) == pages[:40]
        assert copy.backup(tokens_b, slots_b) == len(tokens_b)  # written through batch_set
    finally:
        copy.close()

    monkeypatch.delenv("LIFEBOAT_SGLANG_ZERO_COPY")
    zero = CpuHiCache(dev, host, lifeboat_extra(tmp_path))
    try:
        assert zero.backend.store.wait_rebuilt(30)
        got = zero.prefetch(tokens_b)  # written by batch_set, read zero-copy
        assert got["loaded_tokens"] == len(tokens_b) and flat_pages(host, got["host_indices"]) == pages[40:]
    finally:
        zero.close()


# ------------------------------------------------------------------ restart, ranks
def test_a_scheduler_exiting_without_close_still_closes_the_store(tmp_path):
    """SGLang 0.5.23's scheduler returns on a graceful shutdown without closing its storage backend; the
    store closes itself at that process's exit: every segment sealed (a trailer), the index snapshot
    saved, and the next backend reads every page back."""
    proc, out = _child(tmp_path, "page_first", "mha", 0, 1, 40, 5, "noclose")
    expected = _wait_child(proc, out)
    store = tmp_path / "store"
    segments = sorted(store.glob("*.seg"))
    assert segments and (store / SNAPSHOT_NAME).exists()
    for seg in segments:
        fd = os.open(seg, os.O_RDONLY)
        try:
            assert read_table(fd, os.fstat(fd).st_size) is not None, f"{seg.name} left unsealed"
        finally:
            os.close(fd)
    dev, host = mha_pools("page_first")
    cache = CpuHiCache(dev, host, lifeboat_extra(store))
    try:
        tokens = _tokens(40, base=5 * 100_000)
        _wait_for_hits(cache.backend, page_keys(tokens, 4), 40)
        got = cache.prefetch(tokens)
        assert got["loaded_tokens"] == len(tokens)
        assert b"".join(flat_pages(host, got["host_indices"])) == expected
    finally:
        cache.close()


def test_restart_in_a_new_process_hits(tmp_path):
    """Pages backed up by one process (which then exits) are found and read by a new backend."""
    proc, out = _child(tmp_path, "page_first", "mha", 0, 1, 300, seed=7)
    expected = _wait_child(proc, out)
    dev, host = mha_pools("page_first")
    cache = CpuHiCache(dev, host, lifeboat_extra(tmp_path / "store"))
    try:
        tokens = _tokens(300, base=7 * 100_000)
        keys = page_keys(tokens, 4)
        _wait_for_hits(cache.backend, keys, 30)  # the index rebuild runs in the background
        got = cache.prefetch(tokens)
        assert got["loaded_tokens"] == len(tokens)
        assert b"".join(flat_pages(host, got["host_indices"])) == expected
    finally:
        cache.close()


def _wait_for_hits(backend, keys: list[str], timeout_s: float) -> None:
    """Poll batch_exists until every key is a hit or the timeout passes (the caller asserts after)."""
    deadline = time.monotonic() + timeout_s
    while backend.batch_exists(keys) < len(keys) and time.monotonic() < deadline:
        time.sleep(0.05)


def test_mla_pages_written_by_rank0_are_read_by_rank1(tmp_path):
    """MLA: rank 1 skips the KV backup (SGLang's writer rule) and reads rank 0's pages, written by
    another process into the same store. Its listing refresh is 30 s: the store directory's change
    counter alone makes them visible at once (SGLang takes the minimum hit count over TP ranks)."""
    dev, host = mla_pools("page_first")
    slow_listing = [{"type": "local", "path": str(tmp_path / "store"), "refresh_interval_s": 30}]
    rank1 = CpuHiCache(dev, host, lifeboat_extra(tmp_path / "store", storage=slow_listing), tp_rank=1, tp_size=2)
    try:
        assert rank1.ctl.backup_skip  # SGLang itself: not the MLA storage writer
        tokens = _tokens(300, base=8 * 100_000)
        keys = page_keys(tokens, 4)
        slots = host.alloc(len(tokens))
        assert rank1.backup(tokens, slots) == 0 and rank1.backend.batch_exists(keys) == 0
        proc, out = _child(tmp_path, "page_first", "mla", 0, 2, 300, seed=8)
        expected = _wait_child(proc, out)
        t0 = time.monotonic()
        _wait_for_hits(rank1.backend, keys, 2)
        print(f"rank 1 saw rank 0's {len(keys)} pages {1000 * (time.monotonic() - t0):.0f} ms after it exited")
        assert rank1.backend.batch_exists(keys) == len(keys)
        got = rank1.prefetch(tokens)
        assert got["loaded_tokens"] == len(tokens)
        assert b"".join(flat_pages(host, got["host_indices"])) == expected
    finally:
        rank1.close()


def test_mha_ranks_pp_and_cp_have_their_own_keys(tmp_path):
    """An MHA shard is keyed by its TP rank; PP and CP ranks get their own keys as well."""
    _, host = mha_pools("page_first")
    tokens = _tokens(8)
    keys = page_keys(tokens, 4)
    slots = host.alloc(len(tokens))
    fill_random(host, slots, seed=4)
    writer = _backend(tmp_path, host, tp_rank=0, tp_size=2)
    assert all(writer.batch_set_v1(keys, slots))
    others = [dict(tp_rank=1, tp_size=2), dict(tp_rank=0, tp_size=1),
              dict(tp_rank=0, tp_size=2, pp_rank=1, pp_size=2), dict(tp_rank=0, tp_size=2, attn_cp_size=2)]
    for kw in others:
        cfg = storage_config(extra=lifeboat_extra(tmp_path), **kw)
        other = create_backend(cfg, {PoolName.KV: host})
        assert other.batch_exists(keys) == 0, kw
        other.close()
    same = _backend(tmp_path, host, tp_rank=0, tp_size=2)
    _wait_for_hits(same, keys, 10)  # the index (snapshot first) loads in the background
    assert same.batch_exists(keys) == 8
    writer.close(), same.close()


# ------------------------------------------------------------------ hybrid models (v2)
def test_mamba_state_through_v2_all_or_nothing(tmp_path):
    """Mamba state is written (batch_set_v2, before KV) and restored next to the KV; a prefix whose
    state is missing is not restorable even when all its KV pages are stored."""
    dev, host = mha_pools("page_first")
    mamba = mamba_host_pool()
    cache = CpuHiCache(dev, host, lifeboat_extra(tmp_path), mamba=mamba)
    try:
        tokens = _tokens(150)
        keys = page_keys(tokens, 4)
        slots = host.alloc(len(tokens))
        fill_random(host, slots, seed=5)
        state_slot = int(mamba.alloc(1)[0])
        fill_random(mamba, torch.tensor([state_slot]), seed=6)
        state = flat_pages(mamba, torch.tensor([state_slot]))
        assert cache.backend.pools["mamba"].zero_copy  # state pages are views of the Mamba pool
        assert cache.backup(tokens, slots, keys=keys, mamba_slot=state_slot) == len(tokens)

        got = cache.prefetch(tokens, with_mamba=True)
        assert got["loaded_tokens"] == len(tokens) and got["pool_hits"][PoolName.MAMBA.value] == 1
        restored = got["operation"].pool_transfers[0].host_indices
        assert flat_pages(mamba, restored) == state
        # a shorter prefix: its KV is stored, its state is not -> nothing restorable
        assert cache.prefetch(tokens[: 100 * 4], with_mamba=True)["hit_tokens"] == 0
        assert cache.prefetch(tokens[: 100 * 4])["hit_tokens"] == 100 * 4  # KV-only models still hit
    finally:
        cache.close()


def test_v2_pools_have_own_namespaces_and_policies(tmp_path):
    """SWA (trailing window) and indexer (all pages) pools: each in its own key space, and
    batch_exists_v2 returns only prefixes for which every pool holds what it needs."""
    _, kv = mha_pools("page_first")
    _, swa = mha_pools("page_first", layers=2)
    _, idx = mha_pools("page_first", layers=1, heads=1)
    cfg = storage_config(extra=lifeboat_extra(tmp_path))
    b = create_backend(cfg, {PoolName.KV: kv, PoolName.SWA: swa, PoolName.INDEXER: idx})
    keys = page_keys(_tokens(10), 4)
    slots = kv.alloc(40)

    def put(pool, name, pages):
        sl = torch.cat([slots[p * 4:(p + 1) * 4] for p in pages])
        res = b.batch_set_v2([PoolTransfer(name=name, host_indices=sl, keys=[keys[p] for p in pages])])
        assert all(res[name])

    assert all(b.batch_set_v1(keys, slots))
    put(swa, PoolName.SWA, [3, 4, 8, 9])      # windows of 2 end at pages 5 and 10
    put(idx, PoolName.INDEXER, range(8))      # indexer pages 1..8
    assert b.batch_exists(keys) == 10
    swa_t = PoolTransfer(name=PoolName.SWA, keys=keys[:2], hit_policy=PoolHitPolicy.TRAILING_PAGES)
    idx_t = PoolTransfer(name=PoolName.INDEXER, hit_policy=PoolHitPolicy.ALL_PAGES)
    r = b.batch_exists_v2(keys, [swa_t])
    assert r.restorable_prefix_pages == [5, 10] and r.kv_hit_pages == 10
    r = b.batch_exists_v2(keys, [swa_t, idx_t])
    assert r.restorable_prefix_pages == [5] and r.kv_hit_pages == 5
    assert r.extra_pool_hit_pages[PoolName.INDEXER] == 8
    # the same key in another pool is another record
    assert b.batch_exists_v2(keys, [PoolTransfer(name=PoolName.MAMBA, hit_policy=PoolHitPolicy.TRAILING_PAGES)]
                             ).kv_hit_pages == 0
    # v2 reads restore each pool's pages bit-exactly
    expect = flat_pages(swa, torch.cat([slots[p * 4:(p + 1) * 4] for p in (8, 9)]))
    dst = swa.alloc(8)
    res = b.batch_get_v2([PoolTransfer(name=PoolName.SWA, host_indices=dst, keys=keys[8:10])])
    assert res[PoolName.SWA] == [True, True] and flat_pages(swa, dst) == expect
    b.close()


# ------------------------------------------------------------------ identity, tenants
def test_tenants_and_models_never_share_pages(tmp_path):
    """SGLang's cache_salt / extra_key seed the key chain; model_id and key_namespace the namespace."""
    _, host = mha_pools("page_first")
    tokens = _tokens(16)
    salted = page_keys(RadixKey(tokens, cache_salt="tenant-a"), 4)
    other_salt = page_keys(RadixKey(tokens, cache_salt="tenant-b"), 4)
    lora = page_keys(RadixKey(tokens, extra_key="lora-1"), 4)
    slots = host.alloc(len(tokens))
    b = _backend(tmp_path, host)
    assert all(b.batch_set_v1(salted, slots))
    assert b.batch_exists(salted) == 16
    assert b.batch_exists(other_salt) == 0 and b.batch_exists(lora) == 0
    assert b.batch_exists(page_keys(tokens, 4)) == 0
    for settings in ({"model_id": "another-model"}, {"key_namespace": "deployment-2"}):
        other = _backend(tmp_path, host, **settings)
        assert other.batch_exists(salted) == 0, settings
        other.close()
    b.close()


def test_per_dialog_affinity_keeps_a_dialog_on_one_drive(tmp_path):
    """With prefix_keys (hicache_storage_pass_prefix_keys), all 300 pages of a dialog, backed up in
    calls of 128/128/44, go to the one drive that the dialog's first page chooses."""
    dev, host = mha_pools("page_first")
    drives = [str(tmp_path / "nvme0"), str(tmp_path / "nvme1")]
    cache = CpuHiCache(dev, host, {**lifeboat_extra(tmp_path), "storage": [{"type": "local", "paths": drives}]})
    try:
        tier, ns = cache.backend.store.tiers[0], cache.backend.pools["kv"].ns
        chosen = set()
        for dialog in range(6):
            tokens = _tokens(300, base=dialog * 10_000)
            slots = host.alloc(len(tokens))
            assert cache.backup(tokens, slots, prefix_keys=[]) == len(tokens)
            host.free(slots)
            _, ikeys = digests(ns, page_keys(tokens, 4))
            parts = {tier.locate(int(k)).part for k in ikeys}
            assert len(parts) == 1, f"dialog {dialog} spread over drives {parts}"
            chosen |= parts
        assert chosen == {0, 1}  # both drives used (deterministic: fixed tokens, so fixed keys)
    finally:
        cache.close()


# ------------------------------------------------------------------ settings
def test_settings_from_extra_config_override_the_file(tmp_path, monkeypatch):
    cfg_file = tmp_path / "lifeboat.yaml"
    cfg_file.write_text(f"storage: [{{type: local, path: {tmp_path / 'file'}}}]\n"
                        "engine: {io_workers: 5, trace: false}\nmodel_id: from-file\n")
    monkeypatch.setenv("LIFEBOAT_CONFIG", str(cfg_file))
    _, host = mha_pools("page_first")
    extra = lifeboat_extra(tmp_path / "extra", io_workers=3, trace=True, model_id="glm", key_namespace="team-a",
                           failure_cooldown_s=2.0, failure_cooldown_max_s=8.0, affinity_chunks=2,
                           compression="none", prefetch_threshold=64, tp_lcm_size=None)
    b = create_backend(storage_config(extra=extra), {PoolName.KV: host})
    s = b.store.settings
    assert (s.engine.io_workers, s.engine.failure_cooldown_s, s.engine.failure_cooldown_max_s) == (3, 2.0, 8.0)
    assert s.model_id == "glm" and s.key_namespace == "team-a" and s.engine.compression == "none"
    assert b.trace and b.affinity_chunks == 2 and b.model_id == "glm"
    assert str(b.store.tiers[0].name).endswith(str(tmp_path / "extra"))
    b.close()


@pytest.mark.parametrize("bad", [{"io_workers": 0}, {"compresion": "zstd"}, {"affinity_chunks": 0},
                                 {"failure_cooldown_s": 9, "failure_cooldown_max_s": 1}])
def test_invalid_settings_fail_the_attach(tmp_path, bad):
    """A bad setting is a launch-time error naming the key; SGLang rolls the attach back."""
    dev, host = mha_pools("page_first")
    with pytest.raises(ConfigError, match=next(iter(bad))[:8]):
        create_backend(storage_config(extra=lifeboat_extra(tmp_path, **bad)), {PoolName.KV: host})
    with pytest.raises(ConfigError):
        CpuHiCache(dev, host, lifeboat_extra(tmp_path, **bad))


# ------------------------------------------------------------------ failures, concurrency, trace
def test_failures_are_misses_never_exceptions(tmp_path):
    _, host = mha_pools("page_first")
    keys = page_keys(_tokens(32), 4)
    slots = host.alloc(128)
    cooldown = dict(failure_cooldown_s=0.2, failure_cooldown_max_s=0.4)
    cfg = storage_config(extra=lifeboat_extra(tmp_path, **cooldown))
    unregistered = sglang_pools.StorageBackendFactory.create_backend("dynamic", cfg, host)
    assert unregistered.batch_exists(keys) == 0 and unregistered.batch_get_v1(keys, slots) == [False] * 32
    assert unregistered.batch_exists_v2(keys, []).kv_hit_pages == 0
    unregistered.close()

    b = _backend(tmp_path, host, **cooldown)
    assert b.batch_set_v1(keys, slots[:100]) == [False] * 32  # wrong number of slots
    assert b.batch_get_v2([PoolTransfer(name="nope", host_indices=slots, keys=keys)]) == {"nope": [False] * 32}
    assert b.batch_get(keys, None) == [None] * 32 and b.batch_set(keys, None) is False

    faulty = FaultyTier(b.store.tiers[0])
    b.store.tiers[0] = faulty
    faulty.down()
    assert b.batch_set_v1(keys, slots) == [False] * 32  # dropped writes, no exception
    writes = faulty.calls["write"]
    assert b.batch_set_v1(keys, slots) == [False] * 32 and faulty.calls["write"] == writes  # cooling down
    faulty.up()
    time.sleep(0.25)  # past failure_cooldown_s (0.2 s)
    assert all(b.batch_set_v1(keys, slots))
    faulty.down()
    assert b.batch_get_v1(keys, slots) == [False] * 32  # storage error: a miss
    faulty.up()
    time.sleep(0.25)
    assert all(b.batch_get_v1(keys, slots))
    b.close()
    assert b.batch_get_v1(keys, slots) == [False] * 32  # after close: misses, not exceptions
    b.close()


def test_corrupt_record_is_a_miss(tmp_path):
    _, host = mha_pools("page_first")
    keys = page_keys(_tokens(16), 4)
    slots = host.alloc(64)
    fill_random(host, slots, seed=9)
    b = _backend(tmp_path, host, compression="none")
    assert all(b.batch_set_v1(keys, slots))
    b.store.flush()
    seg = next(tmp_path.glob("*.seg"))
    with open(seg, "r+b") as f:  # flip bytes inside one record's payload
        f.seek(64 + 100)
        f.write(b"\xff" * 8)
    ok = b.batch_get_v1(keys, host.alloc(64))
    assert ok.count(False) == 1
    b.close()


def test_concurrent_calls_from_several_threads(tmp_path):
    """Backup, prefetch and lookups from 6 threads at once; every page comes back intact."""
    _, host = mha_pools("layer_first", tokens=4096)
    b = _backend(tmp_path, host)
    errors: list[BaseException] = []

    def worker(w: int) -> None:
        try:
            tokens = _tokens(64, base=w * 100_000)
            keys = page_keys(tokens, 4)
            with host.lock:
                slots, dst = host.alloc(256), host.alloc(256)
            fill_random(host, slots, seed=w)
            for i in range(0, 64, 16):
                extra = HiCacheStorageExtraInfo(prefix_keys=keys[:i])
                assert all(b.batch_set_v1(keys[i:i + 16], slots[i * 4:(i + 16) * 4], extra))
                assert b.batch_exists(keys) >= i + 16
            assert all(b.batch_get_v1(keys, dst))
            assert flat_pages(host, dst) == flat_pages(host, slots)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    b.close()


def test_trace_logs_one_line_per_call(tmp_path, caplog):
    _, host = mha_pools("page_first")
    keys = page_keys(_tokens(8), 4)
    slots = host.alloc(32)
    b = _backend(tmp_path, host, trace=True)
    with caplog.at_level(logging.INFO, logger="lifeboat_cache"):
        caplog.clear()
        b.batch_set_v1(keys, slots)
        b.batch_exists(keys)
        b.batch_get_v1(keys, slots)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("lifeboat trace:")]
    assert len(lines) == 3 and lines[0].startswith("lifeboat trace: batch_set_v1 8 keys -> 8"), lines
    b.close()


def test_trace_lines_of_v2_and_copying_calls(tmp_path, caplog):
    """The backend's TRACE_LINES (sglang_trace): one line per pool of a v2 call, and the copying interface's calls."""
    _, host = mha_pools("page_first")
    keys = page_keys(_tokens(8), 4)
    slots = host.alloc(32)
    fill_random(host, slots, seed=9)
    pages = [host.get_data_page(int(i), flat=True) for i in slots[::4]]
    b = _backend(tmp_path, host, trace=True)
    with caplog.at_level(logging.INFO, logger="lifeboat_cache"):
        caplog.clear()
        b.batch_set_v2([PoolTransfer(name=PoolName.KV, host_indices=slots, keys=keys)])
        assert b.batch_exists_v2(keys + ["absent"]).kv_hit_pages == 8
        b.batch_get_v2([PoolTransfer(name=PoolName.KV, host_indices=slots[:20], keys=keys[:5])])
        assert b.batch_set(["copied"], [pages[0]]) is True
        b.batch_get(["copied", "absent"], [torch.zeros_like(pages[0]), torch.zeros_like(pages[0])])
        b.batch_exists(keys)  # 8 leading hits
    lines = [r.getMessage().rsplit(" in ", 1)[0] for r in caplog.records
             if r.getMessage().startswith("lifeboat trace:")]
    assert lines == [f"lifeboat trace: batch_set_v2[{PoolName.KV}] 8 keys -> 8",
                     "lifeboat trace: batch_exists_v2 9 keys -> 8",
                     f"lifeboat trace: batch_get_v2[{PoolName.KV}] 5 keys -> 5",
                     "lifeboat trace: batch_set 1 keys -> 1",
                     "lifeboat trace: batch_get 2 keys -> 1",
                     "lifeboat trace: batch_exists 8 keys -> 8"], lines
    b.close()


# ------------------------------------------------------------------ pools whose pages are not views
@pytest.mark.parametrize("pools", [mha_pools, mla_pools], ids=["mha", "mla"])
def test_pages_that_are_not_views_are_refused_zero_copy_and_never_raise(tmp_path, caplog, pools):
    """SGLang's `page_unified` host layout: a page is not a plain view of the pool's own buffers, so
    zero-copy is refused for it (logged, never decoded into). SGLang 0.5.23's copying accessors do not
    support that layout either (`get_data_page` raises), so every call is a counted miss or a dropped
    write, never an exception into SGLang's threads."""
    _, host = pools("page_unified")
    keys = page_keys(_tokens(8, base=70_000), host.page_size)
    slots = host.alloc(8 * host.page_size)
    with caplog.at_level(logging.INFO, logger="lifeboat_cache"):
        b = create_backend(storage_config(extra=lifeboat_extra(tmp_path), mla=pools is mla_pools),
                           {PoolName.KV: host})
    try:
        assert any("pages are not plain views" in r.getMessage() for r in caplog.records)
        assert b.batch_set_v1(keys, slots) == [False] * 8
        assert b.batch_exists(keys) == 0
        assert b.batch_get_v1(keys, slots) == [False] * 8
    finally:
        b.close()
