"""`lifeboat purge`: remove a model's, namespace's, old or a key's pages from every tier (bytes at gc)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..config import ConfigError, format_size, load_settings


def parse_share(text: str) -> float:
    """`--compact-below`: a live share between 0 and 1."""
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not 0.0 <= v <= 1.0:
        raise ConfigError(f"--compact-below {text!r}: expected a live share between 0 and 1, e.g. 0.5")
    return v


def _purge_key_ids(args: argparse.Namespace) -> int:
    """`purge --key-id`: drop the pages sealed with those keys (after the keys were deleted)."""
    from ..ops import PurgeError, parse_key_ids, purge_key_ids

    if args.model or args.namespace or args.older_than:
        print("lifeboat: purge: --key-id goes alone (run a second purge for the other selectors)", file=sys.stderr)
        return 2
    ids = parse_key_ids(args.key_id)
    settings = load_settings(args.config)
    try:
        report = purge_key_ids(settings, ids, compact_now=args.gc, below=parse_share(args.compact_below))
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
    from ..ops import PurgeError, purge, resolve

    if args.key_id:
        return _purge_key_ids(args)
    if not (args.model or args.namespace or args.older_than):
        print("lifeboat: purge: give --model M, --namespace N, --older-than AGE (e.g. 7d) or --key-id ID",
              file=sys.stderr)
        return 2
    settings = load_settings(args.config)
    req = resolve(settings, models=args.model, namespaces=args.namespace, older_than=args.older_than)
    below = parse_share(args.compact_below)
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
