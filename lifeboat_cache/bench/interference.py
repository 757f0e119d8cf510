"""What a HiCache backend's background work costs the thread it shares a process with.

SGLang's scheduler runs in the process that hosts the storage backend: it shares the GIL with the
backend's threads, and on a small host the cores too. A server bench under load is too noisy to show a
few percent (docs/perf/serving.md), so this section isolates it: a main thread runs fixed steps (Python
bookkeeping and small torch matmuls, which release the GIL, as a scheduler step does) while a backup
thread drives SGLang's controller as HiCache does, a burst of `interference_pages` pages every
`interference_period_ms`, every other burst read back. Per contender (no backend, SGLang's `file`,
LifeboatCache at each `interference_io_workers` under each `interference_io_scheduling`, the io threads'
Linux policy; each through SGLang's factory over a real host pool): the main thread's steps per second
against no backend, its step time p50 / p99 / p99.9, its CPU seconds, and its voluntary (waits for the
GIL or a lock) and involuntary (preempted) context switches.
"""

from __future__ import annotations

import resource
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from .common import log
from .sizes import Sizes, ints, names

def _switches() -> tuple[int, int]:
    """(voluntary, involuntary) context switches of the calling thread so far ((0, 0) off Linux)."""
    who = getattr(resource, "RUSAGE_THREAD", None)
    if who is None:
        return 0, 0
    r = resource.getrusage(who)
    return r.ru_nvcsw, r.ru_nivcsw


def _step(a: Any, b: Any) -> None:
    """One scheduler-like step: ~0.3 ms of Python bookkeeping, then matmuls that release the GIL."""
    import torch

    d = {}
    for i in range(300):
        d[i] = (i * 7) % 13
    for _ in range(4):
        torch.mm(a, b)


def measure(ctl: Any, slots: Any, sizes: Sizes, seconds: float) -> dict[str, Any]:
    """The main thread's steps for `seconds` while `ctl` (None: no backend) takes backups."""
    import torch

    n, page = sizes.interference_pages, 64
    period = sizes.interference_period_ms / 1000
    stop, done, failed = threading.Event(), [0], []

    def backups() -> None:
        burst = 0
        while not stop.is_set():
            t = time.monotonic()
            keys = [[f"b{burst}-{i}" for i in range(n)]]
            try:
                ctl.write(keys, slots[: n * page])
                if burst % 2:
                    ctl.read([[f"b{burst - 1}-{i}" for i in range(n)]], slots[n * page: 2 * n * page])
            except RuntimeError as e:  # a short read or a failed backup: reported, the figures still stand
                failed.append(str(e))
            burst += 1
            done[0] = burst
            stop.wait(max(0.0, period - (time.monotonic() - t)))

    a, b = torch.randn(256, 256), torch.randn(256, 256)
    th = threading.Thread(target=backups, name="bench-backups", daemon=True) if ctl is not None else None
    if th is not None:
        th.start()
    times: list[float] = []
    s0, c0, t0 = _switches(), time.thread_time(), time.monotonic()
    while time.monotonic() - t0 < seconds:
        t = time.perf_counter()
        _step(a, b)
        times.append(time.perf_counter() - t)
    wall, cpu, s1 = time.monotonic() - t0, time.thread_time() - c0, _switches()
    stop.set()
    if th is not None:
        th.join(60)
    ms = np.asarray(times) * 1e3
    return {"steps": len(ms), "steps_per_s": len(ms) / wall, "step_ms": {
                "p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99)),
                "p999": float(np.percentile(ms, 99.9))},
            "main_cpu_share": cpu / wall, "voluntary_switches": s1[0] - s0[0], "involuntary_switches": s1[1] - s0[1],
            "bursts": done[0], "pages_written": done[0] * n if ctl is not None else 0, "errors": failed[:3]}


def run(work: Path, sizes: Sizes, quick: bool = False) -> dict[str, Any]:
    import torch

    from .sglang_vs_file import SHAPES, Controller, attach, extra_for, fill, pools

    torch.set_num_threads(1)  # one intra-op thread, as the serving section's servers
    n = sizes.interference_pages
    dev, host = pools("page_first", *SHAPES["small"], tokens=64 * (2 * n + 8))  # 768 KiB pages
    slots = host.alloc(64 * 2 * n)
    fill(host, slots, "random", None, seed=1)
    seconds = 3.0 if quick else float(sizes.interference_s)
    policies = names(sizes.interference_io_scheduling)
    contenders = [("none", None, None), ("file", None, None)] + [
        ("lifeboat", w, p) for w in ints(sizes.interference_io_workers) for p in policies]
    rows = []
    for side, workers, policy in contenders:
        path = work / f"interference-{side}-{workers}-{policy}"
        ctl = None
        if side == "file":
            ctl = attach("file", dev, host, path, sizes)
        elif side == "lifeboat":
            ctl = Controller(dev, host, "dynamic", {**extra_for("lifeboat", path, sizes), "io_workers": workers,
                                                    "io_scheduling": policy})
            ctl.backend.store.wait_rebuilt()
        try:
            row = {"contender": side, "io_workers": workers, "io_scheduling": policy,
                   **measure(ctl, slots, sizes, seconds)}
        finally:
            if ctl is not None:
                ctl.close_backend()
            shutil.rmtree(path, ignore_errors=True)
        log.info("interference %s%s: %.0f steps/s, p99 %.2f ms, %d involuntary switches", side,
                 f" ({workers} io workers, {policy})" if workers else "", row["steps_per_s"], row["step_ms"]["p99"],
                 row["involuntary_switches"])
        rows.append(row)
    base = rows[0]["steps_per_s"]
    for r in rows:
        r["steps_vs_none"] = r["steps_per_s"] / base if base else None
    return {"page_bytes": int(host.get_data_page(0, flat=True).numel() * 2), "pages_per_burst": n,
            "period_ms": sizes.interference_period_ms, "seconds": seconds, "rows": rows}
