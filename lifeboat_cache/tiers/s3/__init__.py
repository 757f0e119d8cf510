"""`type: s3`: segment objects in a bucket (AWS S3, NetApp ONTAP S3, any S3-compatible store).

  tier.py      S3Tier: the coordinator (Tier API, batches, gc, stats, the refresh thread)
  client.py    S3Client: boto3 requests behind call / list / get_range / put / delete (retries, timeouts)
  objects.py   ObjectTable: the bucket's objects this process knows (its lock's only owner), names
  listing.py   Lister: index rebuild and refresh from listings, one ranged GET per new trailer
  purge.py     purge: delete objects holding only purged records, rewrite mixed ones
  keeping.py   S3Keeping: retention's read counts and capacity gc over objects, state shared under r/
"""

from __future__ import annotations

from .tier import S3Tier

__all__ = [
    "S3Tier",
]
