"""The tier conformance suite (lifeboat_cache.testing.tiers.TierTests) on memory, local and nfs tiers.

`nfs` runs on a local tmp dir standing in for the mount: CI has no NFS server, so this checks the
shared-directory protocol (one writer per segment, seal-to-publish, torn tails), not NFS itself.
The S3 tier runs the same suite against moto in tests/integration/test_s3_tier.py.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from support.chunks import flip_byte

from lifeboat_cache.config import TierSettings
from lifeboat_cache.testing.memory import MemoryTier
from lifeboat_cache.testing.tiers import Rec, TierTests
from lifeboat_cache.tiers.base import Ref, Tier
from lifeboat_cache.tiers.local import LocalTier
from lifeboat_cache.tiers.nfs import NfsTier

SEGMENT_BYTES = 256 << 10


class SegmentRaw:
    """Raw helpers for segment tiers: read and damage the files directly."""

    def _path(self, tier: Tier, ref: Ref) -> Path:
        d = tier.dirs[ref.part]  # type: ignore[attr-defined]
        return d.path / d.unit_name(ref.loc.unit)

    def raw_bytes(self, tier: Tier, ref: Ref) -> bytes:
        with open(self._path(tier, ref), "rb") as f:
            f.seek(ref.loc.offset)
            return f.read(ref.length)

    def raw_corrupt(self, tier: Tier, ref: Ref, at: int) -> None:
        flip_byte(self._path(tier, ref), ref.loc.offset + at)

    def raw_truncate(self, tier: Tier, ref: Ref) -> None:
        os.truncate(self._path(tier, ref), ref.loc.offset + ref.length // 2)

    def raw_add_torn_unit(self, tier: Tier, where: Any, recs: list[Rec]) -> None:
        # a segment of a writer on another host that died in the middle of its last record
        name = f"{int(time.time() * 1000):013d}-deadhost-4242-000001.seg"
        extra = recs[-1].blob
        body = b"".join(r.blob for r in recs) + extra[: len(extra) // 2]
        (Path(tier.dirs[0].path) / name).write_bytes(body)  # type: ignore[attr-defined]


class TestLocalTier(SegmentRaw, TierTests):
    def make_tier(self, where: Path, capacity_bytes: int | None = None) -> Tier:
        ts = TierSettings(type="local", paths=(where / "store",), capacity_bytes=capacity_bytes or (1 << 30),
                          segment_bytes=SEGMENT_BYTES)
        return LocalTier(ts).open(background=False)


class TestLocalTierTwoDrives(SegmentRaw, TierTests):
    def make_tier(self, where: Path, capacity_bytes: int | None = None) -> Tier:
        ts = TierSettings(type="local", paths=(where / "nvme0", where / "nvme1"),
                          capacity_bytes=capacity_bytes or (1 << 30), segment_bytes=SEGMENT_BYTES)
        return LocalTier(ts).open(background=False)


class TestNfsTier(SegmentRaw, TierTests):
    def make_tier(self, where: Path, capacity_bytes: int | None = None) -> Tier:
        ts = TierSettings(type="nfs", paths=(where / "shared",), capacity_bytes=capacity_bytes or (1 << 30),
                          segment_bytes=SEGMENT_BYTES, seal_after_s=0.5, refresh_interval_s=0.1)
        tier = NfsTier(ts)
        for d in tier.dirs:
            d.nfs.stale_unsealed_s = 0.0  # the dead writer's segment below is adopted at first sight
        return tier.open(background=False)


class TestMemoryTier(TierTests):
    forget_survives_reopen = False

    @pytest.fixture
    def where(self) -> dict[int, bytearray]:
        return {}

    def make_tier(self, where: dict[int, bytearray], capacity_bytes: int | None = None) -> Tier:
        return MemoryTier(where, capacity_bytes=capacity_bytes)

    def raw_bytes(self, tier: Tier, ref: Ref) -> bytes:
        return bytes(tier.units[ref.loc.unit][ref.loc.offset: ref.loc.offset + ref.length])  # type: ignore[attr-defined]

    def raw_corrupt(self, tier: Tier, ref: Ref, at: int) -> None:
        flip_byte(tier.units[ref.loc.unit], ref.loc.offset + at)  # type: ignore[attr-defined]

    def raw_truncate(self, tier: Tier, ref: Ref) -> None:
        del tier.units[ref.loc.unit][ref.loc.offset + ref.length // 2:]  # type: ignore[attr-defined]

    def raw_add_torn_unit(self, tier: Tier, where: dict[int, bytearray], recs: list[Rec]) -> None:
        extra = recs[-1].blob
        where[max(where, default=0) + 1] = bytearray(b"".join(r.blob for r in recs) + extra[: len(extra) // 2])
