"""Storage tiers. `open_tier(settings)` builds the tier a `storage[]` entry describes."""

from __future__ import annotations

from ..config import DEFAULT_IO_WORKERS, TierSettings
from .base import Rank, Tier
from .local import LocalTier


def open_tier(settings: TierSettings, *, background: bool = True, io_workers: int | None = None,
              deadline_s: float | None = None, read_only: bool = False, evict: bool = True,
              rank: Rank | None = None) -> Tier:
    """Build and open the tier for one `storage[]` entry (imports optional backends lazily).

    `io_workers` sizes a network tier's connection pool (default: the engine default);
    `deadline_s` (engine.deadline_s) bounds a network tier's data-path request timeouts.
    `read_only` / `evict=False`: see ChunkStore.open (every tier honours them). `rank`: which copy of a
    page an index rebuild keeps when it meets the page twice (base.settle_twins).
    """
    if settings.type == "local":
        return LocalTier(settings, read_only=read_only, evict=evict, rank=rank).open(background=background)
    if settings.type == "nfs":
        from .nfs import NfsTier

        return NfsTier(settings, read_only=read_only, evict=evict, rank=rank).open(background=background)
    if settings.type == "s3":
        from .s3 import S3Tier

        return S3Tier(settings, io_workers=io_workers or DEFAULT_IO_WORKERS, deadline_s=deadline_s,
                      read_only=read_only, evict=evict, rank=rank).open(background=background)
    raise ValueError(f"unknown tier type {settings.type!r}")


__all__ = ["open_tier"]
