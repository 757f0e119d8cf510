"""The `serving` section's Markdown tables and plot: per concurrency, the four servers over the whole run (both
halves), the cold-start cliff (TTFT p50 before / after the restart), where prompt tokens came from, why
storage did not supply more (SGLang's unfulfilled reasons), the answers against the no-HiCache server, and
the floor probe (restored alone against the same prompt from device memory); the plot is every request's
TTFT in the order sent. Also the `interference` section's table: what each backend's threads cost a Python
thread in the same process, as SGLang's scheduler is; and the `busy_tier` section's: reads and puts while a
process backs up pages, per tier kind."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .report_tables import section_ok, section_status

if TYPE_CHECKING:
    from matplotlib.figure import Figure

LABELS = {"none": "no HiCache", "host": "HiCache, host only", "file": "HiCache + SGLang `file`",
          "lifeboat": "HiCache + LifeboatCache"}
UNFULFILLED = "sglang:storage_prefetch_unfulfilled_tokens_total"
FONT_SMALL = 8  # the plot's legends: up to four servers and their storage marks per panel


def _allocated(sec: Any) -> str:
    """The host pools SGLang allocated (its own log line), per server, where a run recorded them."""
    got: dict[str, set[int]] = {}
    for run in sec["concurrency"].values():
        for name, srv in run["servers"].items():
            got.setdefault(name, set()).update(h["host_pool_tokens"] for h in srv.get("halves", [])
                                               if h.get("host_pool_tokens"))
    parts = [f"{LABELS.get(n, n)} {'/'.join(f'{v:,}' for v in sorted(vs))}" for n, vs in got.items() if vs]
    return f"Host pool as SGLang allocated it, tokens: {', '.join(parts)}. " if parts else ""


def _store(sec: Any, kv_tokens: int) -> str:
    """The storage servers' bound, against the bytes of the traffic's distinct KV (what an unbounded store holds)."""
    mib = sec.get("store_mib")
    if not mib:
        return ""
    kv_mib = kv_tokens * sec.get("kv_bytes_per_token", 0) / 2**20
    return (f"Each store holds at most {mib:,} MiB of pages (LifeboatCache `capacity:`, `file` `max_size`)"
            + (f", {mib / kv_mib:.0%} of the traffic's distinct KV ({kv_mib:,.0f} MiB). " if kv_mib else ". "))


def serving_tables(sec: Any) -> list[str]:
    out = ["", "### Many returning users: SGLang's bench_serving on a CPU server, restarted mid-run", ""]
    if not section_ok(sec):
        return out + [section_status(sec)]
    t, pools = sec["trace"], sec["pools_tokens"]
    ratio = sec.get("kv_over_pools")
    if t.get("dataset") == "shared_prefix":
        traffic = (f"SGLang's generated-shared-prefix: {t['groups']} groups x {t['per_group']} users, a "
                   f"{t['system_tokens']}-token system prompt per group and a {t['question_tokens']}-token question "
                   f"per user ({t['before_restart']} requests, then a {sec['stop'].upper()} and a new server on the "
                   f"same store, then the same {t['after_restart']} again)")
    else:
        traffic = (f"{t['conversations']} conversations x {t['turns']} turns ({t['before_restart']} requests, then "
                   f"a {sec['stop'].upper()} and a new server on the same store, then {t['after_restart']})")
    kv = sec.get("conversations_kv_tokens", 0)
    out += [traffic + f"; {sec['output_tokens']} greedy output tokens each; device pool {pools['device']:,} tokens, "
            f"host pool {pools['host']:,}; the traffic's distinct KV is {kv:,} tokens"
            + (f" ({ratio:.1f}x device + host)" if ratio else "")
            + f"; prefetch policy {sec['prefetch_policy']}, write policy {sec['write_policy']}, host memory mode "
            f"{sec.get('host_mode', 'cache')} (storage servers). " + _store(sec, kv) + _allocated(sec)
            + "Throughput over both halves' durations; TTFT over every request.", ""]
    for conc, run in sec["concurrency"].items():
        out += [f"Concurrency {conc}:", "",
                "| server | req/s | output tok/s | TTFT p50 / p90 / p99 ms | TTFT p50 before / after restart "
                "| prompt tokens from device / host / storage | server CPU s per request | failed |",
                "|---|---|---|---|---|---|---|---|"]
        for name, srv in run["servers"].items():
            s = srv["summary"]
            ttft = s.get("ttft_ms", {})
            halves = " / ".join(f"{v:,.0f}" for v in srv["ttft_p50_ms_by_half"])
            c = s["cached_tokens"]
            out.append(f"| {LABELS.get(name, name)} | {s['request_throughput']:.3f} | {s['output_throughput']:.2f} "
                       f"| {' / '.join(f'{ttft.get(p, 0):,.0f}' for p in ('p50', 'p90', 'p99'))} | {halves} "
                       f"| {c['device']:,} / {c['host']:,} / {c['storage']:,} of {s['prompt_tokens']:,} "
                       f"| {_cpu(s.get('server_cpu_s_per_request'))} | {s['failed']} |")
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
        out += _floor_table(run["servers"])
        out.append("")
    return out


def interference_table(sec: Any) -> list[str]:
    out = ["", "### What a backend's threads cost a Python thread in its process (the scheduler's place)", ""]
    if not section_ok(sec):
        return out + [section_status(sec)]
    out += [f"A main thread runs steps of Python bookkeeping and torch matmuls for {sec['seconds']:g} s while a "
            f"backup thread writes {sec['pages_per_burst']} pages of {sec['page_bytes'] / 2**20:.2f} MiB every "
            f"{sec['period_ms']} ms through SGLang's controller (every other burst read back).", "",
            "| contender | steps/s vs none | step p50 / p99 / p99.9 ms | main thread CPU share "
            "| voluntary / involuntary switches | pages written | errors |", "|---|---|---|---|---|---|---|"]
    for r in sec["rows"]:
        name = LABELS.get(r["contender"], r["contender"]).replace("HiCache + ", "")
        if r["io_workers"]:
            policy = f", {r['io_scheduling']}" if r.get("io_scheduling") else ""
            name += f" (io_workers {r['io_workers']}{policy})"
        st = r["step_ms"]
        out.append(f"| {name} | {_x(r['steps_vs_none'])} | {st['p50']:.2f} / {st['p99']:.2f} / {st['p999']:.2f} "
                   f"| {r['main_cpu_share']:.2f} | {r['voluntary_switches']:,} / {r['involuntary_switches']:,} "
                   f"| {r['pages_written']:,} | {len(r['errors'])} |")
    return out + [""]


def busy_tier_table(sec: Any) -> list[str]:
    out = ["", "### Reads and puts while a process backs up pages, per tier kind", ""]
    if not section_ok(sec):
        return out + [section_status(sec)]
    out += [f"A thread puts {sec['pages_per_put']} pages of {sec['page_bytes'] / 2**20:.2f} MiB at "
            f"{sec['backup_mb_s']} MB/s (segment_size {sec['segment_size']}) for {sec['seconds']:g} s while the "
            f"main thread reads {sec['read_pages']} stored pages every {sec['read_period_ms']:g} ms "
            "(nfs: a local directory as an nfs tier: its seals fdatasync, seal_after_s 2).", "",
            "| tier | read p50 / p99 / worst ms | reads over 50 ms | read misses | put p50 / p99 / worst ms "
            "| pages not stored |", "|---|---|---|---|---|---|"]
    for r in sec["rows"]:
        rd, pt = r["read_ms"], r["put_ms"]
        out.append(f"| {r['kind']} | {rd['p50']:.1f} / {rd['p99']:.1f} / {rd['max']:.1f} "
                   f"| {r['reads_over_50ms']} of {r['reads']} | {r['read_misses']} "
                   f"| {pt['p50']:.1f} / {pt['p99']:.1f} / {pt['max']:.1f} | {r['pages_not_stored']} |")
    return out + [""]


def _floor_table(servers: dict[str, Any]) -> list[str]:
    """The floor probe (bench/serving_floor.py): returning prompts alone on a fresh server, each sent twice."""
    probed = {n: s["floor"] for n, s in servers.items() if "floor" in s}
    if not probed:
        return []
    out = ["", "Alone afterwards (a fresh server on the store the run left, concurrency 1; the trace's last visits, "
           "each sent twice: first restored from storage, or recomputed without it, then again from device "
           "memory, the floor):", "",
           "| server | first sends with tokens from storage | first send TTFT p50 ms | again, from device memory, "
           "TTFT p50 ms | first / again per prompt: p50 (worst) | answers vs no HiCache |", "|---|---|---|---|---|---|"]
    for name, f in probed.items():
        if "error" in f:
            out.append(f"| {LABELS.get(name, name)} | probe failed: {f['error'].splitlines()[0][:120]} | | | | |")
            continue
        a = f.get("answers_vs_none")
        answers = f"{a['differing']} of {a['compared']} differ" if a else "-"
        out.append(f"| {LABELS.get(name, name)} | {f['restored']} of {f['prompts']} "
                   f"| {_ms(f['first_ttft_ms_p50'])} | {_ms(f['device_ttft_ms_p50'])} "
                   f"| {_x(f['ratio_p50'])} ({_x(f['ratio_max'])}) "
                   f"| {answers} |")
    return out


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _cpu(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}"


def _x(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}x"


def plot_serving(fig: Figure, sec: dict[str, Any]) -> None:
    """Per concurrency, every request's TTFT in the order the load generator sent them (both halves, the
    restart between them): the cold-start cliff is a step at the line; requests that took tokens from
    storage are marked. Log scale: a queued request waits tens of seconds, a lone one under one."""
    runs = sec["concurrency"]
    for i, (conc, run) in enumerate(runs.items()):
        ax = fig.add_subplot(1, len(runs), i + 1)
        first = next(iter(run["servers"].values()))["halves"]
        restart = len(first[0]["result"]["ttfts"]) if len(first) > 1 else None
        for name, srv in run["servers"].items():
            ttft, stored = [], []
            for half in srv["halves"]:
                r = half["result"]
                details = r.get("cached_tokens_details") or [None] * len(r["ttfts"])
                for t, e, d in zip(r["ttfts"], r["errors"], details):
                    ttft.append(float("nan") if e else t)
                    stored.append(bool(d and (d.get("storage") or 0) > 0))
            (line,) = ax.plot(range(1, len(ttft) + 1), ttft, ".-", lw=0.8, label=LABELS.get(name, name))
            xs = [k + 1 for k, s in enumerate(stored) if s]
            if xs:
                ax.plot(xs, [ttft[k - 1] for k in xs], "x", ms=8, color=line.get_color(),
                        label=f"{LABELS.get(name, name)}: took tokens from storage")
        if restart is not None:
            ax.axvline(restart + 0.5, color="k", ls="--", lw=1, label=f"restart ({sec['stop'].upper()}, same store)")
        ax.set_yscale("log")
        ax.set_xlabel("request, in the order sent")
        ax.set_ylabel("time to first token, s (log scale)")
        ax.set_title(f"concurrency {conc}")
        ax.grid(axis="y", which="both", alpha=0.3)
    # one legend under the panels: inside one, it would hide that panel's requests
    handles, labels = fig.axes[-1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=4, fontsize=FONT_SMALL)
