"""Counters with one lock: what the store, its tiers, the copier and the MLX writer count.

Three kinds of numbers, all thread-safe and cheap enough for the I/O path:

* named counters (`add`): misses by cause, bytes, drops; monotonically increasing;
* call-latency histograms (`observe`): fixed buckets, so a snapshot can be summed across processes
  and exported to Prometheus without keeping samples;
* per-namespace write accounting (`add_namespace`) plus the label a shim gives each namespace
  (`name_namespace`: model, pool, rank), for `lifeboat ls` / `stats`.

`observe` also calls the listeners added with `add_listener` (the Prometheus exporter hooks its
histograms there); everything else is read by polling `snapshot()`, so the hot path never waits
on an exporter. The tables at the bottom say how raw counter names group into the reasons an
operator sees (`misses by reason`, `drops by reason`).
"""

from __future__ import annotations

import bisect
import threading
import time
from typing import Any, Callable

#: Upper bounds (seconds) of the latency buckets; the last bucket is +Inf.
LATENCY_BUCKETS_S: tuple[float, ...] = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                         0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

Listener = Callable[[str, float], None]


class Histogram:
    """Counts per fixed bucket plus sum and count (not thread-safe alone: Counters holds the lock)."""

    __slots__ = ("counts", "sum", "count")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BUCKETS_S, value)] += 1
        self.sum += value
        self.count += 1

    def to_dict(self) -> dict[str, Any]:
        return {"buckets": list(self.counts), "sum": self.sum, "count": self.count}


class Counters:
    """Named monotonically increasing counters, latency histograms and namespace accounting."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, int] = {}
        self._hists: dict[str, Histogram] = {}
        self._ns: dict[bytes, list[float]] = {}  # ns -> [pages, stored bytes, last write (unix s)]
        self._ns_names: dict[bytes, dict[str, str]] = {}
        self._listeners: list[Listener] = []

    def declare(self, *names: str) -> None:
        """Start `names` at 0 (so they show in snapshots before they first move); existing ones are kept."""
        with self._lock:
            for name in names:
                self._values.setdefault(name, 0)

    def add(self, name: str, n: int = 1) -> None:
        """Increment `name` by n: the one way to count from several threads (`c[k] += 1` would race)."""
        with self._lock:
            self._values[name] = self._values.get(name, 0) + n

    def add_many(self, counts: dict[str, int], observe: tuple[str, float] | None = None) -> None:
        """Increment several counters and, optionally, record one call's latency (name, seconds)
        under one lock acquisition: a hot path's bookkeeping in one call (`exists` runs per prompt)."""
        with self._lock:
            values = self._values
            for name, n in counts.items():
                values[name] = values.get(name, 0) + n
            if observe is None:
                return
            h = self._hists.get(observe[0])
            if h is None:
                h = self._hists[observe[0]] = Histogram()
            h.observe(observe[1])
            listeners = list(self._listeners) if self._listeners else ()
        for fn in listeners:
            try:
                fn(*observe)
            except Exception:  # an exporter's trouble must never reach the I/O path
                pass

    def set(self, name: str, value: int) -> None:
        """Set a gauge-like value (e.g. the last rebuild's duration)."""
        with self._lock:
            self._values[name] = value

    def get(self, name: str) -> int:
        with self._lock:
            return self._values.get(name, 0)

    def __getitem__(self, name: str) -> int:
        """The value of a declared (or already counted) name; KeyError for any other, as a dict."""
        with self._lock:
            return self._values[name]

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._values

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)

    # ------------------------------------------------------------------ latency
    def observe(self, name: str, seconds: float) -> None:
        """Record one call's duration under `name` (e.g. 'get', 'set', 'exists', 'mlx_restore')."""
        with self._lock:
            h = self._hists.get(name)
            if h is None:
                h = self._hists[name] = Histogram()
            h.observe(seconds)
            listeners = list(self._listeners)
        for fn in listeners:
            try:
                fn(name, seconds)
            except Exception:  # an exporter's trouble must never reach the I/O path
                pass

    def histograms(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {k: h.to_dict() for k, h in self._hists.items()}

    def add_listener(self, fn: Listener) -> None:
        with self._lock:
            self._listeners.append(fn)

    def remove_listener(self, fn: Listener) -> None:
        with self._lock:
            if fn in self._listeners:
                self._listeners.remove(fn)

    # ------------------------------------------------------------------ namespaces
    def add_namespace(self, ns: bytes, pages: int, stored_bytes: int) -> None:
        """Pages newly written under `ns` and their stored bytes (the store's put calls this)."""
        with self._lock:
            rec = self._ns.get(ns)
            if rec is None:
                rec = self._ns[ns] = [0, 0, 0.0]
            rec[0] += pages
            rec[1] += stored_bytes
            rec[2] = time.time()

    def name_namespace(self, ns: bytes, *, keep_existing: bool = False, **labels: Any) -> None:
        """What a namespace is (model, pool, rank ...): shims say it once, `lifeboat ls` shows it.
        `keep_existing`: only when nothing named it yet (the store's default names from a Namespace)."""
        with self._lock:
            if keep_existing and bytes(ns) in self._ns_names:
                return
            self._ns_names[bytes(ns)] = {k: str(v) for k, v in labels.items() if v is not None and v != ""}

    def namespaces(self) -> dict[str, dict[str, Any]]:
        """hex namespace -> {labels, pages_written, bytes_written, last_write}."""
        with self._lock:
            out: dict[str, dict[str, Any]] = {}
            for ns in set(self._ns) | set(self._ns_names):
                pages, nbytes, last = self._ns.get(ns, [0, 0, 0.0])
                out[ns.hex()] = {"labels": dict(self._ns_names.get(ns, {})), "pages_written": int(pages),
                                 "bytes_written": int(nbytes), "last_write": last or None}
            return out


# ---------------------------------------------------------------------------------- reason tables

#: misses by reason -> the raw counters that make it ('absent' is what is left of read_misses).
MISS_REASONS: dict[str, tuple[str, ...]] = {
    "stale": ("miss_stale",),
    "corrupt": ("miss_header", "miss_payload", "miss_checksum", "miss_truncated"),
    "foreign": ("miss_foreign", "miss_size"),
    "cooldown": ("miss_cooldown",),
    "deadline": ("read_deadline_misses",),
    # sealed records (records/sealing.py): a plaintext record where sealed ones are required, a record sealed with a
    # key this process does not hold (or any, with encryption off), a tag that does not verify
    "unsealed": ("miss_unsealed",),
    "key": ("miss_sealed_unknown_key", "miss_sealed_no_key"),
    "auth": ("miss_sealed_auth",),
}

#: dropped writes by reason -> raw counters (store, copier, MLX writer).
DROP_REASONS: dict[str, tuple[str, ...]] = {
    "cooldown": ("writes_dropped_cooldown",),
    "deadline": ("writes_dropped_deadline",),
    "io_error": ("write_errors",),
    "copy_queue_full": ("copy_dropped",),
    "copy_error": ("copy_errors",),
    "copy_cooldown": ("copy_skipped_cooldown",),
    "queue_full": ("mlx_chunks_dropped_queue_full",),
    "closed": ("mlx_chunks_dropped_closed", "mlx_chunks_dropped_exit"),
    "write_failed": ("mlx_chunks_write_failed",),
}


def misses_by_reason(c: dict[str, int]) -> dict[str, int]:
    """Group raw miss counters into the reasons operators see; 'absent' = not stored anywhere."""
    out = {r: sum(c.get(n, 0) for n in names) for r, names in MISS_REASONS.items()}
    out["absent"] = max(0, c.get("read_misses", 0) - sum(out.values()))
    return out


def drops_by_reason(c: dict[str, int]) -> dict[str, int]:
    return {r: sum(c.get(n, 0) for n in names) for r, names in DROP_REASONS.items()}


def hits_by_tier(c: dict[str, int], n_tiers: int) -> list[int]:
    """Pages served per tier level (level 0 = pages_read minus hits on lower tiers)."""
    lower = [c.get(f"hits_tier{i}", 0) for i in range(1, n_tiers)]
    return [max(0, c.get("pages_read", 0) - sum(lower)), *lower]
