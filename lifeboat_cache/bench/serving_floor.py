"""The floor for a restored request: after a serving run, the same returning prompts, one at a time, on a
fresh server on the store the run left, each sent twice: first it is restored from storage (a new process
holds nothing else), then at once again, served from SGLang's device prefix cache (the floor: nothing is
faster). On the no-HiCache server the first send is a recompute, which puts the restore between the two.

Why alone and not under the load: at concurrency 16 a request's TTFT is mostly its wait for admission, so a
restored request against the same request on another server measures the queue, not the restore. Why a
fresh server: only a process that never saw the prompt must take it from storage, as the returning users
of the run's second half did. A warm-up request (a prompt of its own) goes first: a new server's first
request also pays for warming the process up.

The prompts are the trace's last visits (the longest: a conversation's whole history), sent by SGLang's
own load generator at concurrency 1, so TTFT and the per-request cache sources are measured as in the run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from .serving_load import command, run_half
from .serving_trace import dataset_args

WARMUP = [{"role": "system", "content": "Warm-up request of the LifeboatCache serving benchmark's floor probe."},
          {"role": "user", "content": "Say hello in one short sentence."}]


def probe_trace(trace: Path, visits: Sequence[int], out: Path) -> Path:
    """A trace for the probe: the warm-up, then each of `visits` (indices into `trace`'s visits) twice."""
    rows = json.loads(trace.read_text())["conversations"]
    probe = [[{"messages": WARMUP, "prompt_tokens": 16}]]
    for v in visits:
        probe += [rows[v], rows[v]]
    out.write_text(json.dumps({"metadata": {"generator": "lifeboat_cache.bench.serving_floor", "visits": list(visits)},
                               "conversations": probe}, indent=0))
    return out


def pairs(result: dict[str, Any], visits: Sequence[int]) -> list[dict[str, Any]]:
    """Per probed visit, from the load generator's result: both sends' TTFT, cache sources and answers."""
    ttfts, details = result["ttfts"], result.get("cached_tokens_details") or [None] * len(result["ttfts"])
    texts, errors = result["generated_texts"], result["errors"]
    out = []
    for i, v in enumerate(visits):
        a, b = 1 + 2 * i, 2 + 2 * i
        first, again = details[a] or {}, details[b] or {}
        out.append({"visit": v, "prompt_tokens": result["input_lens"][a],
                    "first": {"ttft_ms": ttfts[a] * 1e3, "storage": int(first.get("storage") or 0),
                              "device": int(first.get("device") or 0), "error": errors[a] or None},
                    "again": {"ttft_ms": ttfts[b] * 1e3, "device": int(again.get("device") or 0),
                              "error": errors[b] or None},
                    "same_answer_twice": texts[a] == texts[b], "answer": texts[a]})
    return out


def ratios(probed: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """First send over the device-memory send, per prompt: median and worst, over the prompts whose first send
    took tokens from storage (`restored`) or, on a server without storage, over all of them."""
    import numpy as np

    ok = [p for p in probed if not p["first"]["error"] and not p["again"]["error"] and p["again"]["ttft_ms"] > 0]
    restored = [p for p in ok if p["first"]["storage"] > 0]
    use = restored or ok
    r = np.asarray([p["first"]["ttft_ms"] / p["again"]["ttft_ms"] for p in use], dtype=float)
    return {"prompts": len(probed), "restored": len(restored),
            "first_ttft_ms_p50": float(np.median([p["first"]["ttft_ms"] for p in use])) if use else None,
            "device_ttft_ms_p50": float(np.median([p["again"]["ttft_ms"] for p in use])) if use else None,
            "ratio_p50": float(np.median(r)) if r.size else None, "ratio_max": float(r.max()) if r.size else None,
            "same_answer_twice": sum(p["same_answer_twice"] for p in probed)}


def probe(plan: Any, name: str, concurrency: int, work: Path) -> dict[str, Any]:
    """Start a fresh `name` server on the run's store, send the probe, kill it; pairs plus their ratios.
    `plan` is serving.py's ServingPlan (not imported: serving.py imports this module)."""
    from .server import start

    total = plan.shape.visits
    visits = list(range(total - min(plan.sizes.serving_floor_prompts, plan.shape.conversations), total))
    tag = f"{name}-c{concurrency}-floor"
    trace = probe_trace(plan.trace, visits, work / f"{tag}-trace.json")
    srv = plan.server(name, tag)
    try:
        start(srv)
        cmd = command(srv, plan.model, dataset_args(trace, 0), count=1 + 2 * len(visits), concurrency=1,
                      output_tokens=plan.sizes.serving_output_tokens, out_file=work / f"{tag}.jsonl",
                      seed=plan.sizes.serving_seed)
        res = run_half(srv, cmd, work / f"{tag}.jsonl", plan.logs / f"{tag}.bench.log")
    finally:
        srv.kill()
    probed = pairs(res["result"], visits)
    return {"pairs": probed, "counters": res["counters"], **ratios(probed)}
