"""`lifeboat`: inspect and maintain a store (stats, verify, gc), each with --config."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any, Sequence

from .config import ConfigError, load_settings
from .store import ChunkStore

log = logging.getLogger("lifeboat")


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def _open(args: argparse.Namespace, *, read_only: bool = False, evict: bool = True) -> ChunkStore:
    settings = load_settings(args.config)
    return ChunkStore.open(settings, background=False, read_only=read_only, evict=evict)


def collect_stats(store: ChunkStore) -> dict[str, Any]:
    """What `lifeboat stats` reports, per tier and in total."""
    tiers = []
    for tier in store.tiers:
        st = tier.stats()
        segs = tier.describe() if hasattr(tier, "describe") else []
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
    return {"config": store.settings.source, "tiers": tiers}


def cmd_stats(args: argparse.Namespace) -> int:
    with _open(args, read_only=True) as store:  # inspecting never evicts, writes or creates anything
        stats = collect_stats(store)
    if args.json:
        print(json.dumps(stats, indent=2))
        return 0
    print(f"config: {stats['config']}")
    for t in stats["tiers"]:
        ratio = f"{t['compression_ratio']:.3f}x" if t["compression_ratio"] else "n/a"
        cap = (f"{_fmt_bytes(t['usage_bytes'])} of {_fmt_bytes(t['capacity_bytes'])} "
               f"({100 * t['capacity_used']:.1f}%)") if t["capacity_bytes"] else _fmt_bytes(t["usage_bytes"])
        print(f"tier {t['tier']}\n  pages: {t['pages']}\n  segments: {t['segments']}\n"
              f"  stored: {_fmt_bytes(t['stored_bytes'])} (raw {_fmt_bytes(t['raw_bytes'])}, ratio {ratio})\n"
              f"  capacity: {cap}")
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
    with _open(args, evict=False) as store:  # evict here, not while opening, so "freed" is the truth
        freed = store.gc()
        usage = sum(t.usage_bytes() for t in store.tiers)
    print(f"gc: freed {_fmt_bytes(freed)}; now using {_fmt_bytes(usage)}")
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
        if name == "verify":
            sp.add_argument("--fix", action="store_true",
                            help="quarantine bad records and re-index intact ones missing from the index")
            sp.add_argument("--no-quarantine", action="store_true", help="only report (the default; kept for scripts)")
            sp.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    args = setup_arg_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as e:
        print(f"lifeboat: configuration error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"lifeboat: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
