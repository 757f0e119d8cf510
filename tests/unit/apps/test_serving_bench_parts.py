"""The serving bench's own arithmetic (the servers and the load generator are tests/e2e/test_serving_bench.py):
its options name the --size key, counters come from the Prometheus text by label, halves add up, and
answers compare request by request."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from lifeboat_cache.bench.report_serving import _floor_table, interference_table
from lifeboat_cache.bench.serving import _floor_answers, check, host_pool_tokens
from lifeboat_cache.bench.serving_floor import pairs, probe_trace, ratios
from lifeboat_cache.bench.serving_load import counters, differing, grown, server_cpu_s, summary
from lifeboat_cache.bench.sizes import QUICK, make

METRICS = """\
# HELP sglang:cached_tokens_total tokens
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{cache_source="device",model_name="m"} 64.0
sglang:cached_tokens_total{cache_source="storage",model_name="m"} 1280.0
sglang:storage_prefetch_unfulfilled_tokens_total{reason="deadline",storage_backend="dynamic"} 128.0
sglang:storage_prefetch_unfulfilled_tokens_total{reason="host_capacity",storage_backend="dynamic"} 0.0
sglang:storage_prefetch_hit_tokens_total{storage_backend="dynamic"} 1280.0
sglang:num_running_reqs{model_name="m"} 3.0
lifeboat_pages_written_total{tier="local"} 20.0
lifeboat_pages_written_total{tier="nfs"} 2.0
"""


@pytest.mark.parametrize("key,value,says", [
    ("serving_prefetch_policy", "soon", "timeout, best_effort, wait_complete"),
    ("serving_write_policy", "write_sometimes", "write_through, write_through_selective, write_back"),
    ("serving_stop", "sighup", "sigterm, sigkill"),
    ("serving_servers", "none,redis", "none, host, file, lifeboat"),
    ("serving_host_ratio", "1", "ratio > 1"),
    ("serving_floor_prompts", -1, "0 for no floor probe"),
])
def test_bad_option_names_the_size_key_and_the_choices(key: str, value: str, says: str) -> None:
    with pytest.raises(ValueError, match=f"--size {key}={value}") as e:
        check(replace(QUICK, **{key: value}))
    assert says in str(e.value)
    check(QUICK)  # the presets themselves pass


def test_floor_prompts_may_be_zero_to_skip_the_probe() -> None:
    assert make(False, ["serving_floor_prompts=0"]).serving_floor_prompts == 0
    with pytest.raises(ValueError, match=r"serving_floor_prompts: must be >= 0 \(0: no floor probe\)"):
        make(False, ["serving_floor_prompts=-1"])
    with pytest.raises(ValueError, match="serving_turns: must be > 0"):
        make(False, ["serving_turns=0"])


def test_counters_are_summed_over_other_labels_and_grow_per_half() -> None:
    c = counters(METRICS)
    assert c["sglang:cached_tokens_total{storage}"] == 1280 and c["sglang:cached_tokens_total{device}"] == 64
    assert c["sglang:storage_prefetch_unfulfilled_tokens_total{deadline}"] == 128
    assert c["lifeboat_pages_written_total"] == 22  # both tiers
    assert "sglang:num_running_reqs" not in c  # a gauge, not reported
    later = counters(METRICS.replace("} 1280.0", "} 1536.0"))
    assert grown(c, later)["sglang:storage_prefetch_hit_tokens_total"] == 256
    assert grown({}, c)["lifeboat_pages_written_total"] == 22


def _half(ttfts: list[float], texts: list[str], storage: list[int], duration: float) -> dict:
    return {"result": {"duration": duration, "completed": len(ttfts), "ttfts": ttfts, "errors": [""] * len(ttfts),
                       "input_lens": [100] * len(ttfts), "total_output_tokens": 8 * len(ttfts),
                       "generated_texts": texts, "median_ttft_ms": 0.0,
                       "cached_tokens_details": [{"device": 0, "host": 0, "storage": s} for s in storage]}}


def test_summary_spans_both_halves() -> None:
    s = summary([_half([0.1, 0.3], ["a", "b"], [0, 0], 2.0), _half([0.2, 0.4], ["c", "d"], [64, 0], 2.0)])
    assert (s["requests"], s["completed"], s["failed"], s["duration_s"]) == (4, 4, 0, 4.0)
    assert s["request_throughput"] == 1.0 and s["output_throughput"] == 8.0
    assert s["ttft_ms"]["p50"] == pytest.approx(250.0) and s["cached_tokens"]["storage"] == 64
    assert "server_cpu_s" not in s  # halves without the server's CPU time (older results) report none
    halves = [{**_half([0.1, 0.3], ["a", "b"], [0, 0], 2.0), "server_cpu_s": 3.0},
              {**_half([0.2, 0.4], ["c", "d"], [64, 0], 2.0), "server_cpu_s": 5.0}]
    s = summary(halves)
    assert s["server_cpu_s"] == 8.0 and s["server_cpu_s_per_request"] == 2.0


_SPINNING_CHILD = ("import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\n"
                   "sys.stdin.read()")


def test_server_cpu_counts_the_launcher_and_its_children() -> None:
    """A launcher that only waits and a child that spins 0.5 s: the child's CPU time is in the total."""
    launcher = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {_SPINNING_CHILD!r}])"
    proc = subprocess.Popen([sys.executable, "-c", launcher], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while server_cpu_s(proc.pid) < 0.5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server_cpu_s(proc.pid) >= 0.5
    finally:
        proc.stdin.close()
        proc.wait(30)
    assert server_cpu_s(proc.pid) == 0.0  # a launcher that is gone counts nothing


def test_answers_compare_request_by_request_and_count_the_restored_ones() -> None:
    a = _half([0.1] * 3, ["x", "y", "z"], [64, 0, 128], 1.0)
    b = _half([0.1] * 3, ["x", "Y", "Z"], [0, 0, 0], 1.0)
    assert differing(a, b) == {"compared": 3, "differing": 2, "restored": 2, "restored_differing": 1}
    with pytest.raises(RuntimeError, match="not run the same trace"):
        differing(a, _half([0.1], ["x"], [0], 1.0))


def _probe_result(ttfts: list[float], storage: list[int], texts: list[str], errors: list[str] | None = None) -> dict:
    return {"ttfts": ttfts, "errors": errors or [""] * len(ttfts), "input_lens": [900] * len(ttfts),
            "generated_texts": texts,
            "cached_tokens_details": [{"device": 0 if s else 896, "storage": s} for s in storage]}


def test_probe_trace_sends_a_warm_up_then_each_visit_twice(tmp_path) -> None:
    rows = [[{"messages": [{"role": "user", "content": f"visit {i}"}]}] for i in range(5)]
    src = tmp_path / "trace.json"
    src.write_text(json.dumps({"metadata": {}, "conversations": rows}))
    out = json.loads(probe_trace(src, [3, 4], tmp_path / "probe.json").read_text())
    conv = out["conversations"]
    assert len(conv) == 5 and conv[1] == conv[2] == rows[3] and conv[3] == conv[4] == rows[4]
    assert conv[0] not in rows and out["metadata"]["visits"] == [3, 4]


def test_floor_pairs_and_ratios_count_only_restored_first_sends() -> None:
    # warm-up, then (first, again) for visits 7 and 8; visit 8's first send was recomputed (no storage tokens)
    res = _probe_result([0.5, 0.30, 0.20, 0.90, 0.10], [0, 768, 0, 0, 0], ["hi", "a", "a", "b", "B"])
    p = pairs(res, [7, 8])
    assert [x["visit"] for x in p] == [7, 8] and p[0]["first"]["storage"] == 768 and p[0]["again"]["device"] == 896
    assert p[0]["same_answer_twice"] and not p[1]["same_answer_twice"]
    r = ratios(p)
    assert (r["prompts"], r["restored"], r["same_answer_twice"]) == (2, 1, 1)
    assert r["ratio_p50"] == pytest.approx(1.5) and r["first_ttft_ms_p50"] == pytest.approx(300.0)
    assert ratios(pairs(_probe_result([0.5, 0.4, 0.2], [0, 0, 0], ["", "x", "x"]), [1]))["ratio_p50"] == 2.0
    failed = pairs(_probe_result([0.5, 0.0, 0.0], [0, 0, 0], ["", "", ""], ["", "reset", "reset"]), [1])
    assert ratios(failed)["ratio_p50"] is None and ratios(failed)["first_ttft_ms_p50"] is None


def test_floor_answers_and_table_compare_with_the_no_hicache_servers_second_half() -> None:
    none_half = {"result": {"generated_texts": ["n0", "n1", "n2"]}}  # the second half starts at visit 10
    floor = {"pairs": [{"visit": 11, "answer": "n1"}, {"visit": 12, "answer": "other"}], "prompts": 2, "restored": 2,
             "first_ttft_ms_p50": 300.0, "device_ttft_ms_p50": 200.0, "ratio_p50": 1.5, "ratio_max": 2.0}
    runs = {"none": {"halves": [{}, none_half]}, "lifeboat": {"halves": [], "floor": floor},
            "file": {"halves": [], "floor": {"error": "server did not start\nlog tail"}}}
    _floor_answers(runs, offset=10)
    assert floor["answers_vs_none"] == {"compared": 2, "differing": 1}
    table = "\n".join(_floor_table({n: s for n, s in runs.items() if n != "none"}))
    assert "| HiCache + LifeboatCache | 2 of 2 | 300 | 200 | 1.50x (2.00x) | 1 of 2 differ |" in table
    assert "| HiCache + SGLang `file` | probe failed: server did not start |" in table
    assert _floor_table({"none": {"halves": []}}) == []


def test_interference_table_names_each_contender_and_its_costs() -> None:
    row = {"steps_vs_none": 1.0, "step_ms": {"p50": 1.3, "p99": 1.4, "p999": 1.6}, "main_cpu_share": 1.0,
           "voluntary_switches": 1, "involuntary_switches": 54, "pages_written": 0, "errors": []}
    sec = {"status": "ok", "seconds": 20, "pages_per_burst": 11, "page_bytes": 786432, "period_ms": 100, "rows": [
        {**row, "contender": "none", "io_workers": None},
        {**row, "contender": "lifeboat", "io_workers": 1, "io_scheduling": "batch", "steps_vs_none": 0.98,
         "voluntary_switches": 3010, "pages_written": 2200}]}
    md = "\n".join(interference_table(sec))
    assert "| no HiCache | 1.00x | 1.30 / 1.40 / 1.60 | 1.00 | 1 / 54 | 0 | 0 |" in md
    assert "| LifeboatCache (io_workers 1, batch) | 0.98x |" in md and "3,010 / 54 | 2,200 |" in md
    assert "11 pages of 0.75 MiB every 100 ms" in md
    assert "failed" in "\n".join(interference_table({"status": "failed", "error": "boom"}))


def test_host_pool_in_gb_goes_to_lifeboat_through_its_variable_and_to_the_others_as_a_flag(tmp_path) -> None:
    """serving_host_gb: every HiCache server gets a pool of that many GB, the LifeboatCache one the way users
    set it (LIFEBOAT_SGLANG_HOST_GB, the plugin types --hicache-size); 0 keeps the ratio for all of them."""
    from lifeboat_cache.bench.serving import KV_BYTES_PER_TOKEN, ServingPlan

    def size_flags(flags: list[str]) -> list[str]:
        return [f"{f} {flags[i + 1]}" for i, f in enumerate(flags) if f in ("--hicache-size", "--hicache-ratio")]

    plan = ServingPlan(tmp_path, make(True, ["serving_host_gb=2"]))
    assert size_flags(plan.flags["host"]) == size_flags(plan.flags["file"]) == ["--hicache-size 2"]
    assert size_flags(plan.flags["lifeboat"]) == [] and size_flags(plan.flags["none"]) == []
    assert plan.env["lifeboat"]["LIFEBOAT_SGLANG_HOST_GB"] == "2"
    assert "LIFEBOAT_SGLANG_HOST_GB" not in plan.env["file"]
    assert plan.pool_tokens["host"] == 2 * 10**9 // KV_BYTES_PER_TOKEN

    plan = ServingPlan(tmp_path, make(True, ["serving_host_ratio=3"]))
    assert {n: size_flags(plan.flags[n]) for n in ("host", "file", "lifeboat")} == {
        n: ["--hicache-ratio 3.0"] for n in ("host", "file", "lifeboat")}
    assert "LIFEBOAT_SGLANG_HOST_GB" not in plan.env["lifeboat"]
    assert plan.pool_tokens["host"] == 3 * QUICK.serving_device_tokens


def test_host_pool_tokens_come_from_sglangs_own_allocation_line(tmp_path) -> None:
    log = tmp_path / "server.log"
    log.write_text("[2026-12-06 22:45:49] Load weight end.\n[2026-12-06 22:45:49] Allocating kv hierarchical KV host "
                   "pool: 43456 tokens, 2.00 GB host memory.\n")
    assert host_pool_tokens(log) == 43456
    log.write_text("[2026-12-06 22:45:49] Load weight end.\n")
    assert host_pool_tokens(log) is None  # no HiCache
    assert host_pool_tokens(tmp_path / "missing.log") is None


def test_a_bounded_store_gives_both_storage_servers_the_same_page_bytes(tmp_path) -> None:
    """serving_store_mib: LifeboatCache's tier gets `capacity:` and `file` its `max_size`, the same bytes (both
    count the pages' bytes); the report says it against the traffic's KV; 0 leaves both unbounded."""
    from lifeboat_cache.bench.report_serving import _store
    from lifeboat_cache.bench.serving import KV_BYTES_PER_TOKEN, ServingPlan
    from lifeboat_cache.config import settings_from_dict

    def extra(flags: list[str]) -> dict:
        return json.loads(flags[flags.index("--hicache-storage-backend-extra-config") + 1])

    plan = ServingPlan(tmp_path, make(True, ["serving_store_mib=96"]))
    assert extra(plan.flags["file"])["max_size"] == str(96 << 20)
    storage = {"storage": extra(plan.flags["lifeboat"])["storage"]}  # the launch's inline lifeboat.yaml
    assert settings_from_dict(storage).storage[0].capacity_bytes == 96 << 20
    sec = {"store_mib": 96, "kv_bytes_per_token": KV_BYTES_PER_TOKEN}
    assert _store(sec, 384 * 2**20 // KV_BYTES_PER_TOKEN).startswith("Each store holds at most 96 MiB of pages")
    assert "25% of the traffic's distinct KV (384 MiB)" in _store(sec, 384 * 2**20 // KV_BYTES_PER_TOKEN)

    plan = ServingPlan(tmp_path, make(True, []))
    assert "--hicache-storage-backend-extra-config" not in plan.flags["file"]
    assert "capacity" not in json.dumps(extra(plan.flags["lifeboat"]))
    assert _store({"store_mib": None}, 1000) == ""
    with pytest.raises(ValueError, match=r"serving_store_mib: must be >= 0 \(0: the store is not bounded\)"):
        make(False, ["serving_store_mib=-1"])
