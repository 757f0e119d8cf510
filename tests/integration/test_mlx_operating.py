"""Operating the MLX backend: named without LIFEBOAT_CACHE, `lifeboat_*` metrics, stats files, `ls`.

Real processes through SGLang's real MLX classes (``lifeboat_cache.demo.mlx_serving``): the launch
types ``--radix-cache-backend lifeboat`` with ``LIFEBOAT_CACHE`` unset, the plugin entry point
registers the backend, ``create_tree_cache`` builds it. ``PROMETHEUS_MULTIPROC_DIR`` is set as
SGLang's ``--enable-metrics`` sets it; the parent scrapes with ``MultiProcessCollector``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mlx.core", reason="MLX is not installed (pip install 'mlx[cpu]')")
pytest.importorskip("sglang", reason="SGLang 0.5.23 is not installed")
prometheus_client = pytest.importorskip("prometheus_client")

from prometheus_client.multiprocess import MultiProcessCollector  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from support.mlx_models import tiny_llama  # noqa: E402

from lifeboat_cache.demo.mlx_serving import child_env, run_plan_process  # noqa: E402
from lifeboat_cache.runtimes import mlx as lbmlx  # noqa: E402

C = lbmlx.CHUNK_TOKENS
P = [int(x) for x in np.random.default_rng(0).integers(3, 500, size=300)]  # 4 full chunks


def _env(xdg: Path, prom: Path, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k != "LIFEBOAT_CACHE"}
    return child_env(base, XDG_CACHE_HOME=str(xdg), PROMETHEUS_MULTIPROC_DIR=str(prom), **extra)


def _plan(model: Path, out: Path, steps: list[dict]) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    return {"model": str(model), "prompts": {"P": P}, "out": str(out), "steps": steps, "named": True}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("mlx-ops")
    model = tiny_llama(root / "model", seed=0)
    xdg, prom = root / "xdg", root / "prom"
    prom.mkdir()
    gen = {"op": "generate", "name": "P", "ids": "P", "max_new_tokens": 4}
    cold = run_plan_process(_plan(model, root / "cold", [gen, {"op": "flush"}]), _env(xdg, prom), timeout=600)
    warm = run_plan_process(_plan(model, root / "warm", [gen]), _env(xdg, prom), timeout=600)
    return {"root": root, "model": model, "xdg": xdg, "prom": prom, "cold": cold, "warm": warm}


def _scrape(prom: Path) -> dict[tuple[str, tuple], float]:
    registry = prometheus_client.CollectorRegistry()
    MultiProcessCollector(registry, path=str(prom))
    out = {}
    for fam in text_string_to_metric_families(prometheus_client.generate_latest(registry).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_named_backend_works_without_lifeboat_cache(world: dict) -> None:
    for run in ("cold", "warm"):
        assert world[run]["backend"] == "lifeboat"
        assert world[run]["cache_class"] == "LifeboatMlxRadixCache"
    assert world["cold"]["stats"]["mlx_chunks_written"] == 4
    assert world["cold"]["stats"]["mlx_tails_written"] == 1
    assert world["warm"]["steps"]["P"]["cached_tokens"] == len(P) - 1  # 4 chunks + the prompt's tail


def test_mlx_metrics_on_a_multiprocess_scrape(world: dict) -> None:
    s = _scrape(world["prom"])
    base = (("model", str(world["model"])), ("rank", "0"))
    assert s[("lifeboat_mlx_chunks_written_total", base)] == 4       # summed over both processes
    assert s[("lifeboat_mlx_chunks_restored_total", base)] == 4
    assert s[("lifeboat_mlx_restore_seconds_count", base)] == 1
    assert s[("lifeboat_mlx_chunks_dropped_total", tuple(sorted(base + (("reason", "queue_full"),))))] == 0
    assert s[("lifeboat_hits_total", base)] == 5  # 4 chunks + 1 tail record


def test_lifeboat_ls_and_stats_name_the_mlx_model(world: dict) -> None:
    env = dict(os.environ, XDG_CACHE_HOME=str(world["xdg"]))
    env.pop("LIFEBOAT_CONFIG", None)
    cwd = world["root"]  # no ./lifeboat.yaml there: the embedded default store under XDG_CACHE_HOME
    ls = subprocess.run([sys.executable, "-m", "lifeboat_cache.cli", "ls", "--json"], env=env, cwd=cwd,
                        capture_output=True, text=True, timeout=120)
    assert ls.returncode == 0, ls.stderr
    spaces = list(json.loads(ls.stdout)["namespaces"].values())
    assert sorted(n["labels"]["kind"] for n in spaces) == ["mlx-kv", "mlx-kv-tail"]
    (ns,) = [n for n in spaces if n["labels"]["kind"] == "mlx-kv"]
    (tail,) = [n for n in spaces if n["labels"]["kind"] == "mlx-kv-tail"]
    assert ns["labels"] == {"model": str(world["model"]), "kind": "mlx-kv", "dtype": "float32"}
    assert ns["pages_written"] == 4 and tail["pages_written"] == 1
    st = subprocess.run([sys.executable, "-m", "lifeboat_cache.cli", "stats", "--json"], env=env, cwd=cwd,
                        capture_output=True, text=True, timeout=120)
    assert st.returncode == 0, st.stderr
    a = json.loads(st.stdout)["activity"]
    assert a["pages_read"] == 5 and a["latency"]["mlx_restore"]["count"] == 1


def test_bad_rebuild_wait_names_the_variable(world: dict) -> None:
    env = _env(world["xdg"], world["prom"], LIFEBOAT_MLX_REBUILD_WAIT_S="abc")
    with pytest.raises(RuntimeError) as e:
        run_plan_process(_plan(world["model"], world["root"] / "bad", []), env, timeout=600)
    assert "LIFEBOAT_MLX_REBUILD_WAIT_S='abc' is invalid" in str(e.value)
    assert "could not convert string to float" not in str(e.value)


def test_hierarchical_cache_is_refused_with_its_message(world: dict) -> None:
    """docs/mlx.md: `--enable-hierarchical-cache` stops the launch (it is not a silent fallback)."""
    plan = {**_plan(world["model"], world["root"] / "hicache", []), "hicache": True}
    with pytest.raises(RuntimeError) as e:
        run_plan_process(plan, _env(world["xdg"], world["prom"]), timeout=600)
    assert "drop --enable-hierarchical-cache" in str(e.value)
