"""Per-process stats files next to the store, and the reporter thread that writes them.

A serving process (SGLang scheduler, MLX server) cannot be asked for its counters by `lifeboat stats`,
which runs in another process, maybe on another host. So every `interval_s` seconds the reporter
writes the process's counters, latency histograms, per-namespace accounting and tier state to
``<stats dir>/<host>-<pid>-<token>.json``: a temp file created owner-only (0600, the file names models
and namespaces of users' prompts) and renamed over the old one, so a reader sees a whole file or the
previous one, never half. `lifeboat stats` and `lifeboat ls` read these files only; they never open
a segment for writing. The same tick feeds the Prometheus exporter (see `prometheus.py`).

The stats directory is ``stats/`` under the first tier's first path (local / nfs), else
``$XDG_CACHE_HOME/lifeboat/stats`` (an S3-only store has no directory of its own).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from ..config import Settings, default_cache_dir
from ..cooldown import LogOnce
from ..config import DEFAULT_INTERVAL_S, parse_interval
from ..fsio import make_dirs, write_new_file  # owner-only whatever the umask; no symlink followed
from ..retention import RETENTION_COUNTERS

if TYPE_CHECKING:
    from ..store import ChunkStore

log = logging.getLogger(__name__)

STATS_DIR_NAME = "stats"
STATS_FORMAT = 1
#: A file updated within this many intervals is a live process.
LIVE_INTERVALS = 3
#: `lifeboat stats` sums processes seen within this window by default (live and recent ones).
DEFAULT_RECENT_S = 24 * 3600.0
#: Stats files not updated for this long are removed when a reporter starts (the directory stays small).
KEEP_S = 30 * 86400.0


def stats_dir(settings: Settings) -> Path:
    """Where this store's processes write their stats files."""
    for ts in settings.storage:
        if ts.paths:
            return Path(ts.paths[0]) / STATS_DIR_NAME
    return default_cache_dir() / STATS_DIR_NAME


class _LastError(logging.Handler):
    """Keeps the last WARNING-or-worse line LifeboatCache logged in this process."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.last: dict[str, Any] | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.last = {"time": record.created, "level": record.levelname, "message": record.getMessage()}
        except Exception:  # a bad log call must not break logging
            pass


#: Index snapshot counters of a serving process, per tier (`lifeboat stats` sums them over processes).
SNAPSHOT_SAVE_FIELDS = ("snapshot_saves", "snapshot_save_failures", "snapshot_save_ms")


def tier_state(store: "ChunkStore") -> list[dict[str, Any]]:
    """Per tier: pages indexed, usage vs capacity, cooldowns, rebuild time (index only, no I/O)."""
    out = []
    for tier, rc, wc in zip(store.tiers, store.read_cooldowns, store.write_cooldowns):
        st = tier.stats()
        out.append({
            "tier": tier.name, "kind": tier.kind, "pages": int(st.get("pages", 0) or 0),
            "usage_bytes": int(st.get("usage_bytes") or 0), "capacity_bytes": st.get("capacity_bytes"),
            "rebuild_s": (st["rebuild_ms"] / 1000.0) if "rebuild_ms" in st else None,
            "reads_cooling_down": rc.active(), "writes_cooling_down": wc.active(),
            **{k: int(st[k]) for k in (*SNAPSHOT_SAVE_FIELDS, *RETENTION_COUNTERS) if k in st},
        })
    return out


def snapshot(store: "ChunkStore", role: str, labels: dict[str, str], started: float,
             last_error: dict[str, Any] | None, interval_s: float) -> dict[str, Any]:
    c = store.counters
    return {
        "format": STATS_FORMAT, "host": socket.gethostname(), "pid": os.getpid(), "role": role,
        "labels": labels, "config": store.settings.source, "started": started, "updated": time.time(),
        "interval_s": interval_s, "counters": c.snapshot(), "histograms": c.histograms(),
        "namespaces": c.namespaces(), "tiers": tier_state(store), "last_error": last_error,
    }


class StatsReporter:
    """Writes this process's stats file every `interval_s` and feeds Prometheus (daemon thread).

    `close()` writes a final file and stops; nothing here raises into the caller after start: a
    write error is logged once and retried at the next tick.
    """

    def __init__(self, store: "ChunkStore", *, role: str, labels: dict[str, Any] | None = None,
                 interval_s: float | None = None, directory: Path | None = None,
                 prometheus: bool = True) -> None:
        self.store = store
        self.role = role
        self.labels = {k: str(v) for k, v in (labels or {}).items() if v is not None}
        self.interval_s = parse_interval() if interval_s is None else interval_s
        self.dir = directory if directory is not None else stats_dir(store.settings)
        self.path = self.dir / f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}.json"
        self.started = time.time()
        try:  # the whole path once, at start; later ticks never re-create a store directory removed meanwhile
            make_dirs(self.dir, 0o700)
        except OSError as e:
            log.warning("lifeboat: cannot create the stats directory %s (%s)", self.dir, e)
        prune(self.dir, self.started - KEEP_S)
        self._errors = _LastError()
        logging.getLogger("lifeboat_cache").addHandler(self._errors)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._write_failed = LogOnce(log)
        self.exporter = None
        if prometheus:
            from .prometheus import PrometheusExporter

            self.exporter = PrometheusExporter.maybe_create(store, self.labels)
        self._thread = threading.Thread(target=self._run, name="lifeboat-stats", daemon=True)
        self._thread.start()

    def tick(self) -> None:
        """Write the stats file and sync Prometheus now (the thread calls this every interval)."""
        with self._lock:
            if self.exporter is not None:
                self.exporter.sync(tier_state(self.store))
            try:
                if not self.dir.is_dir():  # only the stats folder itself, never its parents: a store
                    os.mkdir(self.dir, 0o700)  # directory deleted while serving stays deleted (ENOENT here)
                data = snapshot(self.store, self.role, self.labels, self.started, self._errors.last,
                                self.interval_s)
                write_new_file(self.path, json.dumps(data, separators=(",", ":")).encode(), 0o600)
            except OSError as e:
                self._write_failed.log("write", "lifeboat: cannot write the stats file %s (%s); `lifeboat stats` "
                                       "will not see this process", self.path, e)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.tick()
            except Exception:  # never kill the serving process for a stats file
                log.debug("lifeboat: stats tick failed", exc_info=True)

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=5.0)
        try:
            self.tick()
        except Exception:
            log.debug("lifeboat: final stats tick failed", exc_info=True)
        if self.exporter is not None:
            self.exporter.close()
        logging.getLogger("lifeboat_cache").removeHandler(self._errors)


def prune(directory: Path, older_than: float) -> None:
    """Remove stats files (and stray temp files) last written before `older_than` (unix seconds)."""
    try:
        entries = list(directory.iterdir())
    except OSError:
        return
    for p in entries:
        if p.suffix in (".json", ".tmp"):
            try:
                if p.stat().st_mtime < older_than:
                    p.unlink()
            except OSError:
                continue


# ------------------------------------------------------------------------------------------ reading

def read_stats_files(directory: Path) -> list[dict[str, Any]]:
    """Every readable stats file in `directory` (unreadable or foreign files are skipped)."""
    out = []
    try:
        names = sorted(p for p in directory.iterdir() if p.suffix == ".json" and not p.name.startswith("."))
    except OSError:
        return []
    for p in names:
        try:
            data = json.loads(p.read_bytes())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("format") == STATS_FORMAT:
            data["_file"] = str(p)
            out.append(data)
    return out


def is_live(rec: dict[str, Any], now: float) -> bool:
    return now - float(rec.get("updated", 0)) <= LIVE_INTERVALS * float(rec.get("interval_s", DEFAULT_INTERVAL_S))


def sum_dicts(dicts: Iterable[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + int(v)
    return out


def merge_histograms(recs: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in recs:
        for name, h in (r.get("histograms") or {}).items():
            m = out.setdefault(name, {"buckets": [0] * len(h["buckets"]), "sum": 0.0, "count": 0})
            if len(m["buckets"]) == len(h["buckets"]):
                m["buckets"] = [a + b for a, b in zip(m["buckets"], h["buckets"])]
                m["sum"] += h["sum"]
                m["count"] += h["count"]
    return out


def merge_namespaces(recs: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """hex namespace -> labels, pages and bytes written (summed), last write (latest)."""
    out: dict[str, dict[str, Any]] = {}
    for r in recs:
        for ns, d in (r.get("namespaces") or {}).items():
            m = out.setdefault(ns, {"labels": {}, "pages_written": 0, "bytes_written": 0, "last_write": None})
            m["labels"].update(d.get("labels") or {})
            m["pages_written"] += int(d.get("pages_written", 0))
            m["bytes_written"] += int(d.get("bytes_written", 0))
            lw = d.get("last_write")
            if lw and (m["last_write"] is None or lw > m["last_write"]):
                m["last_write"] = lw
    return out
