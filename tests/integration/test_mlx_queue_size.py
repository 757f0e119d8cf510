"""The MLX writer's queue bound: one full-context request's KV unless lifeboat.yaml sets it.

Proven here:
* sizing (``runtimes/mlx/queue_size.py``): the auto bound is one context's KV from the pool geometry
  and dtype (plus a hybrid state record), never below the floor, never above the cap; the cap is
  min(4 GiB, 1/8 of memory); a user-set size always wins, and one smaller than a context warns with
  the tokens it keeps and the value to set;
* the factory reads the context from what SGLang built (``ModelConfig.context_len``, the MLX runner's
  pool size: the smaller wins);
* the engine copies only the chunks its queue has room for (the rest are counted as dropped before
  any copy), with SGLang's real ``MlxAttentionKVPool`` and real MLX arrays;
* end to end, through SGLang's real MLX classes in a fresh process (``MlxServing``) with a seeded tiny
  Llama and the floor lowered to 1 MiB so one context's KV (4 MiB) exceeds it: with the auto bound a
  request whose KV is larger than the floor is stored whole and comes back whole; with a too-small
  explicit bound only its leading chunks are stored, the rest are counted as dropped, and the launch
  logged the warning.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from lifeboat_cache.config import format_size
from lifeboat_cache.runtimes.mlx import ModelFingerprint, queue_size as qs, writer_queue_size

MiB, GiB = 1 << 20, 1 << 30
SMOLLM2 = ModelFingerprint(weights="w", dtype="float32", num_layers=30, n_kv_heads=3, head_dim=64)


# ------------------------------------------------------------------------------------------ sizing

def test_kv_bytes_per_token_follows_geometry_and_dtype() -> None:
    assert SMOLLM2.kv_bytes_per_token == 30 * 2 * 3 * 64 * 4 == 46080  # the README's ~46 KB per token
    bf16 = ModelFingerprint(weights="w", dtype="bfloat16", num_layers=32, n_kv_heads=8, head_dim=128)
    assert bf16.kv_bytes_per_token == 32 * 2 * 8 * 128 * 2
    assert SMOLLM2.chunk_bytes == 64 * SMOLLM2.kv_bytes_per_token


def test_auto_bound_is_one_context_floored_and_capped() -> None:
    per = SMOLLM2.kv_bytes_per_token
    # SmolLM2-135M's 8,192-token context: 360 MiB, above the 256 MiB floor, below the cap
    q = writer_queue_size(per, 8192, configured=None, cap=4 * GiB)
    assert q.bytes == 8192 * per and not q.explicit and q.warning is None
    assert "360 MiB = one 8,192-token context of KV at 45 KiB/token" in q.message
    # a 8,021-token request (the README's run) fits whole: every chunk and its tail
    assert 8021 * per <= q.bytes
    # a short context: the floor
    q = writer_queue_size(per, 2048, configured=None, cap=4 * GiB)
    assert q.bytes == qs.QUEUE_FLOOR_BYTES == 256 * MiB and "the floor" in q.message
    # a long one: the cap, and the message says what is kept
    q = writer_queue_size(per, 131072, configured=None, cap=2 * GiB)
    assert q.bytes == 2 * GiB and "capped" in q.message
    assert f"longer than {2 * GiB // (64 * per) * 64:,} tokens" in q.message
    # the floor wins over a cap below it (a small machine), and is a parameter
    assert writer_queue_size(per, 131072, configured=None, cap=100 * MiB).bytes == 256 * MiB
    assert writer_queue_size(per, 10, configured=None, floor=MiB).bytes == MiB  # 10 tokens: 450 KiB
    assert writer_queue_size(per, 100, configured=None, floor=MiB).bytes == 100 * per  # 4.4 MiB
    # a hybrid model's state record rides along with its context
    assert writer_queue_size(per, 8192, configured=None, extra_bytes=12345, cap=GiB).bytes == 8192 * per + 12345
    # context unknown: the floor, saying so
    q = writer_queue_size(per, None, configured=None)
    assert q.bytes == 256 * MiB and "unknown" in q.message
    with pytest.raises(ValueError, match="kv_bytes_per_token"):
        writer_queue_size(0, 8192, configured=None)


def test_cap_is_min_of_4gib_and_an_eighth_of_memory() -> None:
    assert qs.queue_cap_bytes(64 * GiB) == 4 * GiB
    assert qs.queue_cap_bytes(16 * GiB) == 2 * GiB
    assert qs.queue_cap_bytes(None) == qs.QUEUE_CAP_BYTES == 4 * GiB
    phys = qs.physical_memory_bytes()
    assert phys is None or phys > 256 * MiB  # this machine says how much it has
    q = writer_queue_size(SMOLLM2.kv_bytes_per_token, 10**7, configured=None)  # default cap: this machine's
    assert q.bytes == max(qs.queue_cap_bytes(phys), qs.QUEUE_FLOOR_BYTES)


def test_auto_bound_keeps_idle_staging_at_the_floor() -> None:
    """A bound that grows with the context must not keep more restore buffers idle than the old default."""
    q = writer_queue_size(SMOLLM2.kv_bytes_per_token, 32768, configured=None, cap=4 * GiB)
    assert q.bytes > 1 * GiB and q.idle_read_bytes == qs.QUEUE_FLOOR_BYTES
    assert writer_queue_size(SMOLLM2.kv_bytes_per_token, 32768, configured=2 * GiB).idle_read_bytes == 2 * GiB


def test_user_size_wins_and_warns_when_a_context_does_not_fit() -> None:
    per = SMOLLM2.kv_bytes_per_token
    big = writer_queue_size(per, 8192, configured=GiB)
    assert big.bytes == GiB and big.explicit and big.warning is None
    assert "set by engine.copy_queue_size" in big.message
    small_but_above_auto = writer_queue_size(per, 2048, configured=128 * MiB)  # below the floor: still wins
    assert small_but_above_auto.bytes == 128 * MiB and small_but_above_auto.warning is None
    short = writer_queue_size(per, 8192, configured=256 * MiB, context_note="the model's context length")
    assert short.bytes == 256 * MiB
    w = short.warning or ""
    assert "engine.copy_queue_size (256 MiB) is less than one 8,192-token context" in w
    assert "longer than 5,824 tokens keep only their leading chunks" in w  # what the 8,021-token run kept
    assert f"set copy_queue_size: {-(-8192 * per // MiB)}MiB" in w and "auto" in w


def test_format_size() -> None:
    assert [format_size(n) for n in (512, 46080, 256 * MiB, int(1.4 * GiB), 4 * GiB, 360 * MiB)] == [
        "512 B", "45 KiB", "256 MiB", "1.4 GiB", "4 GiB", "360 MiB"]


# ------------------------------------------------------------------------------- factory's context

def test_context_is_the_smaller_of_model_context_and_pool() -> None:
    pytest.importorskip("sglang", reason="SGLang 0.5.23 is not installed")
    from types import SimpleNamespace

    from lifeboat_cache.integrations.radix_cache.factory import context_tokens

    ctx = SimpleNamespace(model_config=SimpleNamespace(context_len=8192))
    assert context_tokens(ctx, SimpleNamespace(pool_size=100_000)) == (8192, "the model's context length")
    n, note = context_tokens(ctx, SimpleNamespace(pool_size=2048))
    assert n == 2048 and "KV pool's 2,048 slots" in note and "8,192" in note
    assert context_tokens(SimpleNamespace(model_config=None), SimpleNamespace(pool_size=None)) == (None, "")


# ---------------------------------------------------------------- engine: copy only what fits

def test_engine_copies_only_the_chunks_its_queue_has_room_for(tmp_path: Path, monkeypatch) -> None:
    """A request larger than the queue: the chunks that fit are gathered and queued, the rest are
    counted as dropped before any copy (the gather sees only the fitting chunks)."""
    mx = pytest.importorskip("mlx.core", reason="MLX is not installed (pip install 'mlx[cpu]')")
    pool_mod = pytest.importorskip("sglang.srt.hardware_backend.mlx.kv_cache.attention_kv_pool",
                                   reason="SGLang 0.5.23 is not installed")
    from lifeboat_cache import ChunkStore
    from lifeboat_cache.config import settings_from_dict
    from lifeboat_cache.runtimes import mlx as lbmlx
    from lifeboat_cache.runtimes.mlx import engine as engine_mod

    settings = settings_from_dict({"storage": [{"type": "local", "path": str(tmp_path / "s"), "capacity": "1GiB",
                                                "segment_size": "8MiB"}], "engine": {"compression": "none"}})
    store = ChunkStore.open(settings, background=False)
    fp = lbmlx.ModelFingerprint(weights="w", dtype="float32", num_layers=2, n_kv_heads=2, head_dim=8)
    C = fp.chunk_tokens
    eng = lbmlx.MlxChunkEngine(store, fp, queue_bytes=3 * fp.chunk_bytes, owns_store=False)
    pool = pool_mod.MlxAttentionKVPool(8 * C + 1, 2, 2, 8, dtype=mx.float32)
    for i in range(2):
        pool.k_buffer[i] = mx.random.normal(pool.k_buffer[i].shape)
        pool.v_buffer[i] = mx.random.normal(pool.v_buffer[i].shape)
    mx.eval(*pool.all_buffers())
    gathered: list[tuple[int, ...]] = []
    real = engine_mod.gather_chunks

    def observing(pool, slots, chunk):  # the real gather; records how much it copied
        kv = real(pool, slots, chunk)
        gathered.append(tuple(kv.shape))
        return kv

    monkeypatch.setattr(engine_mod, "gather_chunks", observing)
    keys = eng.keys(eng.seed(), list(range(8 * C)), 8)
    slots = [np.arange(1 + i * C, 1 + (i + 1) * C) for i in range(8)]
    assert eng.capture(pool, slots, keys) == 3
    assert gathered == [(3, 2, 2, C, 2, 8)]
    assert store.counters.get("mlx_chunks_dropped_queue_full") == 5
    assert eng.flush(10)
    assert eng.stored_run(keys) == 3
    read = eng.read(keys[:3], 0)
    assert np.array_equal(read.buf, np.array(lbmlx.numpy_view(real(pool, np.concatenate(slots[:3]), C))))
    eng.close()
    store.close()


# ----------------------------------------------------------------------------- end to end

CHILD = textwrap.dedent("""
    import json, logging, sys
    import numpy as np
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="LOG %(levelname)s %(message)s")
    from lifeboat_cache.runtimes.mlx import queue_size
    queue_size.QUEUE_FLOOR_BYTES = 1 << 20  # scaled down: one context (4 MiB) exceeds the floor
    from lifeboat_cache.demo.mlx_serving import MlxServing

    s = MlxServing(sys.argv[1], pool_size=2048, max_running_requests=2)
    prompt = [int(x) for x in np.random.default_rng(7).integers(3, 500, size=1500)]
    first = s.generate(prompt, max_new_tokens=2)
    assert s.flush(120)
    stats = s.engine.stats()
    eng = s.engine
    stored = eng.stored_run(eng.keys(eng.seed(), prompt, len(prompt) // eng.chunk))
    s.reset_tree()
    again = s.generate(prompt, max_new_tokens=2)
    out = {"queue_bytes": eng.writer.max_bytes, "chunk_bytes": eng.fp.chunk_bytes, "stored": stored,
           "stats": {k: v for k, v in stats.items() if k.startswith("mlx_")},
           "cached_again": again.cached_tokens, "same_tokens": first.output_ids == again.output_ids}
    s.close()
    print("RESULT " + json.dumps(out), flush=True)
""")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mlx.core", reason="MLX is not installed (pip install 'mlx[cpu]')")
    pytest.importorskip("sglang", reason="SGLang 0.5.23 is not installed")
    from support.mlx_models import tiny_llama

    return tiny_llama(tmp_path_factory.mktemp("queue-model") / "model")


def _serve(model: Path, tmp_path: Path, blas_env: dict, engine: dict) -> tuple[dict, str]:
    config = tmp_path / "lifeboat.yaml"
    config.write_text(json.dumps({"storage": [{"type": "local", "path": str(tmp_path / "store")}],
                                  "engine": engine}))
    env = dict(blas_env, XDG_CACHE_HOME=str(tmp_path / "xdg"), HF_HUB_OFFLINE="1", LIFEBOAT_CONFIG=str(config))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(model)], env=env, capture_output=True, text=True,
                          timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(line[len("RESULT "):]), proc.stdout


def test_auto_bound_stores_a_request_larger_than_the_floor_whole(model: Path, tmp_path: Path,
                                                                  blas_env: dict) -> None:
    """tiny Llama fp32: 2 KiB of KV per token; its 4,096-token context is capped by the 2,048-slot pool,
    so one context is 4 MiB. The 1,500-token request (23 chunks, 2.9 MiB) exceeds the 1 MiB floor."""
    res, logs = _serve(model, tmp_path, blas_env, {})
    assert res["queue_bytes"] == 2048 * res["chunk_bytes"] // 64 == 4 << 20
    assert "MLX writer queue 4 MiB = one 2,048-token context of KV at 2 KiB/token (the KV pool's 2,048 slots" in logs
    assert logs.count("MLX writer queue") == 1 and "LOG WARNING lifeboat: engine.copy_queue_size" not in logs
    st = res["stats"]
    assert res["stored"] == 1500 // 64 == 23 and st["mlx_chunks_written"] == 23
    assert st.get("mlx_chunks_dropped_queue_full", 0) == 0
    assert res["cached_again"] == 1499 and res["same_tokens"]  # every chunk + the prompt tail came back


def test_explicit_small_bound_keeps_leading_chunks_counts_the_rest_and_warns(model: Path, tmp_path: Path,
                                                                             blas_env: dict) -> None:
    res, logs = _serve(model, tmp_path, blas_env, {"copy_queue_size": "1MiB"})
    assert res["queue_bytes"] == 1 << 20
    assert "MLX writer queue 1 MiB, set by engine.copy_queue_size" in logs
    warning = [ln for ln in logs.splitlines() if ln.startswith("LOG WARNING lifeboat: engine.copy_queue_size")]
    assert len(warning) == 1 and "longer than 512 tokens keep only their leading chunks" in warning[0]
    assert "set copy_queue_size: 4MiB" in warning[0]
    st = res["stats"]
    fit = (1 << 20) // res["chunk_bytes"]  # 8 chunks of 128 KiB
    assert res["stored"] == fit == 8 and st["mlx_chunks_written"] == 8
    # the 15 chunks that did not fit, counted (plus the prompt tail when the queue was still full)
    assert st["mlx_chunks_dropped_queue_full"] in (23 - fit, 23 - fit + 1)
    assert res["cached_again"] == fit * 64 and res["same_tokens"]  # the rest was recomputed
