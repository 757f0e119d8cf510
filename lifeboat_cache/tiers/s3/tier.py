"""`type: s3`: AWS S3, NetApp ONTAP S3 or any S3-compatible store, through boto3.

Layout: one object per write batch under `<prefix>o/` (names: objects.py). An object is laid out
like a sealed segment: self-describing records (64-byte header + payload), then the record table
and a checksummed footer, so one ranged GET of exactly the trailer indexes an object.

`S3Tier` is the coordinator over three parts, each with a public surface:

  client.py    the requests (two boto3 clients, errors as S3Error, credentials, operator options)
  objects.py   the object table (objects by id and name, usage, unreadable and quarantined hints)
  listing.py   the index rebuild and refresh (listings, trailer fetches, retries of bad objects)
  keeping.py   retention: read counts, capacity gc (evict, keep or reinsert), the shared state under r/

and `lifeboat purge` runs in purge.py over the table and the client.

* Open: the index is rebuilt in the background (listing.py); `contains` answers from the
  in-memory index only, so `exists` never waits on the network. A read of a vanished object is a
  stale miss, not an error.
* Reads are ranged GETs of one record; the store verifies it. Writes are one PUT per batch, then
  the index (write, then index). The store writes its own batches as one object when this is the
  first tier (`batch_writes`).
* Capacity: the pages' bytes of every object listed or written (its size less the records' headers and
  the trailer, from the record count in its name); over capacity, the object at the head of the
  retention queue is deleted, kept, or its read records copied to a new object first (keeping.py;
  DeleteObjects, up to 1000 per request, or one DeleteObject each where refused), by the background
  thread. No capacity = no eviction (use a bucket lifecycle rule).
* A record that fails verification is dropped from the index and marked by a tiny object under
  `<prefix>q/`, so a later rebuild (on any host) skips it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Iterator, Sequence

import numpy as np

from ...config import DEFAULT_DEADLINE_S, DEFAULT_IO_WORKERS, TierSettings
from ...index import Index, Loc
from ...metrics import Counters
from ...records import build_trailer, raw_length, writer_tag
from ..base import Describing, Marking, ObjectPurging, Probing, Rank, Ref, SingleIndexTier
from .client import DELETE_BATCH_KEYS, STALE_CODES, S3Client, S3Error
from .keeping import COUNTERS as RETENTION_COUNTERS, S3Keeping
from .listing import Lister
from .objects import ObjectTable, parse_name

log = logging.getLogger(__name__)

DATA_DIR = "o/"
QUARANTINE_DIR = "q/"
MARKS_DIR = "m/"  # small objects about the store itself (a sealed store's seal mark)
BACKGROUND_CONNECTIONS = 8  # copier and index threads, on top of the io workers


def _norm_prefix(prefix: str) -> str:
    prefix = prefix.lstrip("/")
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


class S3Tier(SingleIndexTier, Probing, Describing, ObjectPurging, Marking):
    """The tier: `client` (S3Client) does the requests, `objects` (ObjectTable) knows the objects,
    the background thread keeps them in step with the bucket (listing.py) and evicts (gc)."""

    kind = "s3"
    shared = True
    durable = True
    batch_writes = True  # the store hands its put() batches to write_many: one object per batch

    def __init__(self, settings: TierSettings, *, io_workers: int = DEFAULT_IO_WORKERS,
                 client: Any = None, name: str | None = None, deadline_s: float | None = None,
                 read_only: bool = False, evict: bool = True, rank: Rank | None = None) -> None:
        if not settings.bucket:
            raise ValueError("an s3 tier needs a bucket")
        self.settings = settings
        # read_only (`lifeboat stats` / `verify`): no object is written or deleted; evict=False: the
        # background thread never evicts (only an explicit gc() does)
        self.read_only, self.evict = read_only, evict and not read_only
        self.bucket = settings.bucket
        self.prefix = _norm_prefix(settings.prefix)
        self.data_prefix = self.prefix + DATA_DIR
        self.quarantine_prefix = self.prefix + QUARANTINE_DIR
        self.name = name or f"s3://{self.bucket}/{self.prefix}"
        self.refresh_interval_s = settings.refresh_interval_s
        self.index = Index()
        self.counters = Counters()
        self.objects = ObjectTable(self.index, writer_tag())
        self._gc_lock = threading.Lock()
        self._closed = threading.Event()
        self._wake = threading.Event()
        self._rebuilt = threading.Event()
        self._thread: threading.Thread | None = None
        self.deadline_s = deadline_s if deadline_s is not None else DEFAULT_DEADLINE_S
        conns = settings.max_concurrency or io_workers + BACKGROUND_CONNECTIONS
        self.fetch_workers = max(1, min(io_workers, conns))  # trailer fetches in flight while listing
        self.client = S3Client.connect(settings, conns, self.deadline_s, self.counters, name=self.name,
                                       client=client)
        self.lister = Lister(self.client, self.objects, self.counters, name=self.name,
                             data_prefix=self.data_prefix, quarantine_prefix=self.quarantine_prefix,
                             fetch_workers=self.fetch_workers, refresh_interval_s=self.refresh_interval_s,
                             closed=self._closed, rank=rank)
        self.counters.declare(*RETENTION_COUNTERS)
        self.keeping = S3Keeping(self)  # read counts and capacity gc (retention/)

    @property
    def list_page_keys(self) -> int:
        """Keys per listing page after the first (ListObjectsV2's maximum; tests make it small)."""
        return self.client.list_page_keys

    @list_page_keys.setter
    def list_page_keys(self, n: int) -> None:
        self.client.list_page_keys = n

    # ------------------------------------------------------------------ open / background
    def open(self, background: bool = True) -> "S3Tier":
        """Start the index rebuild (a listing); with background=False, finish it first.

        Never raises for an unreachable server: the tier starts empty and keeps listing.
        """
        self._thread = threading.Thread(target=self._run, name="lifeboat-s3-index", daemon=True)
        if not background:
            self.lister.refresh(full=True)
            self._rebuilt.set()
            self.keeping.sync(force=True)  # what was read before (and elsewhere) counts from the start
        self._thread.start()
        return self

    def wait_rebuilt(self, timeout: float | None = None) -> bool:
        return self._rebuilt.wait(timeout)

    def _run(self) -> None:
        if not self._rebuilt.is_set():
            t0 = time.perf_counter()
            self.lister.refresh(full=True)
            self._rebuilt.set()
            self.keeping.sync(force=True)
            log.info("lifeboat: %s index rebuilt: %d pages in %d objects in %.0f ms", self.name,
                     len(self.index), len(self.objects), (time.perf_counter() - t0) * 1e3)
        while not self._closed.is_set():
            self._wake.wait(self.refresh_interval_s)
            self._wake.clear()
            if self._closed.is_set():
                break
            self.lister.refresh(full=self.lister.full_due())
            self.lister.retry_bad()
            self.keeping.sync()
            if not self.evict:
                continue
            try:
                self.gc()
            except Exception:  # never let the index thread die
                log.exception("lifeboat: eviction on %s failed", self.name)

    def listing_start_ms(self) -> int:
        """Where an incremental listing starts (listing.py)."""
        return self.lister.listing_start_ms()

    # ------------------------------------------------------------------ Tier API
    def write_many(self, records: Sequence[tuple[int, bytes, Sequence[object], int]],
                   affinity: int = 0, background: bool = False, born_ms: int | None = None) -> list[Ref]:
        """Store the records as one object (one PUT), then index them.

        `background` (the copier): use the client with the configured timeouts, not the data
        path's deadline-sized ones (a large batch may take longer than SGLang may wait). `born_ms`:
        records kept by retention, first written then (the object is named with that time).
        """
        if not records:
            return []
        parts: list[object] = []
        entries: list[tuple[bytes, int, int, int]] = []
        end = 0
        for _, digest, bufs, length in records:
            entries.append((digest, end, length, raw_length(bufs[0])))
            parts.extend(bufs)
            end += length
        body = b"".join([*parts, build_trailer(end, entries)])  # type: ignore[list-item]
        obj_name = self.object_name(int(time.time() * 1000) if born_ms is None else born_ms, len(records))
        self.client.put(self.data_prefix + obj_name, body, background=background)
        self.counters.add("bytes_written", len(body))
        obj = self.objects.register(obj_name, len(body), records=len(entries), stored_bytes=end,
                                    raw_bytes=sum(e[3] for e in entries))
        if born_ms is None:
            self.keeping.budget.wrote(end)
        over = self.settings.capacity_bytes is not None and self.objects.usage > self.settings.capacity_bytes
        refs = []
        for (ikey, _, _, _), (_, off, length, _) in zip(records, entries):
            loc = Loc(obj.id, off, length)
            self.index.insert(ikey, loc)
            refs.append(Ref(0, loc))
        if over:
            self._wake.set()  # evict in the background, never on the write path
        return refs

    def read_into(self, ref: Ref, bufs: Sequence[memoryview]) -> bool:
        obj = self.objects.get(ref.loc.unit)
        if obj is None:
            return False
        try:
            data = self.client.get_range(self.data_prefix + obj.name, ref.loc.offset,
                                         ref.loc.offset + ref.loc.length - 1, label=obj.name)
        except S3Error as e:
            if e.code not in STALE_CODES:
                raise
            self.counters.add("stale_reads")
            self.objects.drop(obj)  # deleted by another host's eviction (or a server that lost its data)
            return False
        if len(data) != ref.loc.length:
            return False
        self.keeping.hit(obj, ref.loc.offset)
        src = memoryview(data)
        pos = 0
        for b in bufs:
            b = b.cast("B") if b.format != "B" else b
            b[:] = src[pos: pos + b.nbytes]
            pos += b.nbytes
        return True

    def touch(self, ikeys: np.ndarray) -> None:
        self.keeping.touch(ikeys)

    def forget(self, ikey: int, ref: Ref, reason: str) -> None:
        self.index.remove_if_match(ikey, ref.loc)
        obj = self.objects.get(ref.loc.unit)
        if obj is None:
            return
        self.objects.quarantine(obj.name, ref.loc.offset)
        if self.read_only:
            return  # remembered in this process only: a read-only open writes nothing
        mark = json.dumps({"length": ref.loc.length, "reason": reason, "time": time.time()}).encode()
        try:
            self.client.put(f"{self.quarantine_prefix}{obj.name}@{ref.loc.offset}", mark, background=True)
        except OSError as e:
            log.warning("lifeboat: cannot record quarantine on %s: %s", self.name, e)

    def read_marks(self, prefix: str, limit_bytes: int) -> dict[str, bytes]:
        """Objects `<prefix>m/<prefix>*`, each read with one ranged GET of at most limit_bytes. On the data
        path's client (timeouts sized to engine.deadline_s): the store's open waits on this, and must
        not wait out the configured timeouts of a server that does not answer."""
        where = self.prefix + MARKS_DIR
        resp = self.client.call("list_objects_v2", Bucket=self.bucket, Prefix=where + prefix, MaxKeys=1000)
        listed = {o["Key"][len(where):]: int(o["Size"]) for o in resp.get("Contents", ())}
        return {n: self.client.get_range(where + n, 0, min(size, limit_bytes) - 1) if size and limit_bytes else b""
                for n, size in listed.items()}

    def write_mark(self, name: str, data: bytes) -> None:
        """One PutObject (atomic on S3)."""
        self.client.put(self.prefix + MARKS_DIR + name, data)

    def probe(self) -> None:
        """One small data-path request (a 1-key listing); raises OSError while the server fails or hangs.
        The store calls it from its probe thread while the tier is held after a missed deadline."""
        self.client.call("list_objects_v2", Bucket=self.bucket, Prefix=self.data_prefix, MaxKeys=1)

    def records(self) -> Iterator[tuple[int, Ref]]:
        for k, loc in self.index.items():
            yield k, Ref(0, loc)

    def object_name(self, ms: int, count: int) -> str:
        """A new object's name: creation time (ms), writer, a never-repeating sequence, record count."""
        return self.objects.new_name(ms, count)

    parse_object_name = staticmethod(parse_name)

    def purge_objects(self, lines: list[dict[str, object]]) -> dict[str, Any]:
        from . import purge  # on demand: only `lifeboat purge` needs it (and compaction's format)

        return purge.purge_objects(self.client, self.objects, self.data_prefix, lines, name=self.name)

    def loc_name(self, ref: Ref) -> str:
        obj = self.objects.get(ref.loc.unit)
        return f"{obj.name if obj else '?'}@{ref.loc.offset}"

    # ------------------------------------------------------------------ capacity
    def usage_bytes(self) -> int:
        return self.objects.usage

    def capacity_bytes(self) -> int | None:
        return self.settings.capacity_bytes

    def gc(self) -> int:
        """Free objects as retention decides (keeping.py) until usage <= capacity. Returns bytes freed."""
        cap = self.settings.capacity_bytes
        if cap is None or self.read_only or not self._gc_lock.acquire(blocking=False):
            return 0
        try:
            return self.keeping.gc(cap)
        except OSError as e:
            log.warning("lifeboat: eviction on %s failed: %s", self.name, e)
            return 0
        finally:
            self._gc_lock.release()

    def forget_marks(self, gone: set[str]) -> None:
        """Delete the quarantine marks of evicted objects (best effort: they are only hints)."""
        marks = self.objects.take_marks(gone)
        if not marks:
            return
        try:
            self.client.delete([f"{self.quarantine_prefix}{n}@{off}" for n, off in marks[:DELETE_BATCH_KEYS]])
        except OSError:
            pass

    # ------------------------------------------------------------------ housekeeping
    def describe(self) -> list[dict[str, int | str | bool]]:
        """Per object: records, stored and raw bytes (for `lifeboat stats`), oldest first."""
        objs = self.objects.oldest_first()
        return [{"segment": o.name, "bytes": o.size, "sealed": True, "records": o.records,
                 "stored_bytes": o.stored_bytes, "raw_bytes": o.raw_bytes} for o in objs]

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        invalid, retrying = self.objects.bad_counts()
        out.update(objects=len(self.objects), invalid_objects=invalid, retrying_objects=retrying)
        out.update(pages=len(self.index), rebuilt=self._rebuilt.is_set(), listed_ok=self.lister.listed_ok)
        out.update(self.counters.snapshot())
        out["retention_read_records"] = self.keeping.access.read_records()
        return out

    def close(self) -> None:
        if not self.read_only and self._rebuilt.is_set() and self.lister.listed_ok:
            self.keeping.sync(force=True)  # only while the server answers: a close never waits on a hung one
        self._closed.set()
        self._wake.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=10)
        self.client.close()
