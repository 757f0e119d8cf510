"""One half of a `serving` run: SGLang's own load generator (`python -m sglang.bench_serving` from the
installed wheel, a subprocess) against one server, plus the server's `/metrics` before and after.

Why SGLang's generator and not ours: its request loop, concurrency limit, TTFT measurement and
`--cache-report` (per-request `cached_tokens_details`: device / host / storage) are what SGLang's users
and its HiCache blog report with, so our figures read the same way. Why the counters from `/metrics`
as well: `storage_prefetch_unfulfilled_tokens_total{reason}` says why a restorable prefix was
recomputed (a prefetch that expired, a host pool that was full), which the per-request view cannot.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from .common import log

BENCH_TIMEOUT_S = 3600.0
# SGLang counters whose growth over a half is reported (summed over their other labels); lifeboat_* too
COUNTERS = {
    "sglang:prompt_tokens_total": None,
    "sglang:generation_tokens_total": None,
    "sglang:storage_prefetch_hit_tokens_total": None,
    "sglang:prefetched_tokens_total": None,
    "sglang:cached_tokens_total": "cache_source",
    "sglang:storage_prefetch_unfulfilled_tokens_total": "reason",
}
STORE_COUNTERS = ("lifeboat_pages_written_total", "lifeboat_writes_dropped_total", "lifeboat_hits_total",
                     "lifeboat_misses_total", "lifeboat_pages_read_total")


def counters(text: str) -> dict[str, float]:
    """The counters of COUNTERS / STORE_COUNTERS in a `/metrics` text: `name` or `name{label}` -> sum."""
    from ..testing import parse_metrics

    out: dict[str, float] = {}
    for name, labels, value in parse_metrics(text):
        if name in COUNTERS:
            label = COUNTERS[name]
            key = f"{name}{{{labels.get(label, '')}}}" if label else name
        elif name in STORE_COUNTERS:
            key = name
        else:
            continue
        out[key] = out.get(key, 0.0) + value
    return out


def grown(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """after - before per counter (a counter absent before counts from 0)."""
    return {k: after[k] - before.get(k, 0.0) for k in sorted(after)}


def command(srv: Any, model: Path, dataset: Sequence[str], *, count: int, concurrency: int, output_tokens: int,
            out_file: Path, seed: int) -> list[str]:
    """The `python -m sglang.bench_serving` command line of one half (greedy, fixed seed, no warm-up);
    `dataset`: the dataset's own arguments (serving_trace.dataset_args, SharedPrefixShape.args)."""
    return [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang-oai-chat",
            "--host", srv.url.split("//")[1].split(":")[0], "--port", str(srv.port),
            "--model", str(model), "--tokenizer", str(model), *dataset, "--num-prompts", str(count),
            "--sharegpt-output-len", str(output_tokens), "--max-concurrency", str(concurrency),
            "--request-rate", "inf", "--warmup-requests", "0", "--seed", str(seed), "--cache-report",
            "--output-file", str(out_file), "--output-details", "--disable-tqdm"]


def run_half(srv: Any, cmd: Sequence[str], out_file: Path, log_path: Path) -> dict[str, Any]:
    """Run the load generator once against `srv` (already up): its result line plus the counters' growth.

    Raises RuntimeError (with the generator's log tail) when it fails or writes no result."""
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_IS_IN_CI"}  # that one flushes the cache first
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    out_file.unlink(missing_ok=True)
    before = counters(srv.metrics_text())
    cpu0 = server_cpu_s(srv.proc.pid)
    t = time.monotonic()
    with open(log_path, "ab") as logf:
        logf.write(f"\n==== {' '.join(cmd)}\n".encode())
        logf.flush()
        rc = subprocess.run(list(cmd), stdout=logf, stderr=subprocess.STDOUT, env=env,
                            timeout=BENCH_TIMEOUT_S).returncode
    wall = time.monotonic() - t
    cpu = server_cpu_s(srv.proc.pid) - cpu0
    after = counters(srv.metrics_text())
    if rc != 0 or not out_file.exists():
        tail = log_path.read_text(errors="replace").splitlines()[-30:]
        raise RuntimeError(f"sglang.bench_serving exited {rc} (log {log_path}):\n" + "\n".join(tail))
    res = json.loads(out_file.read_text().splitlines()[-1])
    log.info("serving: %d requests in %.1f s (%d failed), TTFT p50 %.0f ms", res.get("completed", 0),
             res.get("duration", 0.0), len([e for e in res.get("errors", []) if e]), res.get("median_ttft_ms", 0))
    return {"result": res, "counters": grown(before, after), "wall_s": wall, "server_cpu_s": cpu}


def server_cpu_s(pid: int) -> float:
    """User + system CPU seconds used so far by the server's launcher and its children (scheduler,
    detokenizer): the cost a backend adds shows here, where throughput on a shared 2-core VM is noisy."""
    import psutil  # SGLang's own dependency: present wherever a server runs

    try:
        procs = [psutil.Process(pid)]
        procs += procs[0].children(recursive=True)
    except psutil.Error:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:  # a child that ended between the listing and the read
            continue
    return total


def summary(halves: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Whole-run figures of one server over its halves: requests/s and output tokens/s over the summed
    durations, TTFT percentiles over every request, and what storage supplied."""
    import numpy as np

    rs = [h["result"] for h in halves]
    dur = sum(r["duration"] for r in rs)
    ttfts = np.asarray([t for r in rs for t, e in zip(r["ttfts"], r["errors"]) if not e], dtype=float) * 1e3
    details = [d or {} for r in rs for d in r.get("cached_tokens_details") or []]
    prompt = sum(sum(r["input_lens"]) for r in rs)
    out = {
        "requests": sum(len(r["ttfts"]) for r in rs),
        "completed": sum(r["completed"] for r in rs),
        "failed": sum(1 for r in rs for e in r["errors"] if e),
        "duration_s": dur,
        "request_throughput": sum(r["completed"] for r in rs) / dur if dur else 0.0,
        "output_throughput": sum(r["total_output_tokens"] for r in rs) / dur if dur else 0.0,
        "prompt_tokens": prompt,
        "cached_tokens": {src: sum(int(d.get(src) or 0) for d in details) for src in ("device", "host", "storage")},
    }
    cpu = [h.get("server_cpu_s") for h in halves]
    if cpu and all(c is not None for c in cpu):
        out["server_cpu_s"] = float(sum(cpu))
        out["server_cpu_s_per_request"] = out["server_cpu_s"] / out["completed"] if out["completed"] else None
    if ttfts.size:
        out["ttft_ms"] = {f"p{q}": float(np.percentile(ttfts, q)) for q in (50, 90, 99)}
    return out


def ttft_p50_ms(half: dict[str, Any]) -> float:
    return float(half["result"].get("median_ttft_ms") or 0.0)


def differing(a: dict[str, Any], b: dict[str, Any]) -> dict[str, int]:
    """Answers of two servers on the same half, request by request (the trace's order): how many differ,
    and how many of those whose prompt took tokens from storage on `a` differ."""
    ra, rb = a["result"], b["result"]
    ta, tb = ra["generated_texts"], rb["generated_texts"]
    if len(ta) != len(tb):
        raise RuntimeError(f"serving: {len(ta)} answers against {len(tb)}: the halves did not run the same trace")
    det = ra.get("cached_tokens_details") or [None] * len(ta)
    restored = [bool(d and (d.get("storage") or 0) > 0) for d in det]
    diff = [x != y for x, y in zip(ta, tb)]
    return {"compared": len(ta), "differing": sum(diff), "restored": sum(restored),
            "restored_differing": sum(d and r for d, r in zip(diff, restored))}
