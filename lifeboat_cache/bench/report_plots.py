"""The PNG plots of a `lifeboat bench` run: one per section in PLOTS, a placeholder where the section
did not run or its plot failed (a plot must never lose the results)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from .report_retention import plot_retention
from .report_tables import section_ok, section_rows, section_status

PLOTS = ("ceilings", "sglang_vs_file", "sealing", "index_scale", "compression", "retention", "s3", "mlx", "server")


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
            if not section_ok(sec):
                _placeholder(ax, f"{name}: {section_status(sec)}")
            else:
                _PLOTTERS[name](ax, sec)
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
        if section_ok(d) and d:
            for mode in ("raw", "compressed"):
                tag = "real" if "real" in data else "rand"
                labels += [f"enc {mode} {tag}", f"dec {mode} {tag}"]
                vals += [_mmm(d[mode]["encode_gb_s"]), _mmm(d[mode]["decode_gb_s"])]
    _bars(ax, labels, {"GB/s (one core for the codec)": vals}, "GB/s")


def _plot_ratios(ax: Any, cases: list[dict[str, Any]], label_keys: tuple[str, ...], ylabel: str,
                 guide: float) -> None:
    """Per case, the write / cold read / warm read ratios of one backend over another (same rep), with
    a line at 1.0 (parity) and a dashed one at `guide` (the figure the section aims for)."""
    labels = [" ".join(str(x[k]) for k in label_keys) for x in cases]
    series = {p.replace("_", " "): [_mmm(x["ratio"][p]) for x in cases]
              for p in ("write", "cold_read", "warm_read")}
    _bars(ax, labels, series, ylabel)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axhline(guide, color="grey", lw=0.8, ls="--")


def _plot_sglang_vs_file(ax: Any, s: dict[str, Any]) -> None:
    _plot_ratios(ax, s["cases"], ("shape", "layout", "kind"), "LifeboatCache / file", 2.0)


def _plot_sealing(ax: Any, se: dict[str, Any]) -> None:
    _plot_ratios(ax, se["cases"], ("shape", "layout"), "sealed / unsealed", 0.85)


def _plot_index_scale(ax: Any, ix: dict[str, Any]) -> None:
    """Latency-like columns (p99, max, reopen / first hit / full index) on the left axis, bytes per
    page on the right, against stored pages; whatever columns the index module reports."""
    rows = section_rows(ix)
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


#: The plot of each section in PLOTS (one missing here shows as that section's "plot failed" placeholder).
_PLOTTERS: dict[str, Callable[[Any, dict[str, Any]], None]] = {
    "ceilings": _plot_ceilings, "sglang_vs_file": _plot_sglang_vs_file, "sealing": _plot_sealing,
    "index_scale": _plot_index_scale, "compression": _plot_compression, "retention": plot_retention, "s3": _plot_s3,
    "mlx": _plot_mlx,
    "server": _plot_server,
}
