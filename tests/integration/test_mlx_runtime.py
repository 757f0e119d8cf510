"""runtimes/mlx/ (the package) with real MLX arrays, SGLang's real MlxAttentionKVPool and a real ChunkStore.

What is proven here (fast, in-process, no model):
* keys: chained over all earlier tokens (position-dependent), partitioned by namespace / extra_key /
  cache_salt;
* fingerprint: weights identity is a content hash (another weight file -> another namespace);
* copy out / install: a pool -> record -> pool round trip is bitwise, chunk order included, for
  fp32 / fp16 / bf16, contiguous and scattered slots, and a partial first chunk;
* writer: only read-only numpy views cross to its thread, it stores them from there, and when its
  byte-bounded queue is full it drops and counts instead of blocking; storage errors are counted,
  never raised.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core", reason="MLX is not installed (pip install 'mlx[cpu]')")
pool_mod = pytest.importorskip("sglang.srt.hardware_backend.mlx.kv_cache.attention_kv_pool",
                               reason="SGLang 0.5.23 is not installed")

from lifeboat_cache import ChunkStore  # noqa: E402
from lifeboat_cache.config import settings_from_dict  # noqa: E402
from lifeboat_cache.runtimes import mlx as lbmlx  # noqa: E402
from lifeboat_cache.testing.faults import FaultyTier  # noqa: E402
from lifeboat_cache.tiers.local import LocalTier  # noqa: E402

MlxAttentionKVPool = pool_mod.MlxAttentionKVPool
C = lbmlx.CHUNK_TOKENS


def _settings(path: Path):
    return settings_from_dict({"storage": [{"type": "local", "path": str(path), "capacity": "1GiB",
                                            "segment_size": "8MiB"}],
                               "engine": {"compression": "none", "io_workers": 4,
                                          "failure_cooldown_s": 0.05, "failure_cooldown_max_s": 0.1}})


@pytest.fixture
def store(tmp_path: Path):
    s = ChunkStore.open(_settings(tmp_path / "store"), background=False)
    yield s
    s.close()


def _fp(dtype: str = "float32", layers: int = 3, heads: int = 2, dim: int = 8) -> lbmlx.ModelFingerprint:
    return lbmlx.ModelFingerprint(weights="w", dtype=dtype, num_layers=layers, n_kv_heads=heads, head_dim=dim)


def _pool(dtype, slots: int = 1024, layers: int = 3, heads: int = 2, dim: int = 8, seed: int = 0):
    """A real pool whose every row is distinct random data (so any misplacement is visible)."""
    pool = MlxAttentionKVPool(slots, layers, heads, dim, dtype=dtype)
    key = mx.random.key(seed)
    for i in range(layers):
        k1, k2, key = mx.random.split(key, 3)
        pool.k_buffer[i] = mx.random.normal((slots, heads, dim), key=k1).astype(dtype)
        pool.v_buffer[i] = mx.random.normal((slots, heads, dim), key=k2).astype(dtype)
    mx.eval(*pool.all_buffers())
    return pool


def _rows(pool, slots) -> tuple[np.ndarray, np.ndarray]:
    k, v = pool.get_kv_all_layers(mx.array(np.asarray(slots, dtype=np.int32)))
    if k.dtype == mx.bfloat16:
        k, v = k.view(mx.uint16), v.view(mx.uint16)
    mx.eval(k, v)
    return np.array(k), np.array(v)


# ------------------------------------------------------------------------------------------- keys

def test_chain_keys_depend_on_every_earlier_token_and_position() -> None:
    seed = lbmlx.chain_seed(b"ns" * 8)
    a = list(range(1000, 1000 + 4 * C))
    ka = lbmlx.chunk_keys(seed, a, 4)
    assert len(ka) == 4 and len(set(ka)) == 4
    assert lbmlx.chunk_keys(seed, a + [7, 8, 9], 4) == ka  # a partial tail chunk is not keyed
    b = list(a)
    b[5] += 1  # one token of chunk 0 differs: every later key differs
    assert all(x != y for x, y in zip(lbmlx.chunk_keys(seed, b, 4), ka))
    c = list(a)
    c[2 * C] += 1  # chunk 2 differs: chunks 0, 1 are shared, 2, 3 are not
    kc = lbmlx.chunk_keys(seed, c, 4)
    assert kc[:2] == ka[:2] and kc[2] != ka[2] and kc[3] != ka[3]
    shifted = a[C:] + a[:C]  # the same chunk contents at other positions
    assert not set(lbmlx.chunk_keys(seed, shifted, 4)) & set(ka)
    # resuming a chain gives the same keys as computing it whole
    assert lbmlx.chunk_keys(seed, a, 4, start=2, prev=ka[1]) == ka[2:]


def test_chain_seed_partitions_namespace_extra_key_and_salt() -> None:
    ns1, ns2 = b"a" * 16, b"b" * 16
    seeds = {lbmlx.chain_seed(ns1), lbmlx.chain_seed(ns2), lbmlx.chain_seed(ns1, "lora-1"),
             lbmlx.chain_seed(ns1, None, "salt"), lbmlx.chain_seed(ns1, "salt", None)}
    assert len(seeds) == 5


def test_fingerprint_is_a_content_hash_and_names_the_geometry(tmp_path: Path) -> None:
    d1, d2 = tmp_path / "m1", tmp_path / "m2"
    for d, byte in ((d1, b"\x01"), (d2, b"\x02")):
        d.mkdir()
        (d / "config.json").write_text('{"model_type": "llama"}')
        (d / "model.safetensors").write_bytes(b"\x00" * 1000 + byte)
    memo = tmp_path / "memo"
    w1 = lbmlx.weights_identity(d1, memo)
    assert w1 == lbmlx.weights_identity(d1, memo) == lbmlx.weights_identity(d1, None)
    assert w1 != lbmlx.weights_identity(d2, memo)
    assert (memo / "weights-fingerprints.json").is_file()
    base = _fp()
    variants = [base, _fp("bfloat16"), _fp(layers=4), _fp(heads=4), _fp(dim=16),
                lbmlx.ModelFingerprint("other", "float32", 3, 2, 8),
                lbmlx.ModelFingerprint("w", "float32", 3, 2, 8, key_namespace="tenant-a")]
    assert len({v.namespace() for v in variants}) == len(variants)
    assert base.namespace() != base.state_namespace()


# ---------------------------------------------------------------------------------- copy / install

@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("scattered", [False, True], ids=["contiguous", "scattered"])
def test_pool_record_pool_round_trip_is_bitwise_in_order(dtype, scattered: bool) -> None:
    src = _pool(dtype, seed=1)
    rng = np.random.default_rng(0)
    n = 3
    src_slots = (rng.permutation(np.arange(1, 1024))[: n * C] if scattered else np.arange(100, 100 + n * C))
    kv = lbmlx.gather_chunks(src, src_slots)
    view = lbmlx.numpy_view(kv)
    assert view.shape == (n, 3, 2, C, 2, 8) and not view.flags.writeable
    assert view.dtype == (np.uint16 if dtype == mx.bfloat16 else np.dtype(str(dtype).rsplit(".", 1)[-1]))
    dst = _pool(dtype, seed=2)
    dst_slots = (rng.permutation(np.arange(1, 1024))[: n * C] if scattered else np.arange(500, 500 + n * C))
    lbmlx.install_chunks(dst, dst_slots, np.array(view))
    sk, sv = _rows(src, src_slots)
    dk, dv = _rows(dst, dst_slots)
    assert np.array_equal(sk.view(np.uint8), dk.view(np.uint8)) and np.array_equal(sv.view(np.uint8), dv.view(np.uint8))
    # chunk order is part of the record layout: chunk i of the record is tokens [64i, 64i+64)
    assert np.array_equal(view[1, :, 0].transpose(1, 0, 2, 3), sk[:, C:2 * C].transpose(1, 0, 2, 3))


def test_install_skips_rows_the_tree_already_holds() -> None:
    src, dst = _pool(mx.float32, seed=3), _pool(mx.float32, seed=4)
    chunks = np.array(lbmlx.numpy_view(lbmlx.gather_chunks(src, np.arange(1, 1 + 2 * C))))
    before = _rows(dst, np.arange(600, 600 + 2 * C))
    lbmlx.install_chunks(dst, np.arange(600 + 40, 600 + 2 * C), chunks, skip=40)
    after = _rows(dst, np.arange(600, 600 + 2 * C))
    want = _rows(src, np.arange(1, 1 + 2 * C))
    assert np.array_equal(after[0][:, :40], before[0][:, :40])  # untouched
    assert np.array_equal(after[0][:, 40:], want[0][:, 40:]) and np.array_equal(after[1][:, 40:], want[1][:, 40:])


def test_install_refuses_a_dtype_mismatch() -> None:
    chunks = np.zeros((1, 3, 2, C, 2, 8), np.float16)
    with pytest.raises(ValueError, match="dtype"):
        lbmlx.install_chunks(_pool(mx.float32), np.arange(1, 1 + C), chunks)


# ------------------------------------------------------------------------------------------ writer

def test_writer_thread_receives_numpy_views_and_stores_them(store) -> None:
    fp = _fp()
    eng = lbmlx.MlxChunkEngine(store, fp, queue_bytes=64 << 20, owns_store=False)
    seen: list[tuple[str, list[type], list[bool]]] = []
    real_put = store.put

    def observing_put(ns, keys, buffers, **kw):  # records what crosses the thread boundary
        seen.append((threading.current_thread().name, [type(b) for b in buffers],
                     [b.flags.writeable for b in buffers]))
        return real_put(ns, keys, buffers, **kw)

    store.put = observing_put
    pool = _pool(mx.float32, seed=5)
    tokens = list(range(3 * C))
    keys = eng.keys(eng.seed(), tokens, 3)
    slots = [np.arange(1 + i * C, 1 + (i + 1) * C) for i in range(3)]
    assert eng.missing(keys) == [0, 1, 2]
    assert eng.capture(pool, slots, keys) == 3
    assert eng.writer.flush(10)
    assert seen and seen[0][0] == "lifeboat-mlx-writer"
    assert set(seen[0][1]) == {np.ndarray} and not any(seen[0][2])
    assert eng.missing(keys) == []  # stored: a second finish of the same prompt copies nothing
    read = eng.read(keys, 0)
    assert read.n_ok == 3
    assert np.array_equal(read.buf, np.array(lbmlx.numpy_view(lbmlx.gather_chunks(pool, np.concatenate(slots)))))
    eng.close()


def test_writer_queue_full_drops_and_counts_without_blocking(tmp_path: Path) -> None:
    settings = _settings(tmp_path / "slow")
    tier = FaultyTier(LocalTier(settings.storage[0]).open(background=False))
    tier.delay_s = 0.5  # a slow disk: the writer thread is stuck in its first write
    store = ChunkStore(settings, [tier])
    fp = _fp()
    w = lbmlx.ChunkWriter(store, max_bytes=3 * fp.chunk_bytes)
    chunks = [np.full(fp.chunk_shape, i, np.float32) for i in range(10)]
    keys = [bytes([i]) * 32 for i in range(10)]
    t0 = time.perf_counter()
    first = w.offer(b"n" * 16, keys[:2], chunks[:2])
    second = w.offer(b"n" * 16, keys[2:], chunks[2:])  # room for one more: 7 dropped
    elapsed = time.perf_counter() - t0
    assert (first, second) == (2, 1)
    assert elapsed < 0.1, f"offer blocked for {elapsed:.3f}s"
    assert store.counters.get("mlx_chunks_dropped_queue_full") == 7
    assert w.flush(20)
    assert store.counters.get("mlx_chunks_written") == 3
    w.close()
    store.close()


def test_storage_errors_are_counted_not_raised(tmp_path: Path) -> None:
    settings = _settings(tmp_path / "bad")
    tier = FaultyTier(LocalTier(settings.storage[0]).open(background=False))
    tier.down()
    store = ChunkStore(settings, [tier])
    fp = _fp()
    eng = lbmlx.MlxChunkEngine(store, fp, queue_bytes=16 << 20)
    pool = _pool(mx.float32, seed=6)
    keys = eng.keys(eng.seed(), list(range(2 * C)), 2)
    assert eng.capture(pool, [np.arange(1, 1 + C), np.arange(1 + C, 1 + 2 * C)], keys) == 2
    assert eng.flush(10)
    c = store.counters.snapshot()
    assert c.get("mlx_chunks_write_failed", 0) + c.get("writes_dropped_cooldown", 0) >= 1
    assert eng.stored_run(keys) == 0
    assert eng.read(keys, 0).n_ok == 0  # a failing tier is a miss
    eng.close()


def test_prefetch_is_used_only_for_the_same_chain(store) -> None:
    fp = _fp()
    eng = lbmlx.MlxChunkEngine(store, fp, queue_bytes=64 << 20, owns_store=False)
    pool = _pool(mx.float32, seed=7)
    a = eng.keys(eng.seed(), list(range(3 * C)), 3)
    b = eng.keys(eng.seed(), list(range(1, 3 * C + 1)), 3)
    eng.capture(pool, [np.arange(1 + i * C, 1 + (i + 1) * C) for i in range(3)], a)
    eng.flush(10)
    assert eng.prefetch("r1", a[-1], a, 0)
    assert eng.take_prefetch("r1", b, 0) is None  # another prompt under the same request id
    assert eng.prefetch("r1", a[-1], a, 0)
    got = eng.take_prefetch("r1", a, 1)  # the tree grew by a chunk meanwhile: still usable
    assert got is not None and got.first == 0 and got.n_ok == 3
    assert eng.take_prefetch("r1", a, 0) is None  # taken once
    eng.close()


def test_request_cache_copy_equals_pool_copy() -> None:
    """Chunks copied from a request's own caches are the bytes SGLang syncs into its pool rows."""
    from sglang.srt.hardware_backend.mlx.kv_cache import ContiguousAttentionKVCache

    layers, heads, dim, n = 3, 2, 8, 4
    caches = []
    pool = _pool(mx.float32, seed=9)
    slots = mx.array(np.arange(300, 300 + n * C, dtype=np.int32))
    ks, vs = [], []
    for layer in range(layers):
        c = ContiguousAttentionKVCache(max_seq_len=512)
        k = mx.random.normal((1, heads, n * C, dim), key=mx.random.key(layer))
        v = mx.random.normal((1, heads, n * C, dim), key=mx.random.key(100 + layer))
        c.update_and_fetch(k, v)
        caches.append(c)
        ks.append(k[0].transpose(1, 0, 2))  # the runner's _sync_new_kv_to_pool layout
        vs.append(v[0].transpose(1, 0, 2))
    pool.set_kv_all_layers(slots, mx.stack(ks), mx.stack(vs))
    want = np.array(lbmlx.numpy_view(lbmlx.gather_chunks(pool, np.array(slots)[np.r_[0:C, 2 * C:4 * C]])))
    got = np.array(lbmlx.numpy_view(lbmlx.gather_request_chunks(caches, [0, 2, 3])))
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


# ------------------------------------------------------------------- pool-layout read + prompt tail

@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16], ids=["fp32", "bf16"])
def test_read_in_pool_layout_with_tail_installs_bitwise(store, dtype) -> None:
    """Chunks and a prompt tail read straight into pool-row layout, installed with ``install_rows``
    (contiguous and scattered slots, skipping rows the tree holds): bitwise the source rows."""
    name = str(dtype).rsplit(".", 1)[-1]
    fp = _fp(name)
    eng = lbmlx.MlxChunkEngine(store, fp, queue_bytes=64 << 20, owns_store=False)
    src = _pool(dtype, seed=11)
    tokens = list(range(7, 7 + 3 * C + 30))
    stop = len(tokens) - 1  # what SGLang matches: 3 chunks + a 29-token tail
    keys = eng.keys(eng.seed(), tokens, 3)
    src_slots = np.arange(200, 200 + stop)
    assert eng.capture(src, [src_slots[i * C:(i + 1) * C] for i in range(3)], keys) == 3
    tail = eng.tail_of(keys, tokens, stop)
    assert tail is not None and tail[1] == 29
    tail_kv = lbmlx.gather_chunks(src, src_slots[3 * C:], tail[1])[0]
    assert eng.capture_tail(tail_kv, tail[0]) == 1
    assert eng.writer.flush(10)
    assert eng.has_tail(tail[0]) and not eng.has_tail(eng.tail_of(keys, tokens, stop - 1)[0])
    read = eng.read(keys, 0, tail=tail)
    assert read.n_ok == 3 and read.tail == 29 and read.tail_key == tail[0]
    # the record-layout view still matches what was captured
    assert np.array_equal(read.buf, np.array(lbmlx.numpy_view(lbmlx.gather_chunks(src, src_slots[:3 * C]))))
    want = _rows(src, src_slots)
    rng = np.random.default_rng(3)
    layout = lbmlx.prepare_pool(_pool(dtype, seed=12))
    assert layout.numpy_writes  # on Linux CPU the numpy path is the one taken; the MLX path is checked too
    for dst_slots, skip in ((np.arange(600, 600 + stop), 0), (rng.permutation(np.arange(1, 1000))[:stop - 40], 40)):
        for how in (None, layout):
            dst = _pool(dtype, seed=12)
            others = np.setdiff1d(np.arange(1, 1024), dst_slots)
            before = _rows(dst, others)
            lbmlx.install_rows(dst, dst_slots, read.rows[:, :, :stop], skip, how)
            got = _rows(dst, dst_slots)
            assert all(np.array_equal(g.view(np.uint8), w[:, skip:].view(np.uint8)) for g, w in zip(got, want))
            assert all(np.array_equal(a.view(np.uint8), b.view(np.uint8)) for a, b in zip(_rows(dst, others), before))
    # a tail is read only after every chunk before it verified
    missing = eng.read([keys[0], b"\x01" * 32, keys[2]], 0, tail=tail)
    assert missing.n_ok == 1 and missing.tail == 0
    eng.close()


def test_engine_install_reuses_its_staging_rows_and_the_pool_stays_sglangs(store) -> None:
    """``MlxChunkEngine.install`` writes through numpy views of the pool (``prepare_pool``), gives the
    staging rows back for the next read (same memory, no fresh allocation), and leaves a pool that
    SGLang's own ``set_kv`` still updates correctly afterwards, without disturbing installed rows."""
    fp = _fp()
    eng = lbmlx.MlxChunkEngine(store, fp, queue_bytes=64 << 20, owns_store=False)
    src = _pool(mx.float32, seed=21)
    keys = eng.keys(eng.seed(), list(range(4 * C)), 4)
    assert eng.capture(src, [np.arange(1 + i * C, 1 + (i + 1) * C) for i in range(4)], keys) == 4
    assert eng.writer.flush(10)
    want = _rows(src, np.arange(1, 1 + 4 * C))
    dst = _pool(mx.float32, seed=22)
    layout = eng.prepare_pool(dst)
    assert layout.numpy_writes and eng.prepare_pool(dst) is layout  # learned once per pool
    bases = []
    for rep, first in enumerate((0, 1)):
        read = eng.read(keys[first:], first)
        assert read.n_ok == 4 - first
        bases.append(read.rows.base)
        slots = np.arange(300 + rep * 400, 300 + rep * 400 + (4 - first) * C)
        eng.install(dst, slots, read, 4, 0)
        assert read.rows.size == 0  # the staging rows went back; nothing can read them through `read`
        got = _rows(dst, slots)
        assert all(np.array_equal(g, w[:, first * C:]) for g, w in zip(got, want))
    assert bases[0] is not None and bases[1] is bases[0]  # the second read reused the first one's buffer
    assert eng.buffers.idle_bytes() == bases[0].nbytes
    # SGLang writes on: its own scatter into other slots, evaluated; the installed rows are intact
    new = mx.random.normal((C, 2, 8), key=mx.random.key(9))
    for layer in range(3):
        dst.set_kv(layer, mx.arange(900, 900 + C), new, new)
    mx.eval(*dst.all_buffers())
    assert np.array_equal(_rows(dst, np.arange(900, 900 + C))[0][1], np.array(new))
    assert all(np.array_equal(g, w) for g, w in zip(_rows(dst, np.arange(300, 300 + 4 * C)), want))
    eng.close()


def test_row_buffers_reuse_and_bound_what_they_keep() -> None:
    fp = _fp()
    rb = lbmlx.RowBuffers(fp, max_idle_bytes=fp.chunk_bytes * 16, round_rows=2 * C)
    a = rb.take(C + 5)
    assert a.shape == (3, 2, C + 5, 2, 8) and a.base.shape[2] == 2 * C
    rb.give(a)
    rb.give(a)  # twice: ignored
    rb.give(np.empty_like(a))  # not ours: ignored
    assert rb.idle_bytes() == a.base.nbytes
    b = rb.take(2 * C)
    assert b.base is a.base and rb.idle_bytes() == 0
    big = rb.take(40 * C)  # larger than what may stay idle: given back, it is let go
    rb.give(b)
    rb.give(big)
    assert rb.idle_bytes() == b.base.nbytes


def test_install_rows_refuses_a_dtype_or_geometry_mismatch() -> None:
    with pytest.raises(ValueError, match="dtype"):
        lbmlx.install_rows(_pool(mx.float32), np.arange(1, 1 + C), np.zeros((3, 2, C, 2, 8), np.float16))
    with pytest.raises(ValueError, match="fit the pool"):
        lbmlx.install_rows(_pool(mx.float32), np.arange(1, 1 + C), np.zeros((3, 2, C, 4, 8), np.float32))
