"""The `stats`, `verify`, `gc` and `keygen` subcommands (the parser and `main` are in parser.py).

Each opens the store through `checked.open_checked`, so a tier that cannot be reached or read fails
the command (exit 4, naming the tier and the cause) instead of being reported as empty.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any

from ..store import ChunkStore
from ..tiers import Describing, SegmentDirs
from ..config import format_size
from ..retention import RETENTION_COUNTERS
from .activity import collect_activity, parse_since, print_activity
from .checked import open_checked
from .errors import EXIT_DATA, EXIT_OK, EXIT_STORAGE, EXIT_USAGE, fail
from .purge import parse_share

log = logging.getLogger("lifeboat")

#: This open's index rebuild, per tier: what a restarting process would load from the same files now.
REBUILD_FIELDS = ("rebuild_ms", "snapshot_pages", "snapshot_segments", "scanned_segments",
                  "snapshot_mismatched_units", "snapshot_discarded")


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
            "usage_bytes": tier.usage_bytes(),  # what the capacity counts: the pages' bytes
            "disk_bytes": sum(int(s["bytes"]) for s in segs),  # with the records' headers and trailers
            "capacity_bytes": cap,
            "capacity_used": round(tier.usage_bytes() / cap, 4) if cap else None,
            **{k: int(st[k]) for k in REBUILD_FIELDS if k in st},
            "retention_read_records": int(st.get("retention_read_records", 0)),
        })
    if store.sealer.active:  # which key sealed how many pages (reads each record's header)
        for t, by_key in zip(tiers, store.pages_by_key_id()):
            t["pages_by_key_id"] = by_key
    return {"config": store.settings.source, "tiers": tiers}


def cmd_stats(args: argparse.Namespace) -> int:
    since = parse_since(args.since)
    store, health = open_checked(args, read_only=True, lenient=True)  # never evicts, writes or creates
    with store:
        stats = collect_stats(store)
    for t, h in zip(stats["tiers"], health):
        t.update(reachable=h.reachable, last_error=h.error)
    stats.update(collect_activity(store.settings, since))
    serving = stats.pop("tier_snapshots")
    kept = stats.pop("tier_retention")
    for t in stats["tiers"]:
        t.update(serving.get(t["tier"], {"snapshot_saves": 0, "snapshot_save_failures": 0, "snapshot_save_ms": None}))
        t["retention"] = {"read_records_known": t.pop("retention_read_records", 0),
                          **kept.get(t["tier"], dict.fromkeys(RETENTION_COUNTERS, 0))}
    bad = [h for h in health if not h.reachable]
    if args.json:
        print(json.dumps(stats, indent=2))
    else:
        print_stats(stats)
    if bad:
        return fail(EXIT_STORAGE, "; ".join(h.message() for h in bad))
    return EXIT_OK


def print_stats(stats: dict[str, Any]) -> None:
    print_activity(stats)
    print(f"config: {stats['config']}")
    for t in stats["tiers"]:
        ratio = f"{t['compression_ratio']:.3f}x" if t["compression_ratio"] else "n/a"
        cap = (f"{format_size(t['usage_bytes'], 1)} of {format_size(t['capacity_bytes'], 1)} "
               f"({100 * t['capacity_used']:.1f}%)") if t["capacity_bytes"] else format_size(t["usage_bytes"], 1)
        cap += f" of pages, {format_size(t['disk_bytes'], 1)} on disk"
        state = "yes" if t["reachable"] else f"NO: {t['last_error']}"
        print(f"tier {t['tier']}\n  reachable: {state}\n  pages: {t['pages']}\n  segments: {t['segments']}\n"
              f"  stored: {format_size(t['stored_bytes'], 1)} (raw {format_size(t['raw_bytes'], 1)}, ratio {ratio})\n"
              f"  capacity: {cap}\n  index snapshots saved by serving processes: {t['snapshot_saves']} "
              f"({t['snapshot_save_failures']} failed)")
        r = t["retention"]
        print(f"  retention: {r['read_records_known']} read records known now; serving processes kept "
              f"{r['retention_kept_segments']} segment(s) whole, reinserted {r['retention_reinserted_records']} read "
              f"record(s) ({format_size(r['retention_rewritten_bytes'], 1)} rewritten), evicted "
              f"{r['evicted_unread_records']} unread record(s)")
        if "pages_by_key_id" in t:
            print("  pages per key id: " + (", ".join(f"{k} {v}" for k, v in t["pages_by_key_id"].items()) or "none"))


class _Progress:
    """A one-line progress bar on stderr, redrawn at most 10 times a second (only on a terminal)."""

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


def progress_bar(label: str, quiet: bool) -> _Progress | None:
    """A bar only for a person watching: never `\\r` frames into a redirected file or a pipe."""
    return None if quiet or not sys.stderr.isatty() else _Progress(label)


def cmd_verify(args: argparse.Namespace) -> int:
    # without --fix nothing changes on disk; with it, bad records are quarantined but nothing is evicted
    store, _ = open_checked(args, read_only=not args.fix, evict=False)
    with store:
        total = sum(t.stats().get("pages", 0) for t in store.tiers)
        problems = store.verify(fix=args.fix, progress=progress_bar("verify", args.quiet or args.json))
    if args.json:
        print(json.dumps({"config": store.settings.source, "records": total, "bad": len(problems),
                          "fixed": bool(args.fix and problems), "problems": problems}, indent=2))
        return EXIT_DATA if problems else EXIT_OK
    for p in problems:
        print(f"BAD {p}")
    action = "fixed: quarantined or re-indexed" if args.fix else "reported; run with --fix to quarantine"
    print(f"verified {total} records: {len(problems)} bad" + (f" ({action})" if problems else ""))
    return EXIT_DATA if problems else EXIT_OK


def cmd_gc(args: argparse.Namespace) -> int:
    from ..ops import compact_tier

    below = parse_share(args.compact_below)
    store, _ = open_checked(args, read_only=False, evict=False)  # evict here, not while opening: "freed" is true
    with store:
        # records no configured key opens (rotated out, shredded, plaintext): dropped, bytes compacted below
        unreadable = store.drop_unreadable()
        freed = store.gc()
        kept = {k: sum(int(t.stats().get(k, 0)) for t in store.tiers) for k in RETENTION_COUNTERS}
        compacted: dict[str, int] = {}
        for tier in store.tiers:  # then remove purged / dead records' bytes (tiers/segments/compaction.py)
            if isinstance(tier, SegmentDirs):
                for k, v in compact_tier(tier, below).items():
                    compacted[k] = compacted.get(k, 0) + v
        usage = sum(t.usage_bytes() for t in store.tiers)
    freed += compacted.get("freed_bytes", 0)
    if args.json:
        print(json.dumps({"config": store.settings.source, "freed_bytes": freed, "usage_bytes": usage,
                          "dropped_unreadable": unreadable, "retention": kept, "compaction": compacted or None},
                         indent=2))
        return EXIT_OK
    print(f"gc: freed {format_size(freed, 1)}; now using {format_size(usage, 1)}")
    if any(kept.values()):
        print(f"gc: retention kept {kept['retention_kept_segments']} segment(s) whole and reinserted "
              f"{kept['retention_reinserted_records']} read record(s) "
              f"({format_size(kept['retention_rewritten_bytes'], 1)} rewritten); "
              f"{kept['evicted_unread_records']} unread record(s) evicted")
    if unreadable:
        print(f"gc: dropped {unreadable} record(s) that no configured encryption key opens")
    if compacted:
        print(f"gc: compaction rewrote {compacted['rewritten']} segment(s) ({compacted['kept_records']} live "
              f"records kept), removed {compacted['removed']}; {compacted['skipped_unsealed']} open segment(s) "
              "of running writers skipped (compacted by a gc after they seal)")
    return EXIT_OK


def cmd_keygen(args: argparse.Namespace) -> int:
    """Write a new 256-bit key file (mode 0600, never over an existing file) and print its key id."""
    from pathlib import Path

    from ..records import key_id_text, write_key_file

    try:
        kid = write_key_file(Path(args.path))
    except FileExistsError:
        return fail(EXIT_USAGE, f"keygen: {args.path} exists; a key is never overwritten (pick another path)")
    print(f"keygen: wrote {args.path} (mode 0600), key id {key_id_text(kid)}; list it first under "
          "encryption.keys to seal with it")
    return EXIT_OK
