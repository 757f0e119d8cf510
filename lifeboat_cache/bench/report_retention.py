"""The retention section's table and plot (bench/retention.py): hit rate against capacity."""

from __future__ import annotations

from typing import Any

from .report_tables import section_ok, section_status

TRACE_LABEL = {"hot_set": "hot set + one-off pages", "zipf": "Zipf documents", "multi_turn": "multi-turn chats",
               "round_robin": "conversations in turn"}


def retention_table(sec: Any) -> list[str]:
    out = ["### Retention in a full store (returning pages served)", ""]
    if not section_ok(sec):
        return out + [f"not measured: {section_status(sec)}", ""]
    out += ["Same trace and capacity for each; hit rate = pages served from storage / pages asked for again. "
            "Exact LRU and Belady's optimum are computed offline (the limit).", "",
            "| trace | capacity (share of working set) | LifeboatCache | SGLang `file` (LRU) | exact LRU "
            "| Belady | bytes written, LifeboatCache / file | rewritten to keep read pages |",
            "|---|---|---|---|---|---|---|---|"]
    for c in sec["cases"]:
        lb, fl = c["lifeboat"], c["file"]
        policy = lb.get("policy", {})
        out.append(f"| {TRACE_LABEL.get(c['trace'], c['trace'])} | {c['fraction']:.0%} ({c['capacity_pages']} pages) "
                   f"| {lb['hit_rate']:.3f} | {fl['hit_rate']:.3f} | {c['lru']:.3f} | {c['belady']:.3f} "
                   f"| {lb['written_bytes'] / max(1, fl['written_bytes']):.2f}x "
                   f"| {policy.get('retention_rewritten_bytes', 0) / 2**20:.1f} MiB |")
    h = sec.get("hot_set_restart")
    if h:
        out += ["", f"The issue's case (24 hot + 24 one-off pages of 128 KiB a round, capacity 96 pages, a clean "
                    f"restart halfway): LifeboatCache served {h['lifeboat']['hit_rate']:.1%} of the hot pages "
                    f"({h['lifeboat']['hit_rate_after_restart']:.1%} after the restart), `file` "
                    f"{h['file']['hit_rate']:.1%} ({h['file']['hit_rate_after_restart']:.1%}); bytes written "
                    f"{h['written_ratio']:.2f}x file's."]
    return out + [""]


def plot_retention(fig: Any, sec: dict[str, Any]) -> None:
    """One panel per trace (same policies, same colours in each), so every legend holds four lines."""
    styles = (("lifeboat", "LifeboatCache", "-", "o", "tab:blue"),
              ("file", "SGLang file (LRU)", "--", "s", "tab:orange"),
              ("lru", "exact LRU (offline)", "-.", None, "tab:grey"),
              ("belady", "Belady (offline limit)", ":", None, "tab:green"))
    traces = [t for t in (*TRACE_LABEL, *sorted({c["trace"] for c in sec["cases"]} - set(TRACE_LABEL)))
              if any(c["trace"] == t for c in sec["cases"])]
    axes = fig.subplots(1, len(traces), sharey=True, squeeze=False)[0]
    for ax, trace in zip(axes, traces):
        rows = [c for c in sec["cases"] if c["trace"] == trace]
        xs = [c["fraction"] * 100 for c in rows]
        for key, name, ls, marker, color in styles:
            if any(key not in c for c in rows):  # a results.json from before the column
                continue
            ys = [c[key]["hit_rate"] if isinstance(c[key], dict) else c[key] for c in rows]
            ax.plot(xs, ys, linestyle=ls, marker=marker, color=color, label=name)
        ax.set_title(TRACE_LABEL.get(trace, trace))
        ax.set_xlabel("capacity, % of the working set")
        ax.set_ylabel("hit rate (returning pages served)")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
