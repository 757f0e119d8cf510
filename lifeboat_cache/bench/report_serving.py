"""The `serving` section's Markdown tables: per concurrency, the four servers over the whole run (both
halves), the cold-start cliff (TTFT p50 before / after the restart), where prompt tokens came from, why
storage did not supply more (SGLang's unfulfilled reasons), and the answers against the no-HiCache server."""

from __future__ import annotations

from typing import Any

from .report_tables import section_ok, section_status

LABELS = {"none": "no HiCache", "host": "HiCache, host only", "file": "HiCache + SGLang `file`",
          "lifeboat": "HiCache + LifeboatCache"}
UNFULFILLED = "sglang:storage_prefetch_unfulfilled_tokens_total"


def serving_tables(sec: Any) -> list[str]:
    out = ["", "### Many returning users: SGLang's bench_serving on a CPU server, restarted mid-run", ""]
    if not section_ok(sec):
        return out + [section_status(sec)]
    t, pools = sec["trace"], sec["pools_tokens"]
    ratio = sec.get("kv_over_pools")
    out += [f"{t['conversations']} conversations x {t['turns']} turns ({t['before_restart']} requests, then a "
            f"{sec['stop'].upper()} and a new server on the same store, then {t['after_restart']}); "
            f"{sec['output_tokens']} greedy output tokens each; device pool {pools['device']:,} tokens, host pool "
            f"{pools['host']:,}; the conversations' KV is {sec.get('conversations_kv_tokens', 0):,} tokens"
            + (f" ({ratio:.1f}x device + host)" if ratio else "")
            + f"; prefetch policy {sec['prefetch_policy']}, write policy {sec['write_policy']}, host memory mode "
            f"{sec.get('host_mode', 'cache')} (storage servers). "
            "Throughput over both halves' durations; TTFT over every request.", ""]
    for conc, run in sec["concurrency"].items():
        out += [f"Concurrency {conc}:", "",
                "| server | req/s | output tok/s | TTFT p50 / p90 / p99 ms | TTFT p50 before / after restart "
                "| prompt tokens from device / host / storage | failed |", "|---|---|---|---|---|---|---|"]
        for name, srv in run["servers"].items():
            s = srv["summary"]
            ttft = s.get("ttft_ms", {})
            halves = " / ".join(f"{v:,.0f}" for v in srv["ttft_p50_ms_by_half"])
            c = s["cached_tokens"]
            out.append(f"| {LABELS.get(name, name)} | {s['request_throughput']:.3f} | {s['output_throughput']:.2f} "
                       f"| {' / '.join(f'{ttft.get(p, 0):,.0f}' for p in ('p50', 'p90', 'p99'))} | {halves} "
                       f"| {c['device']:,} / {c['host']:,} / {c['storage']:,} of {s['prompt_tokens']:,} "
                       f"| {s['failed']} |")
        out += ["", "After the restart (SGLang's `/metrics`, second half): storage prefetch hits and the tokens it "
                "did not fulfil, by reason (reasons with 0 left out).", "",
                "| server | storage hit tokens | unfulfilled tokens by reason | backups dropped (LifeboatCache) |",
                "|---|---|---|---|"]
        for name, srv in run["servers"].items():
            if name not in ("file", "lifeboat"):
                continue
            cn = srv["halves"][-1]["counters"]
            reasons = ", ".join(f"{k[len(UNFULFILLED) + 1:-1]} {v:,.0f}" for k, v in cn.items()
                                if k.startswith(UNFULFILLED) and v) or "none"
            dropped = cn.get("lifeboat_writes_dropped_total")
            out.append(f"| {LABELS[name]} | {cn.get('sglang:storage_prefetch_hit_tokens_total', 0):,.0f} "
                       f"| {reasons} | {'-' if dropped is None else f'{dropped:,.0f}'} |")
        cmp = run.get("answers_vs_none") or {}
        if cmp:
            out += ["", "Answers against the no-HiCache server, request by request (before / after the restart): "
                    "differing of compared; of the requests that took tokens from storage, differing.", ""]
            for name, halves in cmp.items():
                out.append(f"* {LABELS[name]}: " + " / ".join(
                    f"{h['differing']} of {h['compared']} (storage: {h['restored_differing']} of {h['restored']})"
                    for h in halves))
        out.append("")
    return out
