"""The `lifeboat` command line: its parser, `main`, and the stats, verify, gc and keygen subcommands."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any, Sequence

from ..config import ConfigError, format_size, load_settings
from ..store import ChunkStore
from ..tiers import Describing, SegmentDirs
from .activity import add_ls_parser, collect_activity, parse_since, print_activity
from .purge import add_purge_parser, parse_share

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
    stats.update(collect_activity(store.settings, parse_since(args.since)))
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
    from ..ops import compact_tier

    below = parse_share(args.compact_below)
    with _open(args, evict=False) as store:  # evict here, not while opening, so "freed" is the truth
        # records no configured key opens (rotated out, shredded, plaintext): dropped, bytes compacted below
        unreadable = store.drop_unreadable()
        freed = store.gc()
        compacted: dict[str, int] = {}
        for tier in store.tiers:  # then remove purged / dead records' bytes (tiers/segments/compaction.py)
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


def cmd_keygen(args: argparse.Namespace) -> int:
    """Write a new 256-bit key file (mode 0600, never over an existing file) and print its key id."""
    from pathlib import Path

    from ..records import key_id_text, write_key_file

    try:
        kid = write_key_file(Path(args.path))
    except FileExistsError:
        print(f"lifeboat: keygen: {args.path} exists; a key is never overwritten (pick another path)",
              file=sys.stderr)
        return 2
    print(f"keygen: wrote {args.path} (mode 0600), key id {key_id_text(kid)}; list it first under "
          "encryption.keys to seal with it")
    return 0


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
    from ..bench import add_parser as add_bench_parser  # light: the bench sections import lazily

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
