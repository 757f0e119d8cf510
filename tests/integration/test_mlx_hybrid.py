"""Hybrid models (linear attention + attention) through the ``lifeboat`` MLX backend.

A seeded tiny Qwen3-Next (GatedDeltaNet + full attention, mlx-lm's own model class) is served by
SGLang's real ``MlxModelRunner`` with its ``MlxAuxiliaryStateReqToTokenPool`` and the unified tree's
MAMBA component (SGLang's ``MlxAuxiliaryStateComponent``, see ``auxiliary_state_component`` for the
0.5.23 fields we add).

Proven here:
* the recurrent state SGLang's runner snapshots at the prompt's last 64-token boundary is stored with
  the KV chunks; after a restart the prompt is restored up to that boundary *with its state*: the
  runner starts from the restored state (not its full-prompt fallback) and the greedy tokens equal
  the cold run's;
* power control: the same boundary's state taken from another prompt changes the tokens, so the
  state really is what the restored request runs on;
* a second concurrent hybrid request is refused with a clear message; the first one finishing frees
  the slot.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mlx.core", reason="MLX is not installed (pip install 'mlx[cpu]')")
pytest.importorskip("sglang", reason="SGLang 0.5.23 is not installed")

from support.mlx_models import tiny_qwen3_next  # noqa: E402

from lifeboat_cache import ChunkStore  # noqa: E402
from lifeboat_cache.config import settings_from_dict  # noqa: E402
from lifeboat_cache.demo.mlx_serving import child_env, run_plan_process  # noqa: E402
from lifeboat_cache.integrations.radix_cache.cache import HYBRID_CONCURRENCY_MESSAGE  # noqa: E402
from lifeboat_cache.runtimes import mlx as lbmlx  # noqa: E402

C = lbmlx.CHUNK_TOKENS


def _rand(seed: int, n: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(3, 500, size=n)]


PROMPTS = {"A": _rand(10, 300), "B": _rand(11, 300)}
BOUNDARY = 256  # SGLang tracks the state at floor(300 / 64) * 64


def _run(model: Path, xdg: Path, steps: list[dict]) -> dict:
    return run_plan_process({"model": str(model), "prompts": PROMPTS, "steps": steps},
                            child_env(XDG_CACHE_HOME=str(xdg)), timeout=600)


def _gen(name: str, ids: str) -> dict:
    return {"op": "generate", "name": name, "ids": ids, "max_new_tokens": 8}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("mlx-hybrid")
    model = tiny_qwen3_next(root / "model", seed=0)
    xdg = root / "xdg"
    cold = _run(model, xdg, [_gen("A", "A"), _gen("B", "B"), {"op": "flush"}])
    warm = _run(model, xdg, [_gen("A", "A"), {"op": "reset_tree"}, _gen("B", "B")])
    return {"root": root, "model": model, "xdg": xdg, "cold": cold, "warm": warm}


def test_cold_run_stores_chunks_and_the_boundary_state(world: dict) -> None:
    s = world["cold"]["stats"]
    assert world["cold"]["cache_class"] == "LifeboatMlxRadixCache"
    assert s["mlx_states_captured"] == 2  # one per prompt, at its last 64-token boundary
    assert s["mlx_chunks_written"] == 2 * (BOUNDARY // C) + 2  # KV chunks + the two state records


def test_restart_restores_prefix_with_its_state(world: dict) -> None:
    for name in ("A", "B"):
        cold, warm = world["cold"]["steps"][name], world["warm"]["steps"][name]
        assert cold["cached_tokens"] == 0 and cold["aux_restores"] == 0
        assert warm["cached_tokens"] == BOUNDARY
        assert warm["aux_restores"] == 1, "the runner fell back to recomputing the whole prompt"
        assert warm["output_ids"] == cold["output_ids"]
    assert world["warm"]["stats"]["mlx_states_restored"] == 2


def test_power_control_another_prompts_state_changes_the_answer(world: dict, tmp_path: Path) -> None:
    ns = bytes.fromhex(world["cold"]["namespace"])
    seed = lbmlx.chain_seed(ns)
    ka = lbmlx.chunk_keys(seed, PROMPTS["A"], BOUNDARY // C)
    kb = lbmlx.chunk_keys(seed, PROMPTS["B"], BOUNDARY // C)
    settings = {"storage": [{"type": "local", "path": str(world["xdg"] / "lifeboat")}],
                "engine": {"compression": "none"}}
    src = ChunkStore.open(settings_from_dict(settings), background=False)
    state_ns = bytes.fromhex(world["cold"]["state_namespace"])
    shape = (2, 2, C, 2, 16)  # 2 attention layers, K/V, 64 tokens, 2 kv heads, head_dim 16
    kv = [np.empty(shape, np.float32) for _ in ka]
    assert src.get_into(ns, ka, kv) == [True] * len(ka)
    b_state = np.empty(world["cold"]["state_bytes"], np.uint8)
    assert src.get_into(state_ns, [kb[-1]], [b_state]) == [True]
    src.close()
    forged = tmp_path / "forged"
    settings["storage"][0]["path"] = str(forged / "lifeboat")
    dst = ChunkStore.open(settings_from_dict(settings), background=False)
    assert dst.put(ns, ka, kv) == [True] * len(ka)
    assert dst.put(state_ns, [ka[-1]], [b_state]) == [True]  # A's boundary now carries B's state
    dst.flush()
    dst.close()
    res = _run(world["model"], forged, [_gen("A", "A")])
    a = res["steps"]["A"]
    assert a["cached_tokens"] == BOUNDARY and a["aux_restores"] == 1
    assert a["output_ids"] != world["cold"]["steps"]["A"]["output_ids"]


def test_concurrent_hybrid_requests_are_refused_clearly(world: dict, tmp_path: Path) -> None:
    res = _run(world["model"], tmp_path / "xdg", [
        {"op": "arrive", "name": "first", "ids": "A", "rid": "first"},
        {"op": "arrive", "name": "second", "ids": "B", "rid": "second"},
        {"op": "abort", "rid": "first"},
        {"op": "arrive", "name": "third", "ids": "B", "rid": "third"},
    ])
    steps = res["steps"]
    assert steps["first"] == {"refused": None}
    assert steps["second"] == {"refused": HYBRID_CONCURRENCY_MESSAGE}  # sent as SGLang's 503 abort, never queued
    assert steps["third"] == {"refused": None}
    assert res["stats"]["mlx_hybrid_refused"] == 1
