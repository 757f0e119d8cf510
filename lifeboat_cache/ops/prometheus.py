"""`lifeboat_*` Prometheus metrics, served by SGLang's own `/metrics` (`--enable-metrics`).

SGLang runs `prometheus_client` in multiprocess mode: each scheduler process writes its metric
values to mmap files under ``PROMETHEUS_MULTIPROC_DIR`` and the HTTP server merges them with
``MultiProcessCollector``. So the exporter lives in the serving process, next to the store, and only
creates ordinary `prometheus_client` metrics: counters are advanced by the delta of the store's
counters at each stats tick (the I/O path never touches Prometheus), latency histograms observe each
call through a `Counters` listener, gauges are set at each tick. Labels: ``model`` and ``rank`` on
everything, ``tier`` where a number belongs to one tier.

``prometheus_client`` is optional for the core: it is imported only here, lazily, and a process
without it simply exports nothing.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from ..metrics import LATENCY_BUCKETS_S, drops_by_reason, hits_by_tier, misses_by_reason

if TYPE_CHECKING:
    from ..store import ChunkStore

log = logging.getLogger(__name__)

BASE_LABELS = ("model", "rank")
_LATENCY_OPS = {"exists": "exists", "get": "get", "set": "set"}

# (name, help, extra labels): advanced by counter deltas
_COUNTERS = (
    ("lifeboat_pages_read", "Pages served from the store, by the tier that served them", ("tier",)),
    ("lifeboat_pages_written", "Pages written to the first tier", ("tier",)),
    ("lifeboat_bytes_read", "Bytes of pages served (decoded size)", ()),
    ("lifeboat_bytes_written", "Bytes written to the first tier: raw page bytes and stored bytes", ("tier", "kind")),
    ("lifeboat_pages_promoted", "Pages read from a lower tier and written to the first tier", ("tier",)),
    ("lifeboat_pages_copied_down", "Pages copied in the background to the lower tiers", ()),
    ("lifeboat_hits", "Page lookups that returned a verified page", ()),
    ("lifeboat_misses", "Page lookups that returned nothing, by reason", ("reason",)),
    ("lifeboat_writes_dropped", "Pages or chunks not written, by reason", ("reason",)),
    ("lifeboat_quarantined_records", "Records that failed verification and were dropped from the index", ()),
    ("lifeboat_mlx_chunks_written", "MLX KV chunks written by the background writer", ()),
    ("lifeboat_mlx_chunks_restored", "MLX KV chunks restored into the prefix cache", ()),
    ("lifeboat_mlx_chunks_dropped", "MLX KV chunks not written, by reason", ("reason",)),
)
# (name, help, extra labels): set at each tick
_GAUGES = (
    ("lifeboat_compression_ratio", "Raw / stored bytes of the pages this process wrote", ()),
    ("lifeboat_index_pages", "Records in the tier's in-memory index", ("tier",)),
    ("lifeboat_index_rebuild_seconds", "Duration of the tier's last index rebuild at open", ("tier",)),
    ("lifeboat_tier_usage_bytes", "Bytes of pages the tier holds: what its capacity counts", ("tier",)),
    ("lifeboat_tier_capacity_bytes", "The tier's capacity bound", ("tier",)),
    ("lifeboat_tier_capacity_used_ratio", "Usage / capacity of the tier", ("tier",)),
    ("lifeboat_tier_cooldown", "1 while the tier is skipped after failures", ("tier", "op")),
)
_HISTOGRAMS = (
    ("lifeboat_call_seconds", "Duration of store calls (exists / get / set)", ("op",)),
    ("lifeboat_mlx_restore_seconds", "Duration of restoring a prefix from the store on MLX", ()),
)
_MLX_DROPS = {"queue_full": "mlx_chunks_dropped_queue_full", "closed": "mlx_chunks_dropped_closed",
              "exit_timeout": "mlx_chunks_dropped_exit", "write_failed": "mlx_chunks_write_failed"}

# prometheus_client refuses a second metric of the same name in one registry, so the families are
# made once per (process, registry) and shared by every store the process opens.
_FAMILIES: dict[int, dict[str, Any]] = {}
_FAMILIES_LOCK = threading.Lock()


def _families(registry: Any) -> dict[str, Any]:
    from prometheus_client import Counter, Gauge, Histogram

    with _FAMILIES_LOCK:
        fam = _FAMILIES.get(id(registry))
        if fam is None:
            fam = {}
            for name, help_, extra in _COUNTERS:
                fam[name] = Counter(name, help_, BASE_LABELS + extra, registry=registry)
            for name, help_, extra in _GAUGES:
                fam[name] = Gauge(name, help_, BASE_LABELS + extra, registry=registry,
                                  multiprocess_mode="livemax")
            for name, help_, extra in _HISTOGRAMS:
                fam[name] = Histogram(name, help_, BASE_LABELS + extra, registry=registry,
                                      buckets=LATENCY_BUCKETS_S)
            _FAMILIES[id(registry)] = fam
        return fam


class PrometheusExporter:
    """Mirrors one store's counters into `lifeboat_*` Prometheus metrics (see module doc)."""

    def __init__(self, store: "ChunkStore", labels: dict[str, str], registry: Any = None) -> None:
        from prometheus_client import REGISTRY

        self.store = store
        self.base = {"model": labels.get("model", ""), "rank": labels.get("rank", "0")}
        self.fam = _families(REGISTRY if registry is None else registry)
        self._last: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._lock = threading.Lock()
        store.counters.add_listener(self._observe)

    @classmethod
    def maybe_create(cls, store: "ChunkStore", labels: dict[str, str]) -> "PrometheusExporter | None":
        """An exporter when prometheus_client is installed, else None (logged at debug level)."""
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            log.debug("lifeboat: prometheus_client is not installed; no lifeboat_* metrics")
            return None
        try:
            return cls(store, labels)
        except Exception as e:  # a registry clash must not stop serving
            log.warning("lifeboat: cannot export Prometheus metrics: %s", e)
            return None

    def _observe(self, name: str, seconds: float) -> None:
        if name in _LATENCY_OPS:
            self.fam["lifeboat_call_seconds"].labels(op=_LATENCY_OPS[name], **self.base).observe(seconds)
        elif name == "mlx_restore":
            self.fam["lifeboat_mlx_restore_seconds"].labels(**self.base).observe(seconds)

    def _count(self, name: str, value: float, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        child = self.fam[name].labels(**self.base, **labels)  # a series exists from the first sync, at 0
        delta = value - self._last.get(key, 0.0)
        if delta > 0:
            child.inc(delta)
            self._last[key] = value

    def _gauge(self, name: str, value: float | None, **labels: str) -> None:
        if value is not None:
            self.fam[name].labels(**self.base, **labels).set(value)

    def sync(self, tiers: list[dict[str, Any]]) -> None:
        """Advance counters by what happened since the last sync; set gauges to now. `tiers`: the
        per-tier state the stats file holds too (stats_file.tier_state), handed in by its reporter."""
        with self._lock:
            c = self.store.counters.snapshot()
            first = tiers[0]["tier"]
            for t, n in zip(tiers, hits_by_tier(c, len(tiers))):
                self._count("lifeboat_pages_read", n, tier=t["tier"])
            self._count("lifeboat_pages_written", c.get("pages_written", 0), tier=first)
            self._count("lifeboat_bytes_read", c.get("bytes_read", 0))
            self._count("lifeboat_bytes_written", c.get("bytes_written_raw", 0), tier=first, kind="raw")
            self._count("lifeboat_bytes_written", c.get("bytes_written_stored", 0), tier=first, kind="stored")
            self._count("lifeboat_pages_promoted", c.get("promotions", 0), tier=first)
            self._count("lifeboat_pages_copied_down", c.get("copies", 0))
            self._count("lifeboat_hits", c.get("pages_read", 0))
            for reason, n in misses_by_reason(c).items():
                self._count("lifeboat_misses", n, reason=reason)
            for reason, n in drops_by_reason(c).items():
                self._count("lifeboat_writes_dropped", n, reason=reason)
            self._count("lifeboat_quarantined_records", c.get("quarantined", 0))
            self._count("lifeboat_mlx_chunks_written", c.get("mlx_chunks_written", 0))
            self._count("lifeboat_mlx_chunks_restored", c.get("mlx_chunks_restored", 0))
            for reason, key in _MLX_DROPS.items():
                self._count("lifeboat_mlx_chunks_dropped", c.get(key, 0), reason=reason)
            raw, stored = c.get("bytes_written_raw", 0), c.get("bytes_written_stored", 0)
            self._gauge("lifeboat_compression_ratio", raw / stored if stored else None)
            for t in tiers:
                name = t["tier"]
                self._gauge("lifeboat_index_pages", t["pages"], tier=name)
                self._gauge("lifeboat_index_rebuild_seconds", t["rebuild_s"], tier=name)
                self._gauge("lifeboat_tier_usage_bytes", t["usage_bytes"], tier=name)
                cap = t["capacity_bytes"]
                self._gauge("lifeboat_tier_capacity_bytes", cap, tier=name)
                self._gauge("lifeboat_tier_capacity_used_ratio", t["usage_bytes"] / cap if cap else None, tier=name)
                self._gauge("lifeboat_tier_cooldown", float(t["reads_cooling_down"]), tier=name, op="read")
                self._gauge("lifeboat_tier_cooldown", float(t["writes_cooling_down"]), tier=name, op="write")

    def close(self) -> None:
        self.store.counters.remove_listener(self._observe)
