"""Can each configured tier be reached and read? What every `lifeboat` command checks before it reports.

Why: a store that cannot be reached looks exactly like an empty one. An S3 endpoint that does not
answer, missing credentials or a store path that does not exist gave `pages: 0`, `verified 0 records:
0 bad` and exit code 0, so a broken setup read as a healthy, empty cache. Each command now asks here
first and fails (naming the tier and the cause) instead of reporting figures of nothing.

Two halves: `path_problems` looks at the local / nfs directories before a store is opened (so that a
maintenance open never creates a directory that was not there), `tier_health` asks each opened tier
that declares `Probing` (S3: one 1-key listing; its error is the cause shown).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import Settings
from ..tiers import Probing

if TYPE_CHECKING:
    from ..store import ChunkStore


@dataclass(frozen=True)
class TierHealth:
    """One configured tier: `where` is its YAML path (storage[i]), `tier` its name as `stats` prints it."""

    where: str
    tier: str
    reachable: bool
    error: str | None = None

    def message(self) -> str:
        return f"tier {self.tier} ({self.where}): {self.error}"

    def as_dict(self) -> dict[str, Any]:
        return {"tier": self.tier, "where": self.where, "reachable": self.reachable, "last_error": self.error}


def tier_name(kind: str, paths: tuple[Path, ...] | None = None, bucket: str | None = None, prefix: str = "") -> str:
    """The name a tier reports (`local:/a,/b`, `s3://bucket/prefix/`), known before it is opened."""
    if kind == "s3":
        p = prefix.lstrip("/")
        return f"s3://{bucket}/{p if not p or p.endswith('/') else p + '/'}"
    return f"{kind}:{','.join(str(p) for p in paths or ())}"


def directory_problem(path: Path, *, write: bool) -> str | None:
    """Why `path` cannot serve as a store directory for reading (or, with `write`, for changing), or None."""
    try:
        if not path.exists():
            return f"{path} does not exist (nothing was ever written there: check the path in lifeboat.yaml)"
        if not path.is_dir():
            return f"{path} is not a directory"
        with os.scandir(path) as it:  # permission denied, EIO, a stale NFS handle all show here
            next(it, None)
    except OSError as e:
        return f"{path}: cannot be read ({e.strerror or e})"
    if not os.access(path, os.R_OK | os.X_OK):
        return f"{path}: permission denied (read)"
    if write and not os.access(path, os.W_OK | os.X_OK):
        return (f"{path} is read-only for this user (or on a read-only file system): this command changes files "
                "there; run it as the store's owner")
    return None


def path_problems(settings: Settings, *, write: bool = False) -> list[TierHealth]:
    """The local / nfs tiers whose directories cannot be read (or written, with `write`); no file changes."""
    out = []
    for i, ts in enumerate(settings.storage):
        if ts.type == "s3":
            continue
        errors = [e for e in (directory_problem(Path(p), write=write) for p in ts.paths) if e]
        if errors:
            out.append(TierHealth(f"storage[{i}]", tier_name(ts.type, ts.paths), False, "; ".join(errors)))
    return out


def tier_health(store: "ChunkStore", known: list[TierHealth] | None = None) -> list[TierHealth]:
    """Per opened tier (the store's order is the config's): reachable or not and the last error.

    A tier that declares `Probing` (S3) is asked once now; a local / nfs tier is reachable when `known`
    (path_problems, run before the open) names no problem for it."""
    bad = {h.where: h for h in known or []}
    out = []
    for i, tier in enumerate(store.tiers):
        where = f"storage[{i}]"
        if where in bad:
            out.append(TierHealth(where, tier.name, False, bad[where].error))
            continue
        error = None
        if isinstance(tier, Probing):  # one cheap request (S3: a 1-key listing); its failure is the cause
            try:
                tier.probe()
            except OSError as e:
                error = str(e)
        out.append(TierHealth(where, tier.name, error is None, error))
    return out
