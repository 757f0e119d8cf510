"""`type: nfs`: a segment directory on a shared file system (NFS, NetApp ONTAP NFS exports).

Same segment layout as `local`; several hosts write into one directory, one writer per segment file
(host and pid in its name), and nothing relies on cross-host locks. Differences from `local`: a
segment is sealed (and fdatasync'ed) after `seal_after_s` so that other hosts can pick it up by
listing (close-to-open consistency: a reader opens a segment after its writer sealed and closed it).
"""

from __future__ import annotations

from .local import LocalTier


class SharedFsTier(LocalTier):
    kind = "nfs"
    shared = True
    fsync = True
