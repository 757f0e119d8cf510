"""``--radix-cache-backend lifeboat`` through SGLang's real MLX classes, across process restarts.

Each "process" is a fresh Python process running a plan (``lifeboat_cache.demo.mlx_serving``):
SGLang's plugin entry point registers the backend, server-arg resolution picks it (no backend named),
``registry.create_tree_cache`` builds it, and requests go through ``MlxModelRunner`` /
``MlxAttentionKVPool`` / ``UnifiedRadixCache`` / ``release_kv_cache`` exactly in the scheduler's order.
The model is a seeded tiny Llama (fp32), so two processes load the same weights and a different seed
is "another model" with the same geometry. The store is the embedded default under a temp
``XDG_CACHE_HOME``.

Proven here:
* restart: a returning prompt gets every full chunk from the store; the pool rows it installs are
  bitwise equal to the cold run's rows (per token, so chunk order is checked); greedy tokens equal;
* keys: another prompt, the same chunks at another position, another ``cache_salt`` / ``extra_key``
  and another model get nothing; a prompt that diverges inside chunk k gets exactly chunks < k;
* a short in-memory match ending mid-chunk is extended from the store (bitwise again);
* restore under memory pressure evicts tree leaves to make room;
* controls with power: a forged store (chunk 2 taken from another prompt at the same position) makes
  both the row comparison and the tokens fail, so those checks can see a wrong chunk; a corrupted
  store is never installed (verified records only) and the answer is still the cold one.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mlx.core", reason="MLX is not installed (pip install 'mlx[cpu]')")
pytest.importorskip("sglang", reason="SGLang 0.5.23 is not installed")

from support.chunks import flip_byte  # noqa: E402
from support.mlx_models import tiny_llama  # noqa: E402

from lifeboat_cache import ChunkStore  # noqa: E402
from lifeboat_cache.config import settings_from_dict  # noqa: E402
from lifeboat_cache.demo.mlx_serving import child_env, run_plan_process  # noqa: E402
from lifeboat_cache.runtimes import mlx as lbmlx  # noqa: E402

C = lbmlx.CHUNK_TOKENS
N_FULL = 4  # a 300-token prompt: SGLang matches at most 299 tokens -> 4 full chunks (256 tokens)
LIMIT = 299  # ... plus the prompt's 43-token tail record: a returning prompt restores all 299


def _rand(seed: int, n: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(3, 500, size=n)]


P = _rand(0, 300)
PROMPTS = {
    "P": P,
    "Q": P[:150] + _rand(1, 150),               # diverges inside chunk 2 (tokens 128..191)
    "R": _rand(2, 300),                          # unrelated
    "SHIFT": P[C:] + P[:C],                      # P's chunks at other positions
    "HEAD": P[:100] + _rand(3, 40),              # shares 100 tokens (1 chunk + 36) with P
    "FILL1": _rand(4, 300),
    "FILL2": _rand(5, 300),
    "P_CUT": P[:290],                            # P's 4 chunks, then a shorter tail than P's
}


def _store_dir(xdg: Path) -> Path:
    return xdg / "lifeboat"


def _run(model: Path, xdg: Path, out: Path, steps: list[dict], **plan) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    return run_plan_process({"model": str(model), "prompts": PROMPTS, "out": str(out), "steps": steps, **plan},
                            child_env(XDG_CACHE_HOME=str(xdg)), timeout=600)


def _gen(name: str, ids: str, rows: int = 0, **kw) -> dict:
    return {"op": "generate", "name": name, "ids": ids, "max_new_tokens": 8, "save_rows": rows, **kw}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("mlx-radix")
    model_a = tiny_llama(root / "model-a", seed=0)
    model_b = tiny_llama(root / "model-b", seed=1)  # same geometry, other weights
    xdg = root / "xdg"
    cold = _run(model_a, xdg, root / "cold", [_gen("P", "P", rows=LIMIT), _gen("Q", "Q", rows=LIMIT),
                                              {"op": "flush"}])
    warm = _run(model_a, xdg, root / "warm", [
        _gen("P", "P", rows=LIMIT), {"op": "reset_tree"},
        _gen("R", "R"), {"op": "reset_tree"},
        _gen("SHIFT", "SHIFT"), {"op": "reset_tree"},
        _gen("Q", "Q", rows=LIMIT), {"op": "reset_tree"},
        _gen("P_salted", "P", cache_salt="tenant-2"), {"op": "reset_tree"},
        _gen("P_lora", "P", extra_key="lora-7"), {"op": "reset_tree"},
        _gen("HEAD", "HEAD"), _gen("P_after_head", "P", rows=LIMIT), {"op": "reset_tree"},
        _gen("P_CUT", "P_CUT", rows=N_FULL * C),
    ])
    other_model = _run(model_b, xdg, root / "other-model", [_gen("P", "P")])
    return {"root": root, "model_a": model_a, "xdg": xdg, "cold": cold, "warm": warm, "other_model": other_model}


def _rows(world: dict, run: str, name: str) -> tuple[np.ndarray, np.ndarray]:
    d = world["root"] / run
    return np.load(d / f"{name}_k.npy"), np.load(d / f"{name}_v.npy")


def _bitwise_equal(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> bool:
    return all(np.array_equal(x.view(np.uint8), y.view(np.uint8)) for x, y in zip(a, b))


def test_backend_registered_by_the_plugin_and_chosen_automatically(world: dict) -> None:
    for run in ("cold", "warm", "other_model"):
        assert world[run]["backend"] == "lifeboat"
        assert world[run]["cache_class"] == "LifeboatMlxRadixCache"


def test_cold_run_stores_every_full_chunk(world: dict) -> None:
    s = world["cold"]["stats"]
    assert world["cold"]["steps"]["P"]["cached_tokens"] == 0
    # P: 4 chunks; Q: shares chunks 0-1 with P (already stored or queued), adds its own 2-3
    assert s["mlx_chunks_written"] == 6 and s.get("mlx_chunks_dropped_queue_full", 0) == 0
    assert s["mlx_tails_written"] == 2  # P's and Q's 43-token tails, in their own namespace


def test_restart_restores_every_full_chunk_bitwise_and_same_tokens(world: dict) -> None:
    cold, warm = world["cold"]["steps"]["P"], world["warm"]["steps"]["P"]
    assert warm["cached_tokens"] == LIMIT  # every full chunk and the prompt's tail: one token prefilled
    assert world["warm"]["stats"]["mlx_tails_restored"] >= 1
    assert _bitwise_equal(_rows(world, "warm", "P"), _rows(world, "cold", "P"))
    assert warm["output_ids"] == cold["output_ids"]
    assert world["warm"]["stats"]["mlx_prefetches_used"] >= 1  # the read started at arrival


def test_other_prompt_position_salt_and_lora_get_nothing(world: dict) -> None:
    steps = world["warm"]["steps"]
    for name in ("R", "SHIFT", "P_salted", "P_lora"):
        assert steps[name]["cached_tokens"] == 0, name


def test_divergent_prompt_gets_exactly_the_shared_chunks(world: dict) -> None:
    q = world["warm"]["steps"]["Q"]
    # Q's own chunks (and tail) were stored by the cold run, so all come back - but they must be Q's
    assert q["cached_tokens"] == LIMIT
    assert _bitwise_equal(_rows(world, "warm", "Q"), _rows(world, "cold", "Q"))
    assert q["output_ids"] == world["cold"]["steps"]["Q"]["output_ids"]
    p_rows, q_rows = _rows(world, "cold", "P"), _rows(world, "cold", "Q")
    assert np.array_equal(p_rows[0][:, :2 * C], q_rows[0][:, :2 * C])  # shared chunks 0-1
    assert not np.array_equal(p_rows[0][:, 2 * C:3 * C], q_rows[0][:, 2 * C:3 * C])


def test_short_in_memory_match_is_extended_mid_chunk(world: dict) -> None:
    steps = world["warm"]["steps"]
    assert steps["HEAD"]["cached_tokens"] == C  # HEAD: chunk 0 from the store, the rest computed
    after = steps["P_after_head"]
    assert after["cached_tokens"] == LIMIT  # tree had 100 tokens; the store filled 100..298
    warm, cold = _rows(world, "warm", "P_after_head"), _rows(world, "cold", "P")
    # Rows that came from the store (chunk 0, restored for HEAD, and 100..298: chunks and the prompt's
    # tail, restored now) are the cold run's own bytes: bitwise equal. Rows 64..99 were computed by
    # HEAD's prefill, a forward pass of another shape than the cold run's: BLAS may sum in another
    # order there, so they are equal to rounding only (SGLang's own guarantee for a recomputed prefix).
    stored = np.r_[0:C, 100:LIMIT]
    assert _bitwise_equal(tuple(x[:, stored] for x in warm), tuple(x[:, stored] for x in cold))
    assert all(np.allclose(x[:, C:100], y[:, C:100], rtol=1e-4, atol=1e-5) for x, y in zip(warm, cold))
    assert after["output_ids"] == world["cold"]["steps"]["P"]["output_ids"]


def test_a_tail_only_returns_to_a_prompt_ending_where_it_ended(world: dict) -> None:
    """P[:290] shares P's 4 chunks but SGLang matches 289 tokens of it, not P's 299: P's tail (keyed by
    its tokens and their count) is not its tail, so only the full chunks come back."""
    cut = world["warm"]["steps"]["P_CUT"]
    assert cut["cached_tokens"] == N_FULL * C
    k, v = _rows(world, "warm", "P_CUT")
    ck, cv = _rows(world, "cold", "P")
    assert _bitwise_equal((k, v), (ck[:, :N_FULL * C], cv[:, :N_FULL * C]))


def test_another_model_never_gets_these_chunks(world: dict) -> None:
    assert world["other_model"]["steps"]["P"]["cached_tokens"] == 0
    assert world["other_model"]["namespace"] != world["cold"]["namespace"]


def test_restore_evicts_tree_leaves_when_the_pool_is_full(world: dict, tmp_path: Path) -> None:
    res = _run(world["model_a"], world["xdg"], tmp_path / "small",
               [_gen("FILL1", "FILL1"), _gen("FILL2", "FILL2"), _gen("P", "P")], pool_size=700)
    assert res["steps"]["P"]["cached_tokens"] == LIMIT
    assert res["steps"]["P"]["output_ids"] == world["cold"]["steps"]["P"]["output_ids"]


def _open_store(xdg: Path) -> ChunkStore:
    return ChunkStore.open(settings_from_dict({"storage": [{"type": "local", "path": str(_store_dir(xdg))}],
                                               "engine": {"compression": "none"}}), background=False)


def test_power_control_a_foreign_chunk_is_visible_to_rows_and_tokens(world: dict, tmp_path: Path) -> None:
    """Forge a store where P's chunk 2 holds Q's chunk 2 (another prompt, same position)."""
    ns = bytes.fromhex(world["cold"]["namespace"])
    seed = lbmlx.chain_seed(ns)
    kp = lbmlx.chunk_keys(seed, PROMPTS["P"], N_FULL)
    kq = lbmlx.chunk_keys(seed, PROMPTS["Q"], N_FULL)
    shape = (4, 2, C, 2, 32)  # tiny llama: 4 layers, K/V, 64 tokens, 2 kv heads, head_dim 32
    src = _open_store(world["xdg"])
    bufs = [np.empty(shape, np.float32) for _ in range(N_FULL)]
    assert src.get_into(ns, kp, bufs) == [True] * N_FULL
    foreign = np.empty(shape, np.float32)
    assert src.get_into(ns, [kq[2]], [foreign]) == [True]
    src.close()
    forged_xdg = tmp_path / "forged"
    dst = _open_store(forged_xdg)
    bufs[2] = foreign
    assert dst.put(ns, kp, bufs) == [True] * N_FULL
    dst.flush()
    dst.close()
    res = _run(world["model_a"], forged_xdg, tmp_path / "forged-run", [_gen("P", "P", rows=N_FULL * C)])
    assert res["steps"]["P"]["cached_tokens"] == N_FULL * C
    forged_rows = np.load(tmp_path / "forged-run" / "P_k.npy")
    cold_rows = _rows(world, "cold", "P")[0]
    assert not np.array_equal(forged_rows, cold_rows)
    assert np.array_equal(forged_rows[:, :2 * C], cold_rows[:, :2 * C])
    assert res["steps"]["P"]["output_ids"] != world["cold"]["steps"]["P"]["output_ids"]


def test_corrupted_store_is_never_installed(world: dict, tmp_path: Path) -> None:
    bad_xdg = tmp_path / "corrupt"
    shutil.copytree(world["xdg"], bad_xdg, ignore=shutil.ignore_patterns("*.json"))
    segments = sorted(_store_dir(bad_xdg).glob("**/*.seg")) or sorted(
        p for p in _store_dir(bad_xdg).rglob("*") if p.is_file() and p.stat().st_size > 100_000)
    assert segments, list(_store_dir(bad_xdg).rglob("*"))
    for seg in segments:  # flip bytes all through the payloads
        data = bytearray(seg.read_bytes())
        for off in range(4096, len(data), 8191):
            flip_byte(data, off)
        seg.write_bytes(bytes(data))
    res = _run(world["model_a"], bad_xdg, tmp_path / "corrupt-run", [_gen("P", "P", rows=N_FULL * C)])
    p = res["steps"]["P"]
    assert p["output_ids"] == world["cold"]["steps"]["P"]["output_ids"]
    cached = p["cached_tokens"]
    assert cached % C == 0 and cached < N_FULL * C  # the flipped records were refused
    if cached:  # whatever was restored passed verification and is bitwise the cold rows
        assert np.array_equal(np.load(tmp_path / "corrupt-run" / "P_k.npy")[:, :cached],
                              _rows(world, "cold", "P")[0][:, :cached])
    assert p["aborted"] is None  # the request was served: nothing raised into the scheduler
    refused = sum(res["stats"].get(f"miss_{why}", 0) for why in ("checksum", "header", "payload", "truncated"))
    assert refused >= 1, res["stats"]  # and each refusal was counted as a miss
