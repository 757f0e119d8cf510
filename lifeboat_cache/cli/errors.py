"""The kinds of failure a `lifeboat` command reports, each with its own exit code (docs/operating.md).

Why: scripts and monitoring tell "you typed it wrong" from "the store is unreachable" from "the store
holds bad records" by the exit code alone; one code for everything (or 0 for a store that could not be
read) made a broken setup look fine.
"""

from __future__ import annotations

import sys

EXIT_OK = 0
EXIT_DATA = 1  # the command ran and found bad data (verify: bad records)
EXIT_USAGE = 2  # a bad command line (argparse's own code too)
EXIT_CONFIG = 3  # lifeboat.yaml, LIFEBOAT_* or a key file is invalid
EXIT_STORAGE = 4  # a configured tier cannot be reached, read or written
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as shells report it

KINDS = {EXIT_USAGE: "usage", EXIT_CONFIG: "configuration", EXIT_STORAGE: "storage", EXIT_DATA: "data"}


class UsageError(Exception):
    """A command-line value is invalid; the message names the option and an example."""


class StorageError(Exception):
    """A configured tier cannot be reached, read or written; the message names the tier and the cause."""


def fail(code: int, message: str) -> int:
    """Print `lifeboat: <kind> error: message` on stderr and return `code`."""
    print(f"lifeboat: {KINDS.get(code, 'unexpected')} error: {message}", file=sys.stderr)
    return code
