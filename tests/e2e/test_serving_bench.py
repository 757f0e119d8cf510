"""`lifeboat bench --quick --only serving` end to end: SGLang's own load generator (`python -m
sglang.bench_serving`, the installed wheel) against real CPU servers, restarted in the middle of the
traffic, on our seeded multi-turn trace.

The quick preset runs two of the four servers (no HiCache, HiCache + LifeboatCache), 8 conversations of
2 turns at concurrency 4, the restart (SIGTERM) between the turns. Asserted: behaviour, never a speed
(speeds are the bench's, docs/perf/serving.md): every request succeeds on both servers; the LifeboatCache
server started after the restart gets prompt tokens from storage, by SGLang's own `/metrics` and by the
per-request cache details; its answers (greedy, fixed seed) equal the no-HiCache server's, request by
request, before and after the restart; the backend dropped no backup. Afterwards the floor probe: a fresh
server on the store the run left restores the returning prompts from storage, serves them again from device
memory, and answers as the no-HiCache server did.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sglang.launch_server", reason="SGLang 0.5.23 is not installed")
pytest.importorskip("uvloop", reason="the SGLang server's packages are not installed (requirements/test.txt)")
pytest.importorskip("datasets", reason="sglang.bench_serving imports Hugging Face datasets (requirements/test.txt)")

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("serving") / "results"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "lifeboat_cache.cli", "bench", "--quick", "--only", "serving",
                           "--out", str(out)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=1200)
    res = json.loads((out / "results.json").read_text())
    sec = res["sections"]["serving"]
    assert proc.returncode == 0 and sec["status"] == "ok", (sec.get("error"), sec.get("traceback"),
                                                           proc.stderr[-4000:])
    sec["markdown"] = (out / "results.md").read_text()
    return sec


def test_every_request_succeeds_on_both_servers(serving: dict) -> None:
    t = serving["trace"]
    for name in ("none", "lifeboat"):
        s = serving["concurrency"]["4"]["servers"][name]["summary"]
        assert s["requests"] == s["completed"] == t["before_restart"] + t["after_restart"] > 0, (name, s)
        assert s["failed"] == 0 and s["output_throughput"] > 0 and s["ttft_ms"]["p50"] > 0


def test_after_the_restart_lifeboat_serves_prompt_tokens_from_storage(serving: dict) -> None:
    srv = serving["concurrency"]["4"]["servers"]["lifeboat"]
    before, after = srv["halves"]
    assert before["counters"].get("sglang:storage_prefetch_hit_tokens_total", 0) == 0  # a new store
    assert before["counters"]["lifeboat_pages_written_total"] > 0  # the first half's backups reached the store
    cn = after["counters"]
    assert cn["sglang:storage_prefetch_hit_tokens_total"] >= 64  # at least a page, by SGLang's own metrics
    assert cn["sglang:cached_tokens_total{storage}"] == srv["summary"]["cached_tokens"]["storage"] > 0
    assert cn["lifeboat_pages_read_total"] * 64 >= cn["sglang:storage_prefetch_hit_tokens_total"]
    assert cn.get("lifeboat_writes_dropped_total", 0) == 0 and before["counters"]["lifeboat_writes_dropped_total"] == 0
    # the returning conversations' requests: most took their earlier turn's prefix from storage
    restored = serving["concurrency"]["4"]["answers_vs_none"]["lifeboat"][1]["restored"]
    assert restored * 2 >= serving["trace"]["after_restart"]
    none = serving["concurrency"]["4"]["servers"]["none"]["summary"]["cached_tokens"]
    assert none["storage"] == 0 == none["host"]


def test_the_host_pool_sglang_allocated_is_the_one_planned(serving: dict) -> None:
    """Read back from SGLang's own log: the LifeboatCache server's host pool is the planned ratio x device pool
    (the plugin must not resize a launch that typed --hicache-ratio; SGLang adds one padding page); the
    no-HiCache server has none."""
    servers, planned = serving["concurrency"]["4"]["servers"], serving["pools_tokens"]["host"]
    got = [h["host_pool_tokens"] for h in servers["lifeboat"]["halves"]]
    assert len(got) == 2 and all(planned <= g <= planned + 2 * 64 for g in got), (got, planned)
    assert [h["host_pool_tokens"] for h in servers["none"]["halves"]] == [None, None]
    assert f"Host pool as SGLang allocated it, tokens: HiCache + LifeboatCache {got[0]:,}" in serving["markdown"]


def test_answers_equal_the_no_hicache_servers(serving: dict) -> None:
    halves = serving["concurrency"]["4"]["answers_vs_none"]["lifeboat"]
    assert [h["compared"] for h in halves] == [serving["trace"]["before_restart"], serving["trace"]["after_restart"]]
    assert [h["differing"] for h in halves] == [0, 0], halves
    assert halves[1]["restored"] > 0 and halves[1]["restored_differing"] == 0


def test_the_floor_probe_restores_alone_then_serves_from_device_memory(serving: dict) -> None:
    servers = serving["concurrency"]["4"]["servers"]
    floor = servers["lifeboat"]["floor"]
    assert "error" not in floor, floor
    assert floor["prompts"] == len(floor["pairs"]) == 2 and floor["restored"] == 2, floor
    for p in floor["pairs"]:
        # restorable: the whole pages of the prompt, which the run's second half wrote
        assert p["first"]["storage"] >= 64 and p["first"]["device"] == 0, p
        assert p["again"]["device"] >= p["first"]["storage"], p  # the second send hit the device prefix cache
        assert p["same_answer_twice"], p
    assert floor["answers_vs_none"] == {"compared": 2, "differing": 0}
    assert floor["ratio_p50"] > 0 and floor["first_ttft_ms_p50"] > 0 < floor["device_ttft_ms_p50"]
    none = servers["none"]["floor"]  # no storage: the first send is a recompute
    assert none["restored"] == 0 and all(p["first"]["storage"] == 0 for p in none["pairs"]), none


def test_report_has_the_serving_table(serving: dict) -> None:
    md = serving["markdown"]
    assert "Many returning users" in md and "| HiCache + LifeboatCache |" in md and "| no HiCache |" in md
    assert "again, from device memory" in md  # the floor table
