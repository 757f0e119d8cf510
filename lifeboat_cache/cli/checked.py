"""Open the configured store for a command, or fail naming the tier that cannot be reached and why.

Why: an unreachable tier (an S3 endpoint that does not answer, no credentials, a store path that does
not exist or may not be read) looks like an empty one, and the commands reported `pages: 0` or
`verified 0 records: 0 bad` with exit code 0. The directories are checked before the store is opened,
so a maintenance open (gc, purge, verify --fix) never creates a directory that was not there.
"""

from __future__ import annotations

import argparse
from ..config import load_settings
from ..ops import TierHealth, path_problems, tier_health
from ..store import ChunkStore
from .errors import StorageError


def unreachable(problems: list[TierHealth]) -> StorageError:
    names = "; ".join(h.message() for h in problems)
    return StorageError(f"{len(problems)} tier(s) cannot be reached or read: {names}")


def open_checked(args: argparse.Namespace, *, read_only: bool, evict: bool = False,
                 lenient: bool = False) -> tuple[ChunkStore, list[TierHealth]]:
    """The store and each tier's health. Raises StorageError for an unreachable tier, unless `lenient`
    (`stats`, which reports what it can and then fails)."""
    settings = load_settings(args.config)
    problems = path_problems(settings, write=not read_only)
    if problems and not (lenient and read_only):
        raise unreachable(problems)
    try:
        store = ChunkStore.open(settings, background=False, read_only=read_only, evict=evict, seal=False)
    except OSError as e:
        raise StorageError(f"cannot open the store of {settings.source}: {e}") from None
    health = tier_health(store, problems)
    bad = [h for h in health if not h.reachable]
    if bad and not lenient:
        store.close()
        raise unreachable(bad)
    return store, health
