"""Turn the results dict into a Markdown table (printed and saved), results.json and PNG plots."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

PLOTS = ("ceilings", "sglang_vs_file", "sealing", "index_scale", "compression", "s3", "mlx", "server")


def _ok(sec: Any) -> bool:
    return isinstance(sec, dict) and sec.get("status", "ok") == "ok"


def _spread(s: dict[str, Any], fmt: str = "{:.2f}") -> str:
    if not s or s.get("median") is None:
        return "n/a"
    med = fmt.format(s["median"])
    if s.get("min") is None or len(s.get("reps", [])) < 2:
        return med
    return f"{med} ({fmt.format(s['min'])}-{fmt.format(s['max'])})"


def _status(sec: Any) -> str:
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
    pf = c.get("plain_file", {}) if _ok(c) else {}  # also the write headroom of sglang_vs_file below
    out += ["### Ceilings (absolute, this machine)", "", "| what | GB/s |", "|---|---|"]
    if _ok(c):
        cpu = f" (per CPU-second: {_spread(c['memcpy']['cpu_gb_s'])})" if "cpu_gb_s" in c["memcpy"] else ""
        out.append(f"| memory copy (numpy, 1 core) | {_spread(c['memcpy']['gb_s'])}{cpu} |")
        if "write_buffered_gb_s" in pf:
            out.append(f"| plain files: write to the page cache (no fsync, {pf.get('write_buffered_threads', 1)} "
                       f"threads) | {_spread(pf['write_buffered_gb_s'])} |")
        out.append(f"| plain files: write + fsync | {_spread(pf['write_fsync_gb_s'])} |")
        out.append(f"| plain files: cold read (resident before: {max(pf['resident_pages_before_read'])} pages) "
                   f"| {_spread(pf['cold_read_gb_s'])} |")
        for data in ("codec_random_bf16", "codec_real_kv"):
            d = c.get(data)
            if not _ok(d) or d is None:
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
        out.append(f"| {_status(c)} | |")
    s = res["sections"].get("sglang_vs_file")
    out += ["", "### LifeboatCache vs SGLang `file` backend (ratio lifeboat / file, same rep)", ""]
    if _ok(s):
        out += [f"Through SGLang 0.5.23's StorageBackendFactory + HybridCacheController over one MHA host pool, "
                f"64-token bf16 pages, torch threads pinned to {s['torch_threads']}, LifeboatCache compression: "
                f"{s['lifeboat_compression']}; cold reads after the page cache was dropped and checked "
                f"(max resident pages before a cold read: "
                f"{max((max(x['resident_pages_before_cold_read']) for x in s['cases']), default=0)}).", "",
                "Write headroom: the plain-file write into the page cache (ceilings) over `file`'s median "
                "write: how far past `file` a backend that writes every page byte through the page cache "
                "with as many threads could get here. No such column for cold reads: parallel reads beat "
                "the one-thread plain-file cold read.", "",
                "| shape | layout | data | pages x MiB | write | cold read | warm read | write headroom | "
                "lifeboat GB/s w / cold / warm | file GB/s w / cold / warm | CPU s/GB write: lifeboat / file "
                "| CPU s/GB cold read: lifeboat / file |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for x in s["cases"]:
            g, cp = x["gb_s"], x["cpu_s_per_gb"]
            out.append(
                f"| {x['shape']} | {x['layout']} | {x['kind']} | {x['pages']} x {x['page_bytes'] / 2**20:.2f} "
                f"| {_spread(x['ratio']['write'])}x | {_spread(x['ratio']['cold_read'])}x "
                f"| {_spread(x['ratio']['warm_read'])}x "
                f"| {_headroom(pf.get('write_buffered_gb_s'), g['file']['write'])} "
                f"| {_three(g['lifeboat'])} | {_three(g['file'])} "
                f"| {cp['lifeboat']['write']['median']:.2f} / {cp['file']['write']['median']:.2f} "
                f"| {cp['lifeboat']['cold_read']['median']:.2f} / {cp['file']['cold_read']['median']:.2f} |")
    else:
        out.append(_status(s))
    out += sealing_table(res["sections"].get("sealing"))
    ix = res["sections"].get("index_scale")
    out += ["", "### Index scaling", ""]
    rows = _rows(ix)
    if _ok(ix) and rows:
        keys = [k for k in rows[0] if not isinstance(rows[0][k], (dict, list))]
        main = [k for k in keys if k in ("pages", "impl") or any(w in k for w in (
            "p99", "max", "after_fill", "filling_peak", "reopen", "first", "full"))]
        keys = main if len(main) >= 3 else keys
        out += ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        out += ["| " + " | ".join(_num(r.get(k)) for k in keys) + " |" for r in rows]
    else:
        out.append(_status(ix) if not _ok(ix) else "```\n" + json.dumps(ix, indent=1)[:2000] + "\n```")
    cm = res["sections"].get("compression")
    out += ["", "### Compression (one core, ChunkStore put / get from the page cache, small-shape pages)", ""]
    if _ok(cm):
        out += ["| data | compression | ratio | put GB/s | get GB/s | put / get per CPU-second |",
                "|---|---|---|---|---|---|"]
        for data, ch in cm["choices"].items():
            for name, x in ch.items():
                cpu = (f"{_spread(x['put_cpu_gb_s'])} / {_spread(x['get_cpu_gb_s'])}" if "get_cpu_gb_s" in x
                       else "")
                out.append(f"| {data.replace('_', ' ')} | {name} | {x['ratio']:.3f}x | {_spread(x['put_gb_s'])} "
                           f"| {_spread(x['get_gb_s'])} | {cpu} |")
    else:
        out.append(_status(cm))
    s3 = res["sections"].get("s3")
    out += ["", "### S3 (local moto server over HTTP; parallel / single request, promoted / first read)", ""]
    if _ok(s3):
        out += ["| added latency | write MB/s serial / parallel | read MB/s serial / parallel | first read p50 "
                "| promoted read p50 | promoted speedup |", "|---|---|---|---|---|---|"]
        for lat, x in s3["latencies"].items():
            out.append(f"| {lat} ms | {x['write_serial_mb_s']:.0f} / {x['write_parallel_mb_s']:.0f} "
                       f"({x['write_ratio']:.1f}x) | {x['read_serial_mb_s']:.0f} / {x['read_parallel_mb_s']:.0f} "
                       f"({x['read_ratio']:.1f}x) | {x['first_read']['p50_ms']:.2f} ms "
                       f"| {x['promoted_read']['p50_ms']:.2f} ms | {x['promoted_speedup_p50']:.1f}x |")
        rb = s3.get("rebuild")
        out.append("")
        out.append("S3 rebuild: " + (json.dumps({k: v for k, v in rb.items() if k != "status"})[:1500]
                                     if _ok(rb) else _status(rb)))
    else:
        out.append(_status(s3))
    ml = res["sections"].get("mlx")
    out += ["", "### MLX time to first token", ""]
    if _ok(ml):
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
        out.append(_status(ml))
    out += server_tables(res["sections"].get("server"))
    return "\n".join(out) + "\n"


def sealing_table(se: Any) -> list[str]:
    """Sealed / unsealed: the per-core primitives, then through SGLang's factory on the host pool."""
    out = ["", "### Sealed records (`encryption:` on) vs unsealed (ratio sealed / unsealed, same rep)", ""]
    if not _ok(se):
        return out + [_status(se)]
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
            "| shape | layout | data | pages x MiB | write | cold read | warm read | sealed GB/s w / cold / warm "
            "| unsealed GB/s w / cold / warm | CPU s/GB write: sealed / unsealed | CPU s/GB cold read: "
            "sealed / unsealed |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for x in se["cases"]:
        g, cp = x["gb_s"], x["cpu_s_per_gb"]
        out.append(
            f"| {x['shape']} | {x['layout']} | {x['kind']} | {x['pages']} x {x['page_bytes'] / 2**20:.2f} "
            f"| {_spread(x['ratio']['write'])}x | {_spread(x['ratio']['cold_read'])}x "
            f"| {_spread(x['ratio']['warm_read'])}x | {_three(g['sealed'])} | {_three(g['unsealed'])} "
            f"| {cp['sealed']['write']['median']:.2f} / {cp['unsealed']['write']['median']:.2f} "
            f"| {cp['sealed']['cold_read']['median']:.2f} / {cp['unsealed']['cold_read']['median']:.2f} |")
    return out


def _ms(s: Any) -> str:
    return "n/a" if s is None else f"{s * 1e3:,.0f} ms"


def _x(r: Any) -> str:
    return "n/a" if r is None else f"{r:.2f}x"


def server_tables(sv: Any) -> list[str]:
    """The `server` section: time to first token of a returning prompt, and the start times."""
    out = ["", "### SGLang server on CPU: time to first token of a returning prompt, after a restart", ""]
    if not _ok(sv):
        return out + [_status(sv)]
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


def _rows(sec: Any) -> list[dict[str, Any]]:
    """The per-size rows of a section owned elsewhere: the first list of dicts found in it."""
    if not isinstance(sec, dict):
        return []
    for v in sec.values():
        if isinstance(v, list) and v and all(isinstance(r, dict) for r in v):
            return v
    return []


# --------------------------------------------------------------------------------------- plots


def _placeholder(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True)
    ax.set_axis_off()


def plots(res: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    label = f"{res['machine']['cpu']}, {res['machine']['cores']} cores"
    paths = []
    for name in PLOTS:
        fig, ax = plt.subplots(figsize=(8, 4.2), dpi=80)
        sec = res["sections"].get(name)
        try:
            if not _ok(sec):
                _placeholder(ax, f"{name}: {_status(sec)}")
            else:
                globals()[f"_plot_{name}"](ax, sec)
        except Exception as e:  # noqa: BLE001 - a plot must never lose the results
            ax.clear()
            _placeholder(ax, f"{name}: plot failed: {e}")
        fig.suptitle(f"{name.replace('_', ' ')} ({label})", fontsize=9)
        fig.tight_layout()
        p = out / f"{name}.png"
        fig.savefig(p)
        plt.close(fig)
        paths.append(p)
    return paths


def _bars(ax: Any, labels: list[str], series: dict[str, list[tuple[float, float, float]]], ylabel: str) -> None:
    n = len(series)
    w = 0.8 / max(n, 1)
    for i, (name, vals) in enumerate(series.items()):
        xs = [j + (i - (n - 1) / 2) * w for j in range(len(labels))]
        med = [v[0] for v in vals]
        err = [[max(0.0, v[0] - v[1]) for v in vals], [max(0.0, v[2] - v[0]) for v in vals]]
        ax.bar(xs, med, w, yerr=err, label=name, capsize=2)
    ax.set_xticks(range(len(labels)), labels, fontsize=7, rotation=20, ha="right")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)


def _mmm(s: dict[str, Any]) -> tuple[float, float, float]:
    med = s["median"]
    return (med, med if s["min"] is None else s["min"], med if s["max"] is None else s["max"])


def _plot_ceilings(ax: Any, c: dict[str, Any]) -> None:
    labels, vals = ["memcpy", "file write+fsync", "file cold read"], [
        _mmm(c["memcpy"]["gb_s"]), _mmm(c["plain_file"]["write_fsync_gb_s"]), _mmm(c["plain_file"]["cold_read_gb_s"])]
    for data in ("codec_random_bf16", "codec_real_kv"):
        d = c.get(data)
        if _ok(d) and d:
            for mode in ("raw", "compressed"):
                tag = "real" if "real" in data else "rand"
                labels += [f"enc {mode} {tag}", f"dec {mode} {tag}"]
                vals += [_mmm(d[mode]["encode_gb_s"]), _mmm(d[mode]["decode_gb_s"])]
    _bars(ax, labels, {"GB/s (one core for the codec)": vals}, "GB/s")


def _plot_sglang_vs_file(ax: Any, s: dict[str, Any]) -> None:
    labels = [f"{x['shape']} {x['layout']} {x['kind']}" for x in s["cases"]]
    series = {p.replace("_", " "): [_mmm(x["ratio"][p]) for x in s["cases"]]
              for p in ("write", "cold_read", "warm_read")}
    _bars(ax, labels, series, "LifeboatCache / file")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axhline(2.0, color="grey", lw=0.8, ls="--")


def _plot_sealing(ax: Any, se: dict[str, Any]) -> None:
    labels = [f"{x['shape']} {x['layout']}" for x in se["cases"]]
    series = {p.replace("_", " "): [_mmm(x["ratio"][p]) for x in se["cases"]]
              for p in ("write", "cold_read", "warm_read")}
    _bars(ax, labels, series, "sealed / unsealed")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axhline(0.85, color="grey", lw=0.8, ls="--")


def _plot_index_scale(ax: Any, ix: dict[str, Any]) -> None:
    """Latency-like columns (p99, max, reopen / first hit / full index) on the left axis, bytes per
    page on the right, against stored pages; whatever columns the index module reports."""
    rows = _rows(ix)
    xkey = next((k for k in ("pages", "n_pages", "stored_pages", "size") if rows and k in rows[0]), None)
    if not rows or xkey is None:
        _placeholder(ax, "index scale: no per-size rows to plot")
        return
    xs = [r[xkey] for r in rows]
    num = [k for k, v in rows[0].items() if k != xkey and isinstance(v, (int, float)) and not isinstance(v, bool)]
    times = [k for k in num if "p99" in k or k.startswith("max") or any(w in k for w in ("reopen", "first", "full"))]
    space = [k for k in num if "per_page" in k and any(w in k for w in ("after", "peak", "filling_max"))]
    for k in times:
        ax.plot(xs, [r.get(k) for r in rows], marker="o", label=k)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xkey)
    ax.set_ylabel("ms (or s)")
    ax.legend(fontsize=6, loc="upper left")
    if space:
        ax2 = ax.twinx()
        for k in space:
            ax2.plot(xs, [r.get(k) for r in rows], marker="s", ls="--", label=k)
        ax2.set_ylabel("bytes per page")
        ax2.legend(fontsize=6, loc="lower right")


def _plot_compression(ax: Any, cm: dict[str, Any]) -> None:
    labels, put, get, ratio = [], [], [], []
    for data, ch in cm["choices"].items():
        for name, x in ch.items():
            labels.append(f"{data.replace('_', ' ')}\n{name}")
            put.append(_mmm(x["put_gb_s"]))
            get.append(_mmm(x["get_gb_s"]))
            ratio.append((x["ratio"], x["ratio"], x["ratio"]))
    _bars(ax, labels, {"put GB/s": put, "get GB/s": get, "ratio (x)": ratio}, "GB/s, ratio")


def _plot_s3(ax: Any, s3: dict[str, Any]) -> None:
    labels, ser, par = [], [], []
    for lat, x in s3["latencies"].items():
        for op in ("write", "read"):
            labels.append(f"{op} +{lat} ms")
            a, b = x[f"{op}_serial_mb_s"], x[f"{op}_parallel_mb_s"]
            ser.append((a, a, a))
            par.append((b, b, b))
    _bars(ax, labels, {"1 request at a time": ser, "parallel": par}, "MB/s")


def _plot_mlx(ax: Any, ml: dict[str, Any]) -> None:
    xs = [p["prompt_tokens"] for p in ml["prompts"]]
    for key, name in (("recompute_ttft_s", "recompute"), ("restored_ttft_s", "restored (LifeboatCache)"),
                      ("memory_hit_ttft_s", "SGLang in-memory hit")):
        ax.plot(xs, [p[key] * 1e3 for p in ml["prompts"]], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("time to first token, ms")
    ax.legend(fontsize=7)


def _plot_server(ax: Any, sv: dict[str, Any]) -> None:
    labels = [f"{p['tokens']} tokens" for p in sv["prompts"]]

    def one(k: str) -> list[tuple[float, float, float]]:
        return [(p[k] or 0.0,) * 3 for p in sv["prompts"]]

    _bars(ax, labels, {"recomputed": one("recompute_s"), "restored: LifeboatCache": one("lifeboat_restored_s"),
                       "restored: file": one("file_restored_s")}, "time to first token, s")


def write(res: dict[str, Any], out: Path) -> tuple[str, list[Path]]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1, default=_json_default))
    md = tables(res)
    (out / "results.md").write_text(md)
    return md, plots(res, out)


def _json_default(o: Any) -> Any:
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, float) and math.isnan(o):
        return None
    return str(o)
