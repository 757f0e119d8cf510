"""The `bench` subcommand: its arguments, and the runner it starts (imported only when it runs)."""

from __future__ import annotations

import argparse

from .sizes import SECTIONS


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The `bench` subcommand's arguments (the cli calls this)."""
    p = sub.add_parser("bench", help="measure everything in one run: table, results.json, PNG plots")
    p.add_argument("--out", default="bench-results", help="results folder (default: bench-results/)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, end to end (CI): a few minutes, most of it "
                                                     "the server section's four SGLang starts")
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of: {', '.join(SECTIONS)}")
    p.add_argument("--size", action="append", default=[], metavar="KEY=VALUE",
                   help="override one size of the preset, e.g. --size reps=5 --size case_mib=512 "
                        "(keys: see lifeboat_cache/bench/sizes.py)")
    p.add_argument("--work-dir", default=None, help="where the contenders write (default: OUT/work; "
                                                    "must be a real disk for cold reads)")
    p.set_defaults(func=_cmd)
    return p


def _cmd(args: argparse.Namespace) -> int:
    from .runner import main

    return main(args)
