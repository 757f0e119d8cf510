"""The MLX writer drains its queue on a clean interpreter exit, within a bounded time, quietly.

Each case is a real Python process: SGLang's real ``MlxAttentionKVPool`` with real MLX arrays, the real
``MlxChunkEngine`` / ``ChunkWriter`` and a ``ChunkStore`` on a local directory. The child queues 16
chunks in 8 two-chunk batches (multi-page ``put`` calls go through the store's io pool, which is what
used to fail at exit) and returns from its main without flushing; ``drain_at_exit`` is all that writes
them. The parent then opens the store and counts what arrived.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("mlx.core", reason="MLX is not installed (pip install 'mlx[cpu]')")
pytest.importorskip("sglang.srt.hardware_backend.mlx.kv_cache.attention_kv_pool",
                    reason="SGLang 0.5.23 is not installed")

from lifeboat_cache import ChunkStore  # noqa: E402
from lifeboat_cache.config import settings_from_dict  # noqa: E402
from lifeboat_cache.demo.mlx_serving import child_env  # noqa: E402
from lifeboat_cache.runtimes import mlx as lbmlx  # noqa: E402

C = lbmlx.CHUNK_TOKENS
FP = dict(weights="w", dtype="float32", num_layers=4, n_kv_heads=4, head_dim=64)  # 512 KiB chunks

CHILD = textwrap.dedent("""
    import logging, sys
    import numpy as np
    import mlx.core as mx
    from sglang.srt.hardware_backend.mlx.kv_cache.attention_kv_pool import MlxAttentionKVPool
    from lifeboat_cache import ChunkStore
    from lifeboat_cache.config import settings_from_dict
    from lifeboat_cache.runtimes import mlx as lbmlx
    from lifeboat_cache.testing.faults import FaultyTier
    from lifeboat_cache.tiers.local import LocalTier

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    path, delay_s, drain_s = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    settings = settings_from_dict({"storage": [{"type": "local", "path": path, "capacity": "1GiB",
                                                "segment_size": "64MiB"}],
                                   "engine": {"compression": "none", "io_workers": 4}})
    if delay_s:
        tier = FaultyTier(LocalTier(settings.storage[0]).open(background=False))
        tier.delay_s = delay_s  # a slow disk: the drain cannot finish in time
        store = ChunkStore(settings, [tier])
    else:
        store = ChunkStore.open(settings, background=False)
    fp = lbmlx.ModelFingerprint(**FP_ARGS)
    eng = lbmlx.MlxChunkEngine(store, fp, queue_bytes=64 << 20)
    lbmlx.drain_at_exit(eng, drain_s)
    pool = MlxAttentionKVPool(17 * 64 + 1, fp.num_layers, fp.n_kv_heads, fp.head_dim, dtype=mx.float32)
    for i in range(fp.num_layers):
        pool.k_buffer[i] = mx.random.normal(pool.k_buffer[i].shape)
        pool.v_buffer[i] = mx.random.normal(pool.v_buffer[i].shape)
    mx.eval(*pool.all_buffers())
    keys = eng.keys(eng.seed(), list(range(16 * 64)), 16)
    for b in range(8):
        slots = [np.arange(1 + j * 64, 1 + (j + 1) * 64) for j in (2 * b, 2 * b + 1)]
        assert eng.capture(pool, slots, keys[2 * b:2 * b + 2]) == 2
    print("QUEUED", eng.writer.queued_bytes() // fp.chunk_bytes, flush=True)
""")


def _run(tmp_path: Path, delay_s: float, drain_s: float) -> subprocess.CompletedProcess:
    script = tmp_path / "child.py"
    script.write_text(f"FP_ARGS = {FP!r}\n" + CHILD)
    return subprocess.run([sys.executable, str(script), str(tmp_path / "store"), str(delay_s), str(drain_s)],
                          env=child_env(), capture_output=True, text=True, timeout=300)


def _stored(tmp_path: Path) -> int:
    fp = lbmlx.ModelFingerprint(**FP)
    settings = settings_from_dict({"storage": [{"type": "local", "path": str(tmp_path / "store")}]})
    keys = lbmlx.chunk_keys(lbmlx.chain_seed(fp.namespace()), list(range(16 * C)), 16)
    with ChunkStore.open(settings, background=False) as store:
        return sum(store.contains(fp.namespace(), keys))


def test_clean_exit_writes_every_queued_chunk_quietly(tmp_path: Path) -> None:
    r = _run(tmp_path, delay_s=0.0, drain_s=30.0)
    assert r.returncode == 0, r.stderr
    assert "QUEUED" in r.stdout
    assert "Traceback" not in r.stderr and "ERROR" not in r.stderr, r.stderr
    assert "cannot schedule new futures" not in r.stderr
    assert _stored(tmp_path) == 16


def test_exit_drain_is_bounded_and_counts_what_it_drops(tmp_path: Path) -> None:
    # 16 writes of 0.4 s each need ~6 s; the drain gets 1 s, then the process stops with one line
    r = _run(tmp_path, delay_s=0.4, drain_s=1.0)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "ERROR" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "were not written within" in ln]
    assert len(lines) == 1, r.stderr
    dropped = int(lines[0].split("lifeboat: ")[1].split()[0])
    stored = _stored(tmp_path)
    assert dropped > 0 and stored < 16
    # what was neither written nor dropped was the batch in flight at the deadline (at most 2 chunks)
    assert 16 - 2 <= stored + dropped <= 16
