"""The Markdown tables of a `lifeboat bench` run (printed and saved as results.md).

One table (or a status line) per section of the results dict. `section_ok`, `section_status` and
`section_rows` read a section the same way for the plots (`report_plots`).
"""

from __future__ import annotations

import json
from typing import Any


def section_ok(sec: Any) -> bool:
    return isinstance(sec, dict) and sec.get("status", "ok") == "ok"


def _spread(s: dict[str, Any], fmt: str = "{:.2f}") -> str:
    if not s or s.get("median") is None:
        return "n/a"
    med = fmt.format(s["median"])
    if s.get("min") is None or len(s.get("reps", [])) < 2:
        return med
    return f"{med} ({fmt.format(s['min'])}-{fmt.format(s['max'])})"


def section_status(sec: Any) -> str:
    if isinstance(sec, dict):
        return f"{sec.get('status', 'error')}: {sec.get('reason') or sec.get('error', '')}".strip(": ")
    return "missing"


def _headroom(ceiling: dict[str, Any] | None, file: dict[str, Any]) -> str:
    """A plain-file ceiling's median over the file backend's median ('-' without the ceiling)."""
    if not ceiling or not file.get("median"):
        return "-"
    return f"{ceiling['median'] / file['median']:.2f}x"


def tables(res: dict[str, Any]) -> str:
    """The Markdown tables of one run."""
    m = res["machine"]
    out = [f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB RAM, Linux {m['kernel']}, "
           f"load {' / '.join(str(x) for x in m['load_avg'])} at start; "
           f"{'quick' if res['quick'] else 'full'} run, {res['elapsed_s']:.0f} s. "
           "Medians over reps, (min-max) across reps.", ""]
    c = res["sections"].get("ceilings")
    pf = c.get("plain_file", {}) if section_ok(c) else {}  # also the write headroom of sglang_vs_file below
    out += ["### Ceilings (absolute, this machine)", "", "| what | GB/s |", "|---|---|"]
    if section_ok(c):
        cpu = f" (per CPU-second: {_spread(c['memcpy']['cpu_gb_s'])})" if "cpu_gb_s" in c["memcpy"] else ""
        out.append(f"| memory copy (numpy, 1 core) | {_spread(c['memcpy']['gb_s'])}{cpu} |")
        if "write_buffered_gb_s" in pf:
            out.append(f"| plain files: write to the page cache (no fsync, {pf.get('write_buffered_threads', 1)} "
                       f"threads) | {_spread(pf['write_buffered_gb_s'])} |")
        out.append(f"| plain files: write + fsync | {_spread(pf['write_fsync_gb_s'])} |")
        out.append(f"| plain files: cold read (resident before: {max(pf['resident_pages_before_read'])} pages) "
                   f"| {_spread(pf['cold_read_gb_s'])} |")
        wc = c.get("write_calls")
        if wc:
            mark = wc["store_bound_kib"]
            out.append(f"| one file, single write calls after a {wc['pause_s']:g} s pause, by call size (KiB; * the "
                       f"store's bound): GB/s, kernel CPU s/GB | "
                       + "; ".join(f"{k}{'*' if int(k) == mark else ''}: {_spread(v['gb_s'])}, "
                                   f"{v['kernel_cpu_s_per_gb']['median']:.2f}" for k, v in wc["by_call_kib"].items())
                       + " |")
        rw = c.get("write_runway")
        if rw:
            order = rw["reporting_order"]
            out.append(f"| {rw['files']} new files of {rw['file_mib']} MiB back to back, by call size (KiB; * the "
                       f"store's bound): GiB written before the first file at half the first's speed "
                       f"(free memory reported to the host from order {order if order is not None else '- (none)'}) | "
                       + "; ".join(f"{k}{'*' if int(k) == rw['store_bound_kib'] else ''}: {v['fast_gib']:.2f} "
                                   f"of {len(v['gb_s_per_file']) * rw['file_mib'] / 1024:.2f}"
                                   for k, v in rw["by_call_kib"].items()) + " |")
        for data in ("codec_random_bf16", "codec_real_kv"):
            d = c.get(data)
            if not section_ok(d) or d is None:
                continue
            for mode in ("raw", "compressed"):
                x = d[mode]
                cpu = (f" (per CPU-second: {_spread(x['encode_cpu_gb_s'])} / {_spread(x['decode_cpu_gb_s'])})"
                       if "decode_cpu_gb_s" in x else "")
                if "zstd_only_cpu_gb_s" in x:  # the floor under decode: zstd frames alone, no merge/checksum
                    cpu = cpu[:-1] + f"; zstd frames alone: decode {_spread(x['zstd_only_cpu_gb_s'])})"
                out.append(f"| codec {mode}, {data[6:].replace('_', ' ')}, 1 core (ratio {x['ratio']:.2f}x): "
                           f"encode / decode | {_spread(x['encode_gb_s'])} / {_spread(x['decode_gb_s'])}{cpu} |")
    else:
        out.append(f"| {section_status(c)} | |")
    s = res["sections"].get("sglang_vs_file")
    out += ["", "### LifeboatCache vs SGLang `file` backend (ratio lifeboat / file, same rep)", ""]
    if section_ok(s):
        out += [f"Through SGLang 0.5.23's StorageBackendFactory + HybridCacheController over one MHA host pool, "
                f"64-token bf16 pages, torch threads pinned to {s['torch_threads']}, LifeboatCache tier: "
                f"{s.get('lifeboat_tier', 'local')}, compression: {s['lifeboat_compression']}; "
                "cold reads after the page cache was dropped and checked "
                f"(max resident pages before a cold read: "
                f"{max((max(x['resident_pages_before_cold_read']) for x in s['cases']), default=0)}).", "",
                "Write headroom: the plain-file write into the page cache (ceilings) over `file`'s median "
                "write: how far past `file` a backend that writes every page byte through the page cache "
                "with as many threads could get here. No such column for cold reads: parallel reads beat "
                "the one-thread plain-file cold read.", "",
                f"Writes: after a pause of {s.get('write_pause_ms', 0) / 1000:g} s (as between a server's bursts of "
                "backups), and again at once (a burst's second write); both are what users see.", "",
                "| shape | layout | data | pages x MiB | write after a pause | write in a burst | cold read | "
                "warm read | write headroom | lifeboat GB/s w / cold / warm | file GB/s w / cold / warm "
                "| CPU s/GB write: lifeboat / file | CPU s/GB cold read: lifeboat / file |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for x in s["cases"]:
            out.append(_case_row(x, "lifeboat", "file",
                                 _headroom(pf.get("write_buffered_gb_s"), x["gb_s"]["file"]["write"])))
    else:
        out.append(section_status(s))
    out += sealing_table(res["sections"].get("sealing"))
    ix = res["sections"].get("index_scale")
    out += ["", "### Index scaling", ""]
    rows = section_rows(ix)
    if section_ok(ix) and rows:
        keys = [k for k in rows[0] if not isinstance(rows[0][k], (dict, list))]
        main = [k for k in keys if k in ("pages", "impl") or any(w in k for w in (
            "p99", "max", "after_fill", "filling_peak", "reopen", "first", "full"))]
        keys = main if len(main) >= 3 else keys
        out += ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        out += ["| " + " | ".join(_num(r.get(k)) for k in keys) + " |" for r in rows]
    else:
        out.append(section_status(ix) if not section_ok(ix) else "```\n" + json.dumps(ix, indent=1)[:2000] + "\n```")
    cm = res["sections"].get("compression")
    out += ["", "### Compression (one core, ChunkStore put / get from the page cache, small-shape pages)", ""]
    if section_ok(cm):
        out += ["| data | compression | ratio | put GB/s | get GB/s | put / get per CPU-second |",
                "|---|---|---|---|---|---|"]
        for data, ch in cm["choices"].items():
            for name, x in ch.items():
                cpu = (f"{_spread(x['put_cpu_gb_s'])} / {_spread(x['get_cpu_gb_s'])}" if "get_cpu_gb_s" in x
                       else "")
                out.append(f"| {data.replace('_', ' ')} | {name} | {x['ratio']:.3f}x | {_spread(x['put_gb_s'])} "
                           f"| {_spread(x['get_gb_s'])} | {cpu} |")
    else:
        out.append(section_status(cm))
    s3 = res["sections"].get("s3")
    out += ["", "### S3 (moto and Ceph RGW on loopback, over HTTP; parallel / single request, promoted / first "
            "read)", ""]
    if section_ok(s3):
        out += ["| server | write MB/s serial / parallel | read MB/s serial / parallel | first read p50 "
                "| promoted read p50 | promoted speedup |", "|---|---|---|---|---|---|"]
        rows = [(f"moto, +{lat} ms per request", x) for lat, x in s3["latencies"].items()]
        ceph = s3.get("ceph")
        if section_ok(ceph):
            rows.append((f"Ceph 16.2 RGW, memstore OSD (up in {ceph['start_s']:.0f} s)", ceph))
        for name, x in rows:
            out.append(f"| {name} | {x['write_serial_mb_s']:.0f} / {x['write_parallel_mb_s']:.0f} "
                       f"({x['write_ratio']:.1f}x) | {x['read_serial_mb_s']:.0f} / {x['read_parallel_mb_s']:.0f} "
                       f"({x['read_ratio']:.1f}x) | {x['first_read']['p50_ms']:.2f} ms "
                       f"| {x['promoted_read']['p50_ms']:.2f} ms | {x['promoted_speedup_p50']:.1f}x |")
        if ceph is not None and not section_ok(ceph):
            out += ["", "Ceph RGW: " + section_status(ceph)]
        rb = s3.get("rebuild")
        out.append("")
        out.append("S3 rebuild: " + (json.dumps({k: v for k, v in rb.items() if k != "status"})[:1500]
                                     if section_ok(rb) else section_status(rb)))
    else:
        out.append(section_status(s3))
    ml = res["sections"].get("mlx")
    out += ["", "### MLX time to first token", ""]
    if section_ok(ml):
        one_proc = any(p.get("processes") == 1 for p in ml["prompts"])
        how = ("one process: recompute, forget the tree, restore (warm page cache), in-memory hit" if one_proc else
               "fresh process each: recompute; restore with the store's page cache dropped; SGLang's radix "
               "cache, prompt twice (in-memory hit)")
        out += [f"{ml['model']}, {ml['new_tokens']} new tokens, {ml['cores']} cores; {how}.", "",
                "| prompt tokens | recompute | restored | SGLang in-memory hit "
                "| speedup vs recompute | restored / in-memory hit | same tokens |",
                "|---|---|---|---|---|---|---|"]
        for p in ml["prompts"]:
            out.append(f"| {p['prompt_tokens']} | {p['recompute_ttft_s'] * 1e3:.0f} ms "
                       f"| {p['restored_ttft_s'] * 1e3:.0f} ms | {p['memory_hit_ttft_s'] * 1e3:.0f} ms "
                       f"| {p['speedup_vs_recompute']:.1f}x | {p['restored_vs_memory_hit']:.2f}x "
                       f"| {p['tokens_identical']} |")
    else:
        out.append(section_status(ml))
    out += server_tables(res["sections"].get("server"))
    return "\n".join(out) + "\n"


def sealing_table(se: Any) -> list[str]:
    """Sealed / unsealed: the per-core primitives, then through SGLang's factory on the host pool."""
    out = ["", "### Sealed records (`encryption:` on) vs unsealed (ratio sealed / unsealed, same rep)", ""]
    if not section_ok(se):
        return out + [section_status(se)]
    out += ["One core, the store's record build / open (`Sealer`), GB of page per CPU-second:", "",
            "| pages | unsealed build / open | sealed build / open | ratio build / open |", "|---|---|---|---|"]
    for name, row in se["primitives"].items():
        if name == "aes_gcm":
            continue
        out.append(f"| {name} | {_spread(row['plain']['build_cpu_gb_s'])} / {_spread(row['plain']['open_cpu_gb_s'])} "
                   f"| {_spread(row['sealed']['build_cpu_gb_s'])} / {_spread(row['sealed']['open_cpu_gb_s'])} "
                   f"| {row['write_ratio']:.2f}x / {row['read_ratio']:.2f}x |")
    a = se["primitives"]["aes_gcm"]
    out += ["", f"AES-256-GCM alone (cryptography, OpenSSL), one core, 8 MiB buffers: seal "
                f"{a['seal_cpu_gb_s']:.2f} GB/s, open {a['open_cpu_gb_s']:.2f} GB/s per CPU-second.", "",
            "Through SGLang 0.5.23's StorageBackendFactory + HybridCacheController over one MHA host pool, "
            f"LifeboatCache's default settings, torch threads pinned to {se['torch_threads']}:", "",
            "| shape | layout | data | pages x MiB | write after a pause | write in a burst | cold read | warm read "
            "| sealed GB/s w / cold / warm | unsealed GB/s w / cold / warm | CPU s/GB write: sealed / unsealed "
            "| CPU s/GB cold read: sealed / unsealed |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    out += [_case_row(x, "sealed", "unsealed") for x in se["cases"]]
    return out


def _case_row(x: dict[str, Any], a: str, b: str, *extra: str) -> str:
    """One case of a side-by-side section (sglang_vs_file: lifeboat / file; sealing: sealed / unsealed):
    shape, ratios a / b, `extra` cells, then a's and b's GB/s and CPU seconds per GB."""
    g, cp = x["gb_s"], x["cpu_s_per_gb"]
    cells = [x["shape"], x["layout"], x["kind"], f"{x['pages']} x {x['page_bytes'] / 2**20:.2f}",
             *(f"{_spread(x['ratio'][op])}x" if op in x["ratio"] else "-"
               for op in ("write", "write_burst", "cold_read", "warm_read")), *extra,
             _three(g[a]), _three(g[b]),
             *(f"{cp[a][op]['median']:.2f} / {cp[b][op]['median']:.2f}" for op in ("write", "cold_read"))]
    return "| " + " | ".join(cells) + " |"


def _ms(s: Any) -> str:
    return "n/a" if s is None else f"{s * 1e3:,.0f} ms"


def _x(r: Any) -> str:
    return "n/a" if r is None else f"{r:.2f}x"


def server_tables(sv: Any) -> list[str]:
    """The `server` section: time to first token of a returning prompt, and the start times."""
    out = ["", "### SGLang server on CPU: time to first token of a returning prompt, after a restart", ""]
    if not section_ok(sv):
        return out + [section_status(sv)]
    st = sv["start"]
    load = {k: " / ".join(map(str, v)) for k, v in sv["load_avg"].items()}
    out += [f"{sv['model']}, `python -m sglang.launch_server {sv['flags']}` + HiCache (`--hicache-storage-backend "
            f"dynamic` LifeboatCache / `file`), {sv['cores']} cores, load {load['start']} at start, {load['end']} "
            "at end. One wall-time `/generate` with "
            "max_new_tokens=1 per cell, each on a fresh server process after one warm-up request: recomputed on an "
            "empty store; restored after the prompts' backups settled, SIGTERM, page cache of the store dropped "
            f"(resident before: {sv['resident_pages_before_restore']}), a new server on the same store. Speedup = "
            "recomputed / restored; LifeboatCache vs file = file's time / LifeboatCache's (same run). Same tokens: "
            f"first token and {sv['check_tokens']} greedy tokens identical to the cold run.", "",
            "| prompt tokens | recomputed | restored: LifeboatCache | restored: file | speedup LifeboatCache "
            "| speedup file | LifeboatCache vs file | storage tokens LifeboatCache / file (of restorable) "
            "| same tokens LifeboatCache / file |", "|---|---|---|---|---|---|---|---|---|"]
    for p in sv["prompts"]:
        out.append(f"| {p['tokens']:,} | {_ms(p['recompute_s'])} | {_ms(p['lifeboat_restored_s'])} "
                   f"| {_ms(p['file_restored_s'])} | {_x(p['lifeboat_speedup'])} | {_x(p['file_speedup'])} "
                   f"| {_x(p['lifeboat_vs_file'])} | {p['lifeboat_storage_tokens']:,} / {p['file_storage_tokens']:,} "
                   f"({p['restorable_tokens']:,}) | {p['lifeboat_tokens_identical']} / {p['file_tokens_identical']} |")
    rb = st.get("index_rebuild") or {}
    rebuild = f"{rb['pages']:,} pages in {rb['ms']:,} ms" if rb else "no log line"
    f = st["filler"]
    out += ["", f"Server start (launch to `/health` 200) and its first request ({st['first_request_tokens']:,} "
            "fresh tokens, right after ready: recomputed; on the big store while its index rebuild may still run). "
            f"Big store: the prompts' pages plus {f['pages']:,} filler pages of {f['page_kib']} KiB under another "
            "model id, index snapshot removed (a full scan, as after a crash).", "",
            "| server | start | first request | index rebuild (server log) |", "|---|---|---|---|",
            f"| LifeboatCache, empty store | {st['empty_store_s']:.1f} s | {_ms(st['first_request_empty_s'])} | - |",
            f"| LifeboatCache, {f['pages']:,}-page store | {st['big_store_s']:.1f} s "
            f"| {_ms(st['first_request_big_s'])} ({_x(st['first_request_big_vs_empty'])} of empty) | {rebuild} |",
            f"| file, empty directory | {st['file_empty_s']:.1f} s | {_ms(st['file_first_request_s'][0])} | - |",
            f"| file, the prompts' pages | {st['file_stored_s']:.1f} s | {_ms(st['file_first_request_s'][1])} | - |"]
    return out


def _three(g: dict[str, Any]) -> str:
    return " / ".join(f"{g[p]['median']:.2f}" for p in ("write", "cold_read", "warm_read"))


def _num(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def section_rows(sec: Any) -> list[dict[str, Any]]:
    """The per-size rows of a section owned elsewhere: the first list of dicts found in it."""
    if not isinstance(sec, dict):
        return []
    for v in sec.values():
        if isinstance(v, list) and v and all(isinstance(r, dict) for r in v):
            return v
    return []
