"""The `lifeboat` command line: the parser (a description and an example per subcommand) and `main`,
which turns every failure into one line on stderr and an exit code of its kind (errors.py)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, Sequence

from .. import __version__
from ..config import ConfigError
from .activity import add_ls_parser
from .commands import cmd_gc, cmd_keygen, cmd_stats, cmd_verify
from .errors import (
    EXIT_CONFIG, EXIT_INTERRUPTED, EXIT_OK, EXIT_STORAGE, EXIT_USAGE, StorageError, UsageError, fail)
from .purge import add_purge_parser

CONFIG_HELP = ("path to lifeboat.yaml (default: LIFEBOAT_CONFIG, ./lifeboat.yaml, ~/.config/lifeboat/lifeboat.yaml, "
               "else the embedded default)")
#: Options taking a value that may start with '-' (`--older-than -5d`): argparse would read it as an option.
VALUE_OPTIONS = ("--older-than", "--since", "--compact-below")

EXIT_CODES = """exit codes: 0 ok; 1 data (verify found bad records); 2 usage (a bad command line);
3 configuration (lifeboat.yaml, LIFEBOAT_*, a key file); 4 storage (a tier cannot be reached, read or
written, or a purge is incomplete); 130 interrupted (Ctrl-C)"""


def subcommand(sub: Any, name: str, help_: str, description: str, example: str) -> argparse.ArgumentParser:
    """A subparser with its description and an example shown by `lifeboat NAME --help`."""
    return sub.add_parser(name, help=help_, description=description, epilog=f"example:\n  {example}",
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lifeboat", description="Inspect and maintain a LifeboatCache store.",
                                epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"lifeboat {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    sp = subcommand(sub, "stats", "pages, bytes stored vs raw, compression, segments, capacity, reachability",
                    "Per tier: reachable or not and its last error, pages, segments, bytes stored vs raw, capacity, "
                    "index snapshots; then what the serving processes did. Read-only. Exits 4 when a tier cannot "
                    "be reached or read (after printing what it could).", "lifeboat stats --json --since 7d")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.add_argument("--since", default="24h", help="sum serving processes seen within this age (e.g. 30m, 24h, 7d; "
                                                  "default 24h)")
    sp.set_defaults(func=cmd_stats)
    sp = subcommand(sub, "verify", "check every record both ways (index <-> files); --fix quarantines",
                    "Reads every indexed record and checks it (header, key digest, namespace, payload checksum), "
                    "and every record on disk is indexed. Without --fix nothing changes. Exits 1 when a record "
                    "is bad.", "lifeboat verify --fix")
    sp.add_argument("--fix", action="store_true",
                    help="quarantine bad records and re-index intact ones missing from the index")
    sp.add_argument("--quiet", action="store_true", help="no progress bar (there is none unless stderr is a terminal)")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.set_defaults(func=cmd_verify)
    sp = subcommand(sub, "gc", "enforce the capacity bound now and compact segments",
                    "Evicts the oldest whole segments over the capacity, then rewrites sealed segments holding "
                    "purged or dead records (and those whose live share is under --compact-below).",
                    "lifeboat gc --compact-below 0.3")
    sp.add_argument("--compact-below", default="0.5", help="rewrite sealed segments whose live share is under this, "
                                                          "and any holding purged pages (default 0.5)")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.set_defaults(func=cmd_gc)
    for name in ("stats", "verify", "gc"):
        sub.choices[name].add_argument("--config", help=CONFIG_HELP)
    add_ls_parser(sub)
    add_purge_parser(sub)
    sp = subcommand(sub, "keygen", "create a key file for sealed records (encryption.keys)",
                    "Writes 32 random bytes (mode 0600; never over an existing file) and prints the key id.",
                    "lifeboat keygen /etc/lifeboat/seal-2026.key")
    sp.add_argument("path", help="the new key file (refused if it exists)")
    sp.set_defaults(func=cmd_keygen)
    from ..bench import add_parser as add_bench_parser  # light: the bench sections import lazily

    bp = add_bench_parser(sub)
    bp.description = "Measure everything in one run: a table, results.json and PNG plots."
    bp.epilog, bp.formatter_class = "example:\n  lifeboat bench --quick --out bench-results", \
        argparse.RawDescriptionHelpFormatter
    return p


def join_negative_values(argv: list[str]) -> list[str]:
    """`--older-than -5d` -> `--older-than=-5d`, so the value reaches its check (a clear error), not
    argparse's 'expected one argument'."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in VALUE_OPTIONS and i + 1 < len(argv) and argv[i + 1][:1] == "-" and argv[i + 1][1:2].isdigit():
            out.append(f"{a}={argv[i + 1]}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def _closed_pipe() -> int:
    """`lifeboat stats | head`: the reader left; stop quietly (no 'Broken pipe' at exit)."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        args = setup_arg_parser().parse_args(join_negative_values(list(sys.argv[1:] if argv is None else argv)))
        rc = args.func(args)
        sys.stdout.flush()  # a reader that left must fail here, not in the interpreter's exit flush
        return int(rc)
    except KeyboardInterrupt:
        print("lifeboat: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return _closed_pipe()
    except UsageError as e:
        return fail(EXIT_USAGE, str(e))
    except ConfigError as e:
        return fail(EXIT_CONFIG, str(e))
    except (StorageError, OSError) as e:
        return fail(EXIT_STORAGE, str(e))
