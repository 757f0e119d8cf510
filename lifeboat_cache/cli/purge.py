"""`lifeboat purge`: remove a model's, namespace's, old or a key's pages from every tier (bytes at gc)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..config import ConfigError, Settings, format_size, load_settings, parse_age
from .checked import unreachable
from .errors import EXIT_OK, EXIT_STORAGE, StorageError, UsageError, fail


def parse_share(text: str) -> float:
    """`--compact-below`: a live share between 0 and 1."""
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not 0.0 <= v <= 1.0:
        raise UsageError(f"--compact-below {text!r}: expected a live share between 0 and 1, e.g. 0.5")
    return v


def _writable_store(settings: Settings, dry_run: bool = False) -> None:
    """Every local / nfs directory exists and may be read (and written, unless `dry_run`)."""
    from ..ops import path_problems

    problems = path_problems(settings, write=not dry_run)
    if problems:
        raise unreachable(problems)


def _purge_key_ids(args: argparse.Namespace) -> int:
    """`purge --key-id`: drop the pages sealed with those keys (after the keys were deleted)."""
    from ..ops import PurgeError, parse_key_ids, purge_key_ids

    if args.model or args.namespace or args.older_than or args.dry_run:
        raise UsageError("purge: --key-id goes alone (run a second purge for the other selectors; no --dry-run)")
    try:
        ids = parse_key_ids(args.key_id)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    settings = load_settings(args.config)
    _writable_store(settings)
    try:
        report = purge_key_ids(settings, ids, compact_now=args.gc, below=parse_share(args.compact_below))
    except PurgeError as e:
        raise StorageError(f"purge: {e}") from None
    if args.json:
        print(json.dumps(report, indent=2))
        return EXIT_OK
    print(f"purge: key id(s) {', '.join(report['key_ids'])}: {report['dropped_pages']} page(s) dropped from "
          "every tier; " + ("bytes removed" if args.gc else "run `lifeboat gc` to remove the bytes"))
    return EXIT_OK


def _present_namespaces(settings: Settings, args: argparse.Namespace) -> list[str]:
    """The store's own namespaces, read only when a --namespace prefix must be looked up."""
    if not any(len(n.strip()) < 32 for n in args.namespace or []):
        return []
    from ..store import ChunkStore

    with ChunkStore.open(settings, background=False, read_only=True, seal=False) as store:
        return list(store.pages_by_namespace())


def _store_names(settings: Settings, args: argparse.Namespace) -> dict[str, dict[str, str]]:
    """The namespace names Python API writers left in the store, read only when --model is given."""
    if not args.model:
        return {}
    from ..store import ChunkStore

    with ChunkStore.open(settings, background=False, read_only=True, seal=False) as store:
        return store.namespace_names()


def cmd_purge(args: argparse.Namespace) -> int:
    """Remove a model's / namespace's / old pages from every index now; bytes at the next gc."""
    from ..ops import PurgeError, purge, resolve

    if args.key_id:
        return _purge_key_ids(args)
    if not (args.model or args.namespace or args.older_than):
        raise UsageError("purge: give --model M, --namespace N, --older-than AGE (e.g. 7d) or --key-id ID")
    below = parse_share(args.compact_below)
    if args.older_than is not None:  # a bad age is a usage error, whatever the state of the store
        try:
            parse_age(args.older_than, "--older-than")
        except ConfigError as e:
            raise UsageError(str(e)) from None
    settings = load_settings(args.config)
    _writable_store(settings, args.dry_run)
    try:
        req = resolve(settings, models=args.model, namespaces=args.namespace, older_than=args.older_than,
                      present=_present_namespaces(settings, args), names=_store_names(settings, args))
    except ConfigError as e:  # a selector given on the command line
        raise UsageError(str(e)) from None
    try:
        report = purge(settings, req, compact_now=args.gc, below=below, dry_run=args.dry_run)
    except PurgeError as e:
        raise StorageError(f"purge: {e}") from None
    failed = [t for t in report["tiers"] if t.get("errors")]
    if args.json:
        print(json.dumps(report, indent=2))
        return EXIT_STORAGE if failed else EXIT_OK
    _print_report(report, args)
    for t in failed:
        fail(EXIT_STORAGE, f"purge: INCOMPLETE on {t['tier']}: {t['errors']} object(s) or listing failed "
                           "(see the log above); run the same purge again")
    if failed:
        return EXIT_STORAGE
    if args.dry_run:
        print("purge: dry run: nothing changed")
        return EXIT_OK
    print("purge: no longer served by this process; other processes stop serving within their "
          "refresh_interval_s (default 1 s); " + ("bytes removed from sealed segments" if args.gc else
                                                  "run `lifeboat gc` to remove the bytes from disk"))
    return EXIT_OK


def _print_report(report: dict[str, Any], args: argparse.Namespace) -> None:
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
    sys.stdout.flush()


def add_purge_parser(sub: Any) -> argparse.ArgumentParser:
    sp = sub.add_parser(
        "purge", help="remove a model's, namespace's or old pages (bytes at the next gc)",
        description="Stops every process serving the selected pages (rules in purge.list) and rewrites S3 objects "
                    "without them; `lifeboat gc` (or --gc) then removes the bytes from disk. --model matches the "
                    "model id exactly as `lifeboat ls` shows it, or a glob ('org/*'). Exits 4 when a tier cannot "
                    "be reached or the purge is incomplete (run it again).",
        epilog="examples:\n  lifeboat purge --model meta-llama/Llama-3.1-8B-Instruct --dry-run\n"
               "  lifeboat purge --older-than 30d --gc", formatter_class=argparse.RawDescriptionHelpFormatter)
    sp.add_argument("--config", help="path to lifeboat.yaml (default: the usual lookup)")
    sp.add_argument("--model", action="append", help="every namespace of this model id (exactly as `lifeboat ls` "
                                                     "shows it; a glob such as 'org/*' for several)")
    sp.add_argument("--namespace", action="append", help="a namespace fingerprint in hex (`lifeboat ls`)")
    sp.add_argument("--older-than", help="every page older than this age (e.g. 90m, 24h, 7d)")
    sp.add_argument("--key-id", action="append", help="every page sealed with this key id (8 hex digits, "
                    "`lifeboat stats`): crypto-shredding, after the key itself was deleted")
    sp.add_argument("--dry-run", action="store_true", help="count the pages that would be purged; change nothing")
    sp.add_argument("--gc", action="store_true", help="compact now: remove the purged bytes from disk")
    sp.add_argument("--compact-below", default="0.5", help="with --gc: also rewrite segments whose live "
                                                           "share is under this (default 0.5)")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.set_defaults(func=cmd_purge)
    return sp
