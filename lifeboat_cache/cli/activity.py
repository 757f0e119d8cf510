"""What is in the store and what serving processes did (`stats` and `ls` never write to the store):
the activity part of `lifeboat stats` (stats files) and `lifeboat ls` (the store's record headers,
labelled from the stats files)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from ..config import Settings, format_size
from .checked import open_checked
from .errors import EXIT_OK, UsageError

AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str) -> float:
    """'90s', '30m', '24h', '7d', '2w' -> seconds."""
    t = text.strip().lower()
    try:
        if t[-1:] in AGE_UNITS:
            v = float(t[:-1]) * AGE_UNITS[t[-1]]
        else:
            v = float(t)
    except ValueError:
        v = -1.0
    if v <= 0:
        raise UsageError(f"--since {text!r}: expected a positive age such as 30m, 24h or 7d")
    return v


def collect_activity(settings: Settings, since_s: float, now: float | None = None) -> dict[str, Any]:
    """Counters of live and recent serving processes, summed, from their stats files."""
    from .. import metrics
    from ..ops import is_live, merge_histograms, merge_namespaces, read_stats_files, stats_dir, sum_dicts

    now = time.time() if now is None else now
    directory = stats_dir(settings)
    recs = [r for r in read_stats_files(directory) if now - float(r.get("updated", 0)) <= since_s]
    live = [r for r in recs if is_live(r, now)]
    c = sum_dicts(r.get("counters") or {} for r in recs)
    keys, hits = c.get("lookup_keys", 0), c.get("lookup_hits", 0)
    errors = [r["last_error"] | {"pid": r.get("pid"), "host": r.get("host")} for r in recs if r.get("last_error")]
    cooldowns = []
    for r in live:
        for t in r.get("tiers") or []:
            for op in ("reads", "writes"):
                if t.get(f"{op}_cooling_down"):
                    cooldowns.append({"tier": t["tier"], "op": op, "pid": r.get("pid"), "host": r.get("host")})
    raw, stored = c.get("bytes_written_raw", 0), c.get("bytes_written_stored", 0)
    return {
        "tier_snapshots": snapshot_saves(recs),
        "tier_retention": retention_figures(recs),
        "stats_dir": str(directory),
        "processes": {"live": len(live), "recent": len(recs) - len(live), "since_s": since_s},
        "activity": {
            "hit_rate": round(hits / keys, 4) if keys else None, "lookup_keys": keys, "lookup_hits": hits,
            "pages_read": c.get("pages_read", 0), "read_misses": c.get("read_misses", 0),
            "misses_by_reason": metrics.misses_by_reason(c), "drops_by_reason": metrics.drops_by_reason(c),
            "bytes_in": raw, "bytes_in_stored": stored, "bytes_out": c.get("bytes_read", 0),
            "pages_written": c.get("pages_written", 0), "promotions": c.get("promotions", 0),
            "copies": c.get("copies", 0), "quarantined": c.get("quarantined", 0),
            "latency": merge_histograms(recs),
        },
        "namespaces": merge_namespaces(recs),
        "cooldowns": cooldowns,
        "last_error": max(errors, key=lambda e: e["time"]) if errors else None,
    }


def retention_figures(recs: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Per tier name: what retention did in the serving processes (their stats files' counters, summed)."""
    from ..retention import RETENTION_COUNTERS

    out: dict[str, dict[str, int]] = {}
    for r in recs:
        for t in r.get("tiers") or []:
            d = out.setdefault(str(t.get("tier")), dict.fromkeys(RETENTION_COUNTERS, 0))
            for k in RETENTION_COUNTERS:
                d[k] += int(t.get(k) or 0)
    return out


def snapshot_saves(recs: list[dict[str, Any]]) -> dict[str, dict[str, int | None]]:
    """Per tier name: index snapshot saves and failures summed over the processes' stats files, and the
    newest file's last save time (ms; None when no process saved one)."""
    out: dict[str, dict[str, int | None]] = {}
    for r in sorted(recs, key=lambda r: float(r.get("updated", 0))):
        for t in r.get("tiers") or []:
            d = out.setdefault(str(t.get("tier")), {"snapshot_saves": 0, "snapshot_save_failures": 0,
                                                     "snapshot_save_ms": None})
            d["snapshot_saves"] = int(d["snapshot_saves"] or 0) + int(t.get("snapshot_saves") or 0)
            failures = int(t.get("snapshot_save_failures") or 0)
            d["snapshot_save_failures"] = int(d["snapshot_save_failures"] or 0) + failures
            if t.get("snapshot_saves"):
                d["snapshot_save_ms"] = int(t.get("snapshot_save_ms") or 0)
    return out


def _pct_of(h: dict[str, Any], q: float) -> str:
    """Upper bucket bound holding the q-quantile (a histogram only bounds it)."""
    from ..metrics import LATENCY_BUCKETS_S

    target, seen = q * h["count"], 0
    for i, n in enumerate(h["buckets"]):
        seen += n
        if seen >= target and n:
            return f"<={LATENCY_BUCKETS_S[i] * 1e3:g} ms" if i < len(LATENCY_BUCKETS_S) else ">10 s"
    return "n/a"


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "never"


def print_activity(stats: dict[str, Any]) -> None:
    a, p = stats["activity"], stats["processes"]
    print(f"serving processes: {p['live']} live, {p['recent']} recent (within {p['since_s'] / 3600:g} h); "
          f"stats files in {stats['stats_dir']}")
    rate = f"{100 * a['hit_rate']:.1f}%" if a["hit_rate"] is not None else "n/a (no lookups yet)"
    print(f"  hit rate: {rate} ({a['lookup_hits']} of {a['lookup_keys']} pages looked up were stored)")
    print(f"  reads: {a['pages_read']} pages served, {a['read_misses']} misses")
    print("  misses by reason: " + ", ".join(f"{k} {v}" for k, v in a["misses_by_reason"].items()))
    print("  writes dropped by reason: " + ", ".join(f"{k} {v}" for k, v in a["drops_by_reason"].items()))
    print(f"  bytes in: {format_size(a['bytes_in'], 1)} ({format_size(a['bytes_in_stored'], 1)} stored); "
          f"bytes out: {format_size(a['bytes_out'], 1)}")
    for op, h in sorted(a["latency"].items()):
        print(f"  {op} calls: {h['count']}, p50 {_pct_of(h, 0.5)}, p99 {_pct_of(h, 0.99)}")
    cds = stats["cooldowns"]
    print("  cooldowns: " + (", ".join(f"{c['tier']} {c['op']} (pid {c['pid']})" for c in cds) if cds else "none"))
    e = stats["last_error"]
    print(f"  last error: {_when(e['time'])} pid {e['pid']}: {e['message']}" if e else "  last error: none")
    print_namespaces(stats["namespaces"], indent="  ")


def print_namespaces(namespaces: dict[str, dict[str, Any]], indent: str = "", present: bool = False) -> None:
    """One row per namespace. `present`: PAGES and BYTES are what the store holds now (`ls`), else what
    serving processes wrote (`stats`). The MODEL column is as wide as the longest id: never cut."""
    if not namespaces:
        print(f"{indent}namespaces: " + ("none: the store holds no page" if present else
                                         "none written by a serving process yet"))
        return
    rows = sorted(namespaces.items(), key=lambda kv: (kv[1]["labels"].get("model", ""), kv[0]))
    width = max([5] + [len(d["labels"].get("model", "?")) for _, d in rows])
    pages, size = ("pages", "stored_bytes") if present else ("pages_written", "bytes_written")
    print(f"{indent}{'MODEL':<{width}} {'POOL/KIND':<12} {'RANK':<5} {'NAMESPACE':<17} {'PAGES':>9} "
          f"{'BYTES':>11}  LAST WRITE")
    for ns, d in rows:
        lab = d["labels"]
        print(f"{indent}{lab.get('model', '?'):<{width}} {lab.get('pool', lab.get('kind', '-')):<12} "
              f"{lab.get('rank', '-'):<5} {ns[:16]:<17} {d.get(pages, 0):>9} "
              f"{format_size(d.get(size, 0), 1):>11}  {_when(d.get('last_write'))}")


def list_namespaces(present: dict[str, dict[str, Any]], written: dict[str, dict[str, Any]],
                    names: dict[str, dict[str, str]] | None = None) -> dict[str, Any]:
    """Every namespace with pages in the store now, labelled (model, pool, rank) and with its writes from
    the stats files where a serving process wrote it; labels from the store's namespace names for pages
    written through the Python API (`?` when none was left)."""
    out = {}
    for ns, d in present.items():
        w = written.get(ns, {})
        out[ns] = {"labels": w.get("labels") or (names or {}).get(ns, {}), "pages": d["pages"],
                   "stored_bytes": d["stored_bytes"],
                   "tiers": d["tiers"], "pages_written": w.get("pages_written", 0),
                   "bytes_written": w.get("bytes_written", 0), "last_write": w.get("last_write")}
    return out


def cmd_ls(args: argparse.Namespace) -> int:
    """Namespaces with the pages and bytes the store holds now, read from the record headers of every
    tier (pages written through the Python API included), labelled from the serving processes' stats files."""
    from ..ops import merge_namespaces, read_stats_files, stats_dir

    store, _ = open_checked(args, read_only=True)
    with store:
        present = store.pages_by_namespace()
        names = store.namespace_names()
    directory = stats_dir(store.settings)
    namespaces = list_namespaces(present, merge_namespaces(read_stats_files(directory)), names)
    if args.json:
        print(json.dumps({"config": store.settings.source, "stats_dir": str(directory), "namespaces": namespaces},
                         indent=2))
        return EXIT_OK
    print(f"store: {store.settings.source}; pages and bytes held now per namespace (labels from the stats files "
          f"in {directory})")
    print_namespaces(namespaces, present=True)
    return EXIT_OK


def add_ls_parser(sub: Any) -> argparse.ArgumentParser:
    sp = sub.add_parser(
        "ls", help="namespaces with the pages and bytes the store holds now",
        description="One row per namespace with pages in the store now (read from every record header, so "
                    "pages written through the Python API are listed too, with model '?'): model, pool or kind, "
                    "rank, namespace, pages and bytes held, last write. Read-only.",
        epilog="example:\n  lifeboat ls --json", formatter_class=argparse.RawDescriptionHelpFormatter)
    sp.add_argument("--config", help="path to lifeboat.yaml (default: the usual lookup)")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.set_defaults(func=cmd_ls)
    return sp
