"""What the index benchmarks share (`index_scale`, `index_reopen`, `index_store`): the lookup batch and
the writer's pace, this process's peak resident memory, percentiles and tables."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

BATCH = 300          # keys per lookup (a long prompt's pages in one batch_exists)
WRITER_BATCH = 32
WRITER_PAUSE_S = 0.0002
READER_PAUSE_S = 0.0005


def reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def percentiles_ms(xs: list[float]) -> dict[str, float]:
    a = np.array(xs) * 1e3
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)), "max": float(a.max())}


def md_table(columns: Sequence[tuple[str, str, str]], rows: Sequence[dict[str, Any]]) -> str:
    """A markdown table of `rows`, one column per (key, heading, format); a missing "impl" is "index"."""
    head = [h for _, h, _ in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        r = {"impl": "index", **r}
        lines.append("| " + " | ".join(f.format(r[k]) for k, _, f in columns) + " |")
    return "\n".join(lines)
