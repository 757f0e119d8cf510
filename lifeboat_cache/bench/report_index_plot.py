"""The index_scale section's plot: three panels against stored pages, one quantity each (lookup latency
in ms, reopen time in s, memory in bytes per page), so no axis mixes units and each legend stays short.

The rows carry ~30 columns (bench/index_scale.py); only the ones a reader compares are drawn, picked by
name so a new column does not silently join a panel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .report_tables import section_rows

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: (column, legend label) per panel; columns absent from the rows are left out.
LOOKUP_MS = (("exists_idle_p99_ms", "index exists p99, idle"), ("exists_writer_p99_ms", "index exists p99, a writer"),
             ("max_stall_ms", "index max stall, a writer"),
             ("store_exists_idle_p99_ms", "store exists (300 keys) p99, idle"),
             ("store_exists_writer_p99_ms", "store exists (300 keys) p99, a writer"),
             ("store_exists_cold_p99_ms", "store exists (300 keys) p99, cold"))
REOPEN_S = tuple((f"reopen_{kind}_{what}_s", f"{kind} reopen: {label}")
                 for kind in ("clean", "stale", "crash") for what, label in (("first_hit", "first hit"),
                                                                            ("full", "full index")))
MEMORY_B = (("B_per_page_after_fill", "after a fill"), ("B_per_page_filling_peak", "peak while filling"),
            *((f"reopen_{k}_peak_B_per_page", f"peak of a {k} reopen") for k in ("clean", "stale", "crash")))
STYLES = {"clean": "-", "stale": "--", "crash": ":"}


def plot_index_scale(fig: Figure, ix: dict[str, Any]) -> None:
    rows = section_rows(ix)
    xkey = next((k for k in ("pages", "n_pages", "stored_pages", "size") if rows and k in rows[0]), None)
    if not rows or xkey is None:
        raise ValueError("no per-size rows to plot")
    xs = [r[xkey] for r in rows]
    panels = ((LOOKUP_MS, "lookup latency, ms (log scale)", True), (REOPEN_S, "time after reopen, s (log scale)", True),
              (MEMORY_B, "memory, bytes per page", False))
    drawn = [(cols, ylabel, log) for cols, ylabel, log in panels if any(c in rows[0] for c, _ in cols)]
    if not drawn:
        raise ValueError(f"none of the known columns in {sorted(rows[0])}")
    for ax, (cols, ylabel, log) in zip(fig.subplots(1, len(drawn), squeeze=False)[0], drawn):
        _panel(ax, xs, rows, cols, log)
        ax.set_ylabel(ylabel)
        ax.set_xlabel("stored pages (log scale)")


def _panel(ax: Axes, xs: list[Any], rows: list[dict[str, Any]], cols: tuple[tuple[str, str], ...], log: bool) -> None:
    for col, label in cols:
        if col not in rows[0]:
            continue
        ys = [float("nan") if r.get(col) is None else r[col] for r in rows]
        kind = next((k for k in STYLES if f"_{k}_" in col), "")
        ax.plot(xs, ys, marker="o", ls=STYLES.get(kind, "-"), label=label)
    ax.set_xscale("log")
    if log:
        ax.set_yscale("log")
    ax.grid(which="both", alpha=0.3)
    ax.legend(loc="best", fontsize="small")
