"""The PNG plots of a `lifeboat bench` run: one per section in PLOTS, a placeholder where the section
did not run or its plot failed (a plot must never lose the results).

Each figure is read by someone who did not run the bench: one quantity per axis with its unit in the
label, log axes where values span decades, a legend entry for every line (reference lines included), and
a title naming the machine and whether the run was `--quick`. `figures` returns the Figure objects so a
test can check that through matplotlib's objects; `plots` saves them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .report_index_plot import plot_index_scale
from .report_retention import plot_retention
from .report_serving import plot_serving
from .report_tables import section_ok, section_status

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PLOTS = ("ceilings", "sglang_vs_file", "sealing", "index_scale", "compression", "retention", "s3", "mlx", "server",
         "serving")

#: 13 x 100 = 1300 px wide: readable when a README shows it at full width, fonts sized to match.
FIGSIZE, DPI, FONT = (13.0, 6.0), 100, 11
TITLES = {"ceilings": "Ceilings: what this machine can do at most", "sglang_vs_file": "LifeboatCache vs SGLang's file "
          "backend (same rep)", "sealing": "Sealed vs unsealed records (same rep)", "index_scale": "Index scaling",
          "compression": "Compression (one core, ChunkStore put / get)", "retention": "Retention in a full store",
          "s3": "S3 tier (moto and Ceph RGW on loopback, over HTTP)", "mlx": "MLX time to first token",
          "server": "SGLang CPU server: time to first token of a returning prompt",
          "serving": "Many returning users: SGLang's bench_serving on a CPU server, restarted mid-run"}


def title(name: str, res: dict[str, Any]) -> str:
    """The figure's title: what, on which machine, and whether the numbers come from a `--quick` run."""
    m = res["machine"]
    run = "quick run (--quick: small sizes, few reps)" if res.get("quick") else "full run"
    return f"{TITLES.get(name, name)}\n{m['cpu']}, {m['cores']} cores; {run}"


def figures(res: dict[str, Any]) -> dict[str, Figure]:
    """One Figure per section in PLOTS, not yet saved (no pyplot: nothing global to close)."""
    import matplotlib
    from matplotlib.figure import Figure

    out = {}
    with matplotlib.rc_context({"font.size": FONT, "legend.fontsize": FONT - 1}):
        for name in PLOTS:
            fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
            sec = res["sections"].get(name)
            try:
                if not section_ok(sec):
                    placeholder(fig.add_subplot(), f"{name}: {section_status(sec)}")
                else:
                    _PLOTTERS[name](fig, sec)
            except Exception as e:  # noqa: BLE001 - a plot must never lose the results
                fig.clear()
                placeholder(fig.add_subplot(), f"{name}: plot failed: {e}")
            fig.suptitle(title(name, res), fontsize=FONT + 2)
            out[name] = fig
    return out


def plots(res: dict[str, Any], out: Path) -> list[Path]:
    paths = []
    for name, fig in figures(res).items():
        p = out / f"{name}.png"
        fig.savefig(p)
        paths.append(p)
    return paths


def placeholder(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True)
    ax.set_axis_off()


def _bars(ax: Axes, labels: list[str], series: dict[str, list[tuple[float, float, float]]], ylabel: str,
          values: str | None = None) -> None:
    """Grouped bars (median, error bar min-max); `values` formats a number above each bar."""
    n = len(series)
    w = 0.8 / max(n, 1)
    for i, (name, vals) in enumerate(series.items()):
        xs = [j + (i - (n - 1) / 2) * w for j in range(len(labels))]
        med = [v[0] for v in vals]
        err = [[max(0.0, v[0] - v[1]) for v in vals], [max(0.0, v[2] - v[0]) for v in vals]]
        bars = ax.bar(xs, med, w, yerr=err if any(any(e) for e in err) else None, label=name, capsize=3)
        if values:
            ax.bar_label(bars, [values.format(v) if v == v else "" for v in med], fontsize=FONT - 2)
            ax.margins(y=0.15)  # room above the tallest bar for its number and the legend
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right")
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)


def _mmm(s: dict[str, Any]) -> tuple[float, float, float]:
    med = s["median"]
    return (med, med if s["min"] is None else s["min"], med if s["max"] is None else s["max"])


def _plot_ceilings(fig: Figure, c: dict[str, Any]) -> None:
    labels, vals = ["memcpy", "file write+fsync", "file cold read"], [
        _mmm(c["memcpy"]["gb_s"]), _mmm(c["plain_file"]["write_fsync_gb_s"]), _mmm(c["plain_file"]["cold_read_gb_s"])]
    if "write_buffered_gb_s" in c["plain_file"]:
        labels.insert(1, "file write (page cache)")
        vals.insert(1, _mmm(c["plain_file"]["write_buffered_gb_s"]))
    for data in ("codec_random_bf16", "codec_real_kv"):
        d = c.get(data)
        if section_ok(d) and d:
            for mode in ("raw", "compressed"):
                tag = "real KV" if "real" in data else "random"
                labels += [f"encode {mode}, {tag}", f"decode {mode}, {tag}"]
                vals += [_mmm(d[mode]["encode_gb_s"]), _mmm(d[mode]["decode_gb_s"])]
    ax = fig.add_subplot()
    _bars(ax, labels, {"median (error bar: min-max across reps); codec on one core": vals}, "throughput, GB/s",
          "{:.2f}")
    ax.set_xlabel("operation")
    ax.legend(loc="upper right")


def _plot_ratios(fig: Figure, cases: list[dict[str, Any]], label_keys: tuple[str, ...], ylabel: str,
                 guides: list[tuple[float, str]]) -> None:
    """Per case, the ratios of one backend over another (same rep), a solid line at 1.0 (parity) and a
    dashed or dotted one per guide (value, label: a figure the section aims for), each in the legend."""
    ax = fig.add_subplot()
    labels = [" ".join(str(x[k]) for k in label_keys) for x in cases]
    ops = [p for p in ("write", "write_burst", "cold_read", "warm_read") if all(p in x["ratio"] for x in cases)]
    names = {"write": "write after a pause", "write_burst": "write in a burst", "cold_read": "cold read",
             "warm_read": "warm read"}
    _bars(ax, labels, {names[p]: [_mmm(x["ratio"][p]) for x in cases] for p in ops}, ylabel)
    ax.axhline(1.0, color="black", lw=1, label="parity (1.0x)")
    for (value, label), style in zip(guides, ("--", ":")):
        ax.axhline(value, color="tab:red", lw=1.2, ls=style, label=label)
    ax.set_xlabel("case: shape, layout, data (bars: median; error bars: min-max across reps)")
    ax.legend(loc="upper left", ncols=2)


def _plot_sglang_vs_file(fig: Figure, s: dict[str, Any]) -> None:
    _plot_ratios(fig, s["cases"], ("shape", "layout", "kind"), "LifeboatCache / file, x (higher is better)",
                 [(2.0, "target: 2x file")])


def _plot_sealing(fig: Figure, se: dict[str, Any]) -> None:
    _plot_ratios(fig, se["cases"], ("shape", "layout", "kind"), "sealed / unsealed, x (higher is better)",
                 [(0.9, "target: writes at least 0.9x"), (0.95, "target: reads at least 0.95x")])


def _plot_compression(fig: Figure, cm: dict[str, Any]) -> None:
    """Throughput and compression ratio on separate panels: they are different quantities."""
    labels, put, get, ratio = [], [], [], []
    for data, ch in cm["choices"].items():
        for name, x in ch.items():
            labels.append(f"{data.replace('_', ' ')}: {name}")
            put.append(_mmm(x["put_gb_s"]))
            get.append(_mmm(x["get_gb_s"]))
            ratio.append((x["ratio"],) * 3)
    speed, size = fig.subplots(1, 2, width_ratios=(2, 1))
    _bars(speed, labels, {"put": put, "get": get}, "throughput, GB/s", "{:.2f}")
    speed.set_xlabel("data: compression")
    speed.legend(loc="upper right")
    _bars(size, labels, {"compression ratio": ratio}, "original / stored bytes, x", "{:.2f}x")
    size.axhline(1.0, color="black", lw=1, label="uncompressed (1.0x)")
    size.set_ylim(0, 1.4 * max([r[0] for r in ratio if r[0] == r[0]] or [1.0]))  # the labels clear the legend
    size.set_xlabel("data: compression")
    size.legend(loc="upper left")


def _plot_s3(fig: Figure, s3: dict[str, Any]) -> None:
    labels, ser, par = [], [], []
    servers = [(f"+{lat} ms latency", x) for lat, x in s3["latencies"].items()]
    if s3.get("ceph", {}).get("write_serial_mb_s") is not None:
        servers.append(("Ceph RGW", s3["ceph"]))
    for name, x in servers:
        for op in ("write", "read"):
            labels.append(f"{op}, {name}")
            a, b = x[f"{op}_serial_mb_s"], x[f"{op}_parallel_mb_s"]
            ser.append((a, a, a))
            par.append((b, b, b))
    ax = fig.add_subplot()
    _bars(ax, labels, {"1 request at a time": ser, "parallel requests": par}, "throughput, MB/s", "{:.0f}")
    ax.set_xlabel("operation, server (moto: latency added to every request)")
    ax.legend(loc="upper right")


def _plot_mlx(fig: Figure, ml: dict[str, Any]) -> None:
    ax = fig.add_subplot()
    xs = [p["prompt_tokens"] for p in ml["prompts"]]
    for key, name, style in (("recompute_ttft_s", "recompute", "-o"),
                             ("restored_ttft_s", "restored (LifeboatCache)", "-s"),
                             ("memory_hit_ttft_s", "SGLang in-memory hit", "--^")):
        ax.plot(xs, [p[key] * 1e3 for p in ml["prompts"]], style, label=name)
    ax.set_xscale("log")
    ax.set_xticks(xs, [f"{x:,}" for x in xs], minor=False)
    ax.minorticks_off()
    ax.set_yscale("log")
    ax.set_xlabel("prompt tokens (log scale)")
    ax.set_ylabel("time to first token, ms (log scale)")
    ax.grid(which="both", alpha=0.3)
    ax.legend(loc="upper left")


def _plot_server(fig: Figure, sv: dict[str, Any]) -> None:
    """Log scale: a restore of ~0.3 s stands next to a recompute of ~40 s, each bar labelled."""
    ax = fig.add_subplot()
    labels = [f"{p['tokens']:,} tokens" for p in sv["prompts"]]

    def one(k: str) -> list[tuple[float, float, float]]:
        return [(float("nan") if p[k] is None else p[k],) * 3 for p in sv["prompts"]]

    _bars(ax, labels, {"recomputed (empty store)": one("recompute_s"),
                       "restored: LifeboatCache": one("lifeboat_restored_s"),
                       "restored: SGLang file": one("file_restored_s")}, "time to first token, s (log scale)",
          "{:.2f} s")
    ax.set_yscale("log")
    ax.set_xlabel("prompt length")
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(loc="upper left")


#: The plot of each section in PLOTS (one missing here shows as that section's "plot failed" placeholder).
_PLOTTERS: dict[str, Callable[[Figure, dict[str, Any]], None]] = {
    "ceilings": _plot_ceilings, "sglang_vs_file": _plot_sglang_vs_file, "sealing": _plot_sealing,
    "index_scale": plot_index_scale, "compression": _plot_compression, "retention": plot_retention, "s3": _plot_s3,
    "mlx": _plot_mlx, "server": _plot_server, "serving": plot_serving,
}
