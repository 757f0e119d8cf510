"""`lifeboat`: inspect and maintain a store (stats, ls, verify, gc, purge, keygen), each with --config."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any, Sequence

from .config import ConfigError, Settings, format_size, load_settings
from .store import ChunkStore
from .tiers.base import Describing, SegmentDirs

log = logging.getLogger("lifeboat")


def _open(args: argparse.Namespace, *, read_only: bool = False, evict: bool = True) -> ChunkStore:
    settings = load_settings(args.config)
    return ChunkStore.open(settings, background=False, read_only=read_only, evict=evict, seal=False)


def collect_stats(store: ChunkStore) -> dict[str, Any]:
    """What `lifeboat stats` reports, per tier and in total."""
    tiers = []
    for tier in store.tiers:
        st = tier.stats()
        segs = tier.describe() if isinstance(tier, Describing) else []
        raw = sum(int(s["raw_bytes"]) for s in segs)
        stored = sum(int(s["stored_bytes"]) for s in segs)
        cap = tier.capacity_bytes()
        tiers.append({
            "tier": tier.name,
            "pages": st.get("pages", 0),
            "segments": len(segs) if segs else st.get("segments", 0),
            "stored_bytes": stored,
            "raw_bytes": raw,
            "compression_ratio": round(raw / stored, 3) if stored else None,
            "usage_bytes": tier.usage_bytes(),
            "capacity_bytes": cap,
            "capacity_used": round(tier.usage_bytes() / cap, 4) if cap else None,
        })
    if store.sealer.active:  # which key sealed how many pages (reads each record's header)
        for t, by_key in zip(tiers, store.pages_by_key_id()):
            t["pages_by_key_id"] = by_key
    return {"config": store.settings.source, "tiers": tiers}


def cmd_stats(args: argparse.Namespace) -> int:
    with _open(args, read_only=True) as store:  # inspecting never evicts, writes or creates anything
        stats = collect_stats(store)
    stats.update(collect_activity(store.settings, _parse_age(args.since)))
    if args.json:
        print(json.dumps(stats, indent=2))
        return 0
    print_activity(stats)
    print(f"config: {stats['config']}")
    for t in stats["tiers"]:
        ratio = f"{t['compression_ratio']:.3f}x" if t["compression_ratio"] else "n/a"
        cap = (f"{format_size(t['usage_bytes'], 1)} of {format_size(t['capacity_bytes'], 1)} "
               f"({100 * t['capacity_used']:.1f}%)") if t["capacity_bytes"] else format_size(t["usage_bytes"], 1)
        print(f"tier {t['tier']}\n  pages: {t['pages']}\n  segments: {t['segments']}\n"
              f"  stored: {format_size(t['stored_bytes'], 1)} (raw {format_size(t['raw_bytes'], 1)}, ratio {ratio})\n"
              f"  capacity: {cap}")
        if "pages_by_key_id" in t:
            print("  pages per key id: " + (", ".join(f"{k} {v}" for k, v in t["pages_by_key_id"].items()) or "none"))
    return 0


class _Progress:
    """A one-line progress bar on stderr, redrawn at most 10 times a second."""

    def __init__(self, label: str) -> None:
        self.label, self._last = label, 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done != total and now - self._last < 0.1:
            return
        self._last = now
        width = 30
        filled = width * done // max(total, 1)
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def cmd_verify(args: argparse.Namespace) -> int:
    fix = args.fix and not args.no_quarantine
    # without --fix nothing changes on disk; with it, bad records are quarantined but nothing is evicted
    with _open(args, read_only=not fix, evict=False) as store:
        progress = None if args.quiet else _Progress("verify")
        total = sum(t.stats().get("pages", 0) for t in store.tiers)
        problems = store.verify(fix=fix, progress=progress)
    for p in problems:
        print(f"BAD {p}")
    action = "fixed: quarantined or re-indexed" if fix else "reported; run with --fix to quarantine"
    print(f"verified {total} records: {len(problems)} bad" + (f" ({action})" if problems else ""))
    return 1 if problems else 0


def cmd_gc(args: argparse.Namespace) -> int:
    from .purge import compact_tier

    below = _parse_share(args.compact_below)
    with _open(args, evict=False) as store:  # evict here, not while opening, so "freed" is the truth
        # records no configured key opens (rotated out, shredded, plaintext): dropped, bytes compacted below
        unreadable = store.drop_unreadable()
        freed = store.gc()
        compacted: dict[str, int] = {}
        for tier in store.tiers:  # then remove purged / dead records' bytes (tiers/compaction.py)
            if isinstance(tier, SegmentDirs):
                for k, v in compact_tier(tier, below).items():
                    compacted[k] = compacted.get(k, 0) + v
        usage = sum(t.usage_bytes() for t in store.tiers)
    freed += compacted.get("freed_bytes", 0)
    print(f"gc: freed {format_size(freed, 1)}; now using {format_size(usage, 1)}")
    if unreadable:
        print(f"gc: dropped {unreadable} record(s) that no configured encryption key opens")
    if compacted:
        print(f"gc: compaction rewrote {compacted['rewritten']} segment(s) ({compacted['kept_records']} live "
              f"records kept), removed {compacted['removed']}; {compacted['skipped_unsealed']} open segment(s) "
              "of running writers skipped (compacted by a gc after they seal)")
    return 0


def _parse_share(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not 0.0 <= v <= 1.0:
        raise ConfigError(f"--compact-below {text!r}: expected a live share between 0 and 1, e.g. 0.5")
    return v


def cmd_keygen(args: argparse.Namespace) -> int:
    """Write a new 256-bit key file (mode 0600, never over an existing file) and print its key id."""
    from pathlib import Path

    from .sealing import key_id_text, write_key_file

    try:
        kid = write_key_file(Path(args.path))
    except FileExistsError:
        print(f"lifeboat: keygen: {args.path} exists; a key is never overwritten (pick another path)",
              file=sys.stderr)
        return 2
    print(f"keygen: wrote {args.path} (mode 0600), key id {key_id_text(kid)}; list it first under "
          "encryption.keys to seal with it")
    return 0


def _purge_key_ids(args: argparse.Namespace) -> int:
    """`purge --key-id`: drop the pages sealed with those keys (after the keys were deleted)."""
    from .purge import PurgeError, parse_key_ids, purge_key_ids

    if args.model or args.namespace or args.older_than:
        print("lifeboat: purge: --key-id goes alone (run a second purge for the other selectors)", file=sys.stderr)
        return 2
    ids = parse_key_ids(args.key_id)
    settings = load_settings(args.config)
    try:
        report = purge_key_ids(settings, ids, compact_now=args.gc, below=_parse_share(args.compact_below))
    except PurgeError as e:
        print(f"lifeboat: purge: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"purge: key id(s) {', '.join(report['key_ids'])}: {report['dropped_pages']} page(s) dropped from "
          "every tier; " + ("bytes removed" if args.gc else "run `lifeboat gc` to remove the bytes"))
    return 0


def cmd_purge(args: argparse.Namespace) -> int:
    """Remove a model's / namespace's / old pages from every index now; bytes at the next gc."""
    from .purge import PurgeError, purge, resolve

    if args.key_id:
        return _purge_key_ids(args)
    if not (args.model or args.namespace or args.older_than):
        print("lifeboat: purge: give --model M, --namespace N, --older-than AGE (e.g. 7d) or --key-id ID",
              file=sys.stderr)
        return 2
    settings = load_settings(args.config)
    req = resolve(settings, models=args.model, namespaces=args.namespace, older_than=args.older_than)
    below = _parse_share(args.compact_below)
    try:
        report = purge(settings, req, compact_now=args.gc, below=below)
    except PurgeError as e:
        print(f"lifeboat: purge: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
        return 1 if any(t.get("errors") for t in report["tiers"]) else 0
    for ns, labels in report["namespaces"].items():
        lab = ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "no labels in the stats files"
        print(f"purge: namespace {ns} ({lab})")
    if report["older_than_s"] is not None:
        print(f"purge: every page older than {report['older_than_s']:g} s")
    for t in report["tiers"]:
        extra = ", ".join(f"{k} {v}" for k, v in t.items() if k not in ("tier", "compaction"))
        print(f"purge: {t['tier']}: {extra}")
        if "compaction" in t:
            c = t["compaction"]
            print(f"purge: {t['tier']}: compacted: {c['rewritten']} rewritten, {c['removed']} removed, "
                  f"{format_size(c['freed_bytes'], 1)} freed, {c['skipped_unsealed']} open segment(s) skipped")
    failed = [t for t in report["tiers"] if t.get("errors")]
    for t in failed:
        print(f"lifeboat: purge: INCOMPLETE on {t['tier']}: {t['errors']} object(s) or listing failed "
              "(see the log above); run the same purge again", file=sys.stderr)
    if failed:
        return 1
    print("purge: no longer served by this process; other processes stop serving within their "
          "refresh_interval_s (default 1 s); " + ("bytes removed from sealed segments" if args.gc else
                                                  "run `lifeboat gc` to remove the bytes from disk"))
    return 0


def add_purge_parser(sub: Any) -> None:
    sp = sub.add_parser("purge", help="remove a model's, namespace's or old pages (bytes at the next gc)")
    sp.add_argument("--config", help="path to lifeboat.yaml (default: the usual lookup)")
    sp.add_argument("--model", action="append", help="every namespace of this model (as `lifeboat ls` shows it)")
    sp.add_argument("--namespace", action="append", help="a namespace fingerprint in hex (`lifeboat ls`)")
    sp.add_argument("--older-than", help="every page older than this age (e.g. 90m, 24h, 7d)")
    sp.add_argument("--key-id", action="append", help="every page sealed with this key id (8 hex digits, "
                    "`lifeboat stats`): crypto-shredding, after the key itself was deleted")
    sp.add_argument("--gc", action="store_true", help="compact now: remove the purged bytes from disk")
    sp.add_argument("--compact-below", default="0.5", help="with --gc: also rewrite segments whose live "
                                                           "share is under this (default 0.5)")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.set_defaults(func=cmd_purge)


# ------------------------------------------------------------------ activity of serving processes
# (read from their stats files only: `stats` and `ls` never write to the store)

_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _parse_age(text: str) -> float:
    """'90s', '30m', '24h', '7d', '2w' -> seconds."""
    t = text.strip().lower()
    try:
        if t[-1:] in _AGE_UNITS:
            v = float(t[:-1]) * _AGE_UNITS[t[-1]]
        else:
            v = float(t)
    except ValueError:
        v = -1.0
    if v <= 0:
        raise ConfigError(f"--since {text!r}: expected an age such as 30m, 24h or 7d")
    return v


def collect_activity(settings: Settings, since_s: float, now: float | None = None) -> dict[str, Any]:
    """Counters of live and recent serving processes, summed, from their stats files."""
    from . import metrics, statsfile

    now = time.time() if now is None else now
    directory = statsfile.stats_dir(settings)
    recs = [r for r in statsfile.read_stats_files(directory) if now - float(r.get("updated", 0)) <= since_s]
    live = [r for r in recs if statsfile.is_live(r, now)]
    c = statsfile.sum_dicts(r.get("counters") or {} for r in recs)
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
        "stats_dir": str(directory),
        "processes": {"live": len(live), "recent": len(recs) - len(live), "since_s": since_s},
        "activity": {
            "hit_rate": round(hits / keys, 4) if keys else None, "lookup_keys": keys, "lookup_hits": hits,
            "pages_read": c.get("pages_read", 0), "read_misses": c.get("read_misses", 0),
            "misses_by_reason": metrics.misses_by_reason(c), "drops_by_reason": metrics.drops_by_reason(c),
            "bytes_in": raw, "bytes_in_stored": stored, "bytes_out": c.get("bytes_read", 0),
            "pages_written": c.get("pages_written", 0), "promotions": c.get("promotions", 0),
            "copies": c.get("copies", 0), "quarantined": c.get("quarantined", 0),
            "latency": statsfile.merge_histograms(recs),
        },
        "namespaces": statsfile.merge_namespaces(recs),
        "cooldowns": cooldowns,
        "last_error": max(errors, key=lambda e: e["time"]) if errors else None,
    }


def _pct_of(h: dict[str, Any], q: float) -> str:
    """Upper bucket bound holding the q-quantile (a histogram only bounds it)."""
    from .metrics import LATENCY_BUCKETS_S

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


def print_namespaces(namespaces: dict[str, dict[str, Any]], indent: str = "") -> None:
    if not namespaces:
        print(f"{indent}namespaces: none written by a serving process yet")
        return
    rows = sorted(namespaces.items(), key=lambda kv: (kv[1]["labels"].get("model", ""), kv[0]))
    print(f"{indent}{'MODEL':<32} {'POOL/KIND':<12} {'RANK':<5} {'NAMESPACE':<17} {'PAGES':>9} "
          f"{'BYTES':>11}  LAST WRITE")
    for ns, d in rows:
        lab = d["labels"]
        print(f"{indent}{lab.get('model', '?')[-32:]:<32} {lab.get('pool', lab.get('kind', '-')):<12} "
              f"{lab.get('rank', '-'):<5} {ns[:16]:<17} {d['pages_written']:>9} "
              f"{format_size(d['bytes_written'], 1):>11}  {_when(d['last_write'])}")


def cmd_ls(args: argparse.Namespace) -> int:
    """Models / namespaces with pages, bytes and last write, from the serving processes' stats files."""
    from . import statsfile

    settings = load_settings(args.config)
    directory = statsfile.stats_dir(settings)
    namespaces = statsfile.merge_namespaces(statsfile.read_stats_files(directory))
    if args.json:
        print(json.dumps({"stats_dir": str(directory), "namespaces": namespaces}, indent=2))
        return 0
    print(f"store: {settings.source}; pages and bytes written per namespace (stats files in {directory})")
    print_namespaces(namespaces)
    return 0


def add_ls_parser(sub: Any) -> None:
    sp = sub.add_parser("ls", help="models / namespaces with pages, bytes and last write")
    sp.add_argument("--config", help="path to lifeboat.yaml (default: the usual lookup)")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.set_defaults(func=cmd_ls)


def _closed_pipe() -> int:
    """`lifeboat stats | head`: the reader left; stop quietly (no 'Broken pipe' at exit)."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass
    return 0


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lifeboat", description="Inspect and maintain a LifeboatCache store.")
    sub = p.add_subparsers(dest="command", required=True)
    for name, fn, help_ in (("stats", cmd_stats, "pages, bytes stored vs raw, compression, segments, capacity"),
                            ("verify", cmd_verify, "check every record both ways (index <-> files); --fix quarantines"),
                            ("gc", cmd_gc, "enforce the capacity bound now")):
        sp = sub.add_parser(name, help=help_)
        sp.add_argument("--config", help="path to lifeboat.yaml (default: LIFEBOAT_CONFIG, ./lifeboat.yaml, "
                                         "~/.config/lifeboat/lifeboat.yaml, else the embedded default)")
        sp.set_defaults(func=fn)
        if name == "stats":
            sp.add_argument("--json", action="store_true", help="machine-readable output")
            sp.add_argument("--since", default="24h", help="sum serving processes seen within this age "
                                                         "(e.g. 30m, 24h, 7d; default 24h)")
        if name == "verify":
            sp.add_argument("--fix", action="store_true",
                            help="quarantine bad records and re-index intact ones missing from the index")
            sp.add_argument("--no-quarantine", action="store_true", help="only report (the default; kept for scripts)")
            sp.add_argument("--quiet", action="store_true", help="no progress bar")
        if name == "gc":
            sp.add_argument("--compact-below", default="0.5", help="rewrite sealed segments whose live share "
                                                                   "is under this, and any holding purged pages")
    add_ls_parser(sub)
    add_purge_parser(sub)
    sp = sub.add_parser("keygen", help="create a key file for sealed records (encryption.keys)")
    sp.add_argument("path", help="the new key file (refused if it exists)")
    sp.set_defaults(func=cmd_keygen)
    from .bench import add_parser as add_bench_parser  # light: the bench sections import lazily

    add_bench_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    args = setup_arg_parser().parse_args(argv)
    try:
        rc = args.func(args)
        sys.stdout.flush()  # a reader that left must fail here, not in the interpreter's exit flush
        return rc
    except BrokenPipeError:
        return _closed_pipe()
    except ConfigError as e:
        print(f"lifeboat: configuration error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"lifeboat: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
