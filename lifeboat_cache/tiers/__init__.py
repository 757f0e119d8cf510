"""Storage tiers: an indexed place to append and read whole records. `open_tier` builds one.

A tier owns its index and knows nothing of codecs; what it can do beyond the `Tier` core is declared
with capability mixins (base.py), never probed for.

  kinds.py     open_tier(settings): the tier of one `storage[]` entry (nfs and s3 imported on demand)
  base.py      Tier ABC, Ref, SingleIndexTier; capabilities: Probing, Auditing, Describing, SegmentDirs,
               RecordRuns, ObjectPurging, Marking; settle_twins (a key met twice by a rebuild)
  local.py     type: local (NVMe), one segment directory per path
  nfs.py       type: nfs (NFS, ONTAP NFS): a segment directory shared by hosts (why each rule exists)
  segments/    the log-structured segment directory (local and nfs)
  s3/          type: s3 (AWS, ONTAP S3, any S3): objects in a bucket
"""

from __future__ import annotations

from .base import (
    Auditing, Describing, Marking, ObjectPurging, Probing, Rank, RecordRuns, Ref, SegmentDirs, SingleIndexTier, Tier,
    settle_twins)
from .kinds import open_tier

__all__ = [
    "Auditing", "Describing", "Marking", "ObjectPurging", "Probing", "Rank", "RecordRuns", "Ref", "SegmentDirs",
    "SingleIndexTier", "Tier", "open_tier", "settle_twins",
]
