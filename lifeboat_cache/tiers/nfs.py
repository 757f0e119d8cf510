"""`type: nfs`: a segment directory on a shared file system (NFS, NetApp ONTAP NFS exports).

Same segment layout as `local`; several processes on several hosts write into one directory, one
writer per segment file (host and pid in its name), and nothing relies on cross-host locks.

What differs from `local`, and why:
* Close-to-open. NFS only promises that a reader sees what a writer wrote if the reader opens the
  file after the writer closed it. So another host's segment is indexed only once it is sealed
  (trailer written, fdatasync'ed, closed), and it is opened afresh after the seal is seen; an
  unsealed segment of another host is only probed (open, stat, read the footer, close), never
  walked. A writer seals after `seal_after_s` (default 2 s), so pages reach other hosts within
  about `seal_after_s + refresh_interval_s`; the writer itself sees them at once. Processes of the
  same host (same host name in the segment name) share one NFS client page cache: their open
  segments are walked as on `local`, prompted by the change counter (segments/changes.py) within ms.
* Commit order. Records are fdatasync'ed before the trailer is written, so a valid trailer can
  never be visible on the server ahead of the records it lists.
* Crashed or paused writers. A segment on this host whose writer pid is dead is sealed at open (as
  for `local`). A writer touches its open segments every `HEARTBEAT_S` (their mtime changes, even
  when idle); a foreign unsealed segment whose (size, mtime) has not changed for `ABANDON_AFTER_S`,
  timed on the reader's own monotonic clock, is abandoned: walked record by record (each
  CRC-checked, stopping at the torn tail) and served. Both are protocol constants, never settings,
  so hosts with different `seal_after_s` / `refresh_interval_s` or skewed clocks agree. An abandoned
  segment is still probed (only when the listing shows a new size or mtime): if it grows, gets a
  heartbeat or a trailer (a writer resumed after SIGSTOP, a long GC pause), it is live again and its
  new pages are indexed like any other. Capacity gc unlinks a foreign unsealed segment only after
  `EVICT_ABANDONED_S` without any change, so a live host's open segment is never evicted.
* Same-host processes. The change counter (segments/changes.py) tells the other processes of this host at
  once when a segment is sealed or created here, so they list without waiting for the refresh.
* Eviction races. Another host may evict (unlink) a segment this host has open; a read then fails
  with ESTALE, which is a stale location (a miss), not a tier failure.
"""

from __future__ import annotations

from .local import LocalTier
from .segments import NfsSegmentDir


class NfsTier(LocalTier):
    kind = "nfs"
    shared = True
    fsync = True
    segment_dir_cls = NfsSegmentDir
