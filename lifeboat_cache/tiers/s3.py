"""`type: s3`: AWS S3, NetApp ONTAP S3 or any S3-compatible store, through boto3.

Layout: one object per write batch under `<prefix>o/`, named
`<ms>-<host>-<pid>-<token><seq>-<count>.lbo` (names sort by age; host, pid and a per-process random
token make every writer's names its own, so nothing needs a lock). An object is laid out like a
sealed segment: self-describing records (64-byte header + payload), then the record table and a
checksummed footer. Because the record count is in the name, one ranged GET of exactly the trailer
indexes an object.

* Open: the index is rebuilt in the background from a paginated ListObjectsV2 plus one ranged GET
  per object, `io_workers` trailers at a time; each listing page is indexed as soon as its
  trailers are in, so pages are served while the listing goes on. `contains` answers from the
  in-memory index only, so `exists` never waits on the network. Later listings start
  `LISTING_LOOKBACK_S` before min(now, newest valid name); a full listing every `FULL_RELIST_S`
  notices objects other hosts evicted. A read of a vanished object is a stale miss, not an error.
* Names: only names this module writes count (`NAME_RE`). A name dated more than
  `MAX_FUTURE_SKEW_S` ahead of this host's clock is indexed but never moves the listing start
  (a host whose clock runs ahead, or another tool, cannot hide newer objects); a writer whose
  clock runs up to `LISTING_LOOKBACK_S` behind is still found by incremental listings, and any
  skew by the next full listing.
* An object whose trailer cannot be read or parsed is retried with backoff (`BAD_RETRY_S`,
  doubling) and given up after `BAD_MAX_TRIES` failures: a key listed before its body is readable
  is not lost for the life of the process.
* Reads are ranged GETs of one record; the store verifies it. Writes are one PUT per batch, then
  the index (write, then index). The store writes its own batches as one object when this is the
  first tier (`batch_writes`).
* Failures: every boto3/botocore/urllib3 exception becomes an OSError (the store's cooldown).
  Two clients: the data path's (reads, the store's PUTs) has its timeouts cut so that
  `max_attempts` tries fit in the engine deadline; the background one (listing, trailers,
  background copies, eviction) uses `connect_timeout_s` / `read_timeout_s` as configured.
* Credentials: the standard AWS chain (env, profile, web identity, instance role), or a named
  `profile` (role chains as boto3 resolves them), or keys read from the env vars named by
  `access_key_id_env` / `secret_access_key_env` (the file never holds a secret). Never logged;
  error messages are scrubbed of them.
* Operator options: `addressing_style`, `verify` / `ca_bundle`, `sse` (AES256 or aws:kms with
  `sse_kms_key_id`), `storage_class`, `retry_mode`, `max_concurrency`: per tier.
* Capacity: bytes of every object listed or written; over capacity, the oldest objects are deleted
  (DeleteObjects, up to 1000 per request; single DeleteObject calls where the server refuses
  DeleteObjects, as ONTAP before 9.11.1 does) by the background thread. No capacity = no eviction
  (use a bucket lifecycle rule).
* A record that fails verification is dropped from the index and marked by a tiny object under
  `<prefix>q/`, so a later rebuild (on any host) skips it.
"""

from __future__ import annotations

import errno
import itertools
import json
import logging
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from ..codec import raw_length
from ..config import DEFAULT_DEADLINE_S, DEFAULT_IO_WORKERS, TierSettings
from ..cooldown import LogOnce
from ..index import Index, Loc
from ..metrics import Counters
from .base import Describing, ObjectPurging, Probing, Ref, SingleIndexTier
from .segment import _writer_tag, build_trailer, parse_trailer, trailer_size

try:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError
except ImportError as e:  # pragma: no cover - exercised only without the [s3] extra
    raise ImportError("storage type 's3' needs boto3: pip install 'lifeboat-cache[s3]'") from e

log = logging.getLogger(__name__)

DATA_DIR = "o/"
QUARANTINE_DIR = "q/"
OBJECT_SUFFIX = ".lbo"
LIST_PAGE_KEYS = 1000  # ListObjectsV2 maximum
FIRST_LIST_PAGE_KEYS = 100  # a listing's first page is small: its pages are served sooner
DELETE_BATCH_KEYS = 1000  # DeleteObjects maximum
LISTING_LOOKBACK_S = 120.0  # upload time + clock skew: incremental listings start this far back
MAX_FUTURE_SKEW_S = 300.0  # a name dated further ahead than this never moves the listing start
FULL_RELIST_S = 600.0
BACKGROUND_CONNECTIONS = 8  # copier and index threads, on top of the io workers
FIRST_INDEX_CHUNK_OBJECTS = 16  # the first trailers of a listing page are indexed at once...
INDEX_CHUNK_OBJECTS = 256  # ...the rest in bigger chunks (one index merge each)
BAD_RETRY_S = 5.0  # an unreadable trailer is retried after 5, 10, 20, 40 s ...
BAD_MAX_TRIES = 6  # ...and given up after this many failures
STALE_CODES = frozenset({"NoSuchKey", "404", "InvalidRange", "416"})
# DeleteObjects refused (ONTAP S3 before 9.11.1 answers NotImplemented): delete one key at a time
NO_MULTI_DELETE_CODES = frozenset({"NotImplemented", "501", "MethodNotAllowed", "405"})
NAME_RE = re.compile(r"^(\d{13})-([^-/]+)-(\d{1,10})-([0-9a-f]{6})(\d{6,})-([1-9]\d{0,6})\.lbo$")
_TOKEN = os.urandom(3).hex()  # same host name and pid in two containers must not collide
_SEQ = itertools.count(1)  # shared by every tier in the process: names never repeat


class S3Error(OSError):
    """An S3 request failed; `code` is the S3 error code or HTTP status, or '' for transport errors."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(errno.EIO, message)
        self.code = code


@dataclass
class _Obj:
    id: int
    name: str  # relative to the data prefix
    size: int
    born: int  # listing generation when it was registered: a listing never drops a newer object
    records: int = 0
    stored_bytes: int = 0
    raw_bytes: int = 0


def _norm_prefix(prefix: str) -> str:
    prefix = prefix.lstrip("/")
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


def _parse_name(name: str) -> tuple[int, int] | None:
    """'<ms>-<host>-<pid>-<token><seq>-<count>.lbo' -> (ms, count); None for any other name."""
    m = NAME_RE.match(name)
    return (int(m.group(1)), int(m.group(6))) if m else None


def make_session(settings: TierSettings) -> Any:
    """A boto3 session: a named profile, keys from the env vars the settings name, or the default chain."""
    if settings.access_key_id_env:
        names = (settings.access_key_id_env, settings.secret_access_key_env)
        missing = [n for n in names if not os.environ.get(n or "")]
        if missing:
            raise ValueError(f"s3 tier {settings.bucket}: environment variable(s) {', '.join(map(str, missing))} "
                             f"(named by access_key_id_env / secret_access_key_env) are not set; export them")
        token = os.environ.get(settings.session_token_env) if settings.session_token_env else None
        return boto3.session.Session(aws_access_key_id=os.environ[settings.access_key_id_env],
                                     aws_secret_access_key=os.environ[settings.secret_access_key_env or ""],
                                     aws_session_token=token)
    if settings.profile:
        return boto3.session.Session(profile_name=settings.profile)
    return boto3.session.Session()


def data_path_timeouts(settings: TierSettings, deadline_s: float) -> tuple[float, float]:
    """(connect, read) timeouts of one data-path attempt: `max_attempts` of them fit in the deadline."""
    per_try = deadline_s / max(1, settings.max_attempts)
    return min(settings.connect_timeout_s, per_try), min(settings.read_timeout_s, per_try)


def make_client(settings: TierSettings, pool_connections: int, *, session: Any = None,
                timeouts: tuple[float, float] | None = None) -> tuple[Any, Any]:
    """A boto3 S3 client with bounded timeouts and retries and the tier's operator options.

    Checksums are computed only when an operation requires them: several S3-compatible stores
    (older ONTAP S3, MinIO) reject boto3's default CRC headers, and records carry their own CRCs.
    """
    style = settings.addressing_style or ("path" if settings.endpoint_url else None)
    connect_s, read_s = timeouts or (settings.connect_timeout_s, settings.read_timeout_s)
    cfg = Config(
        connect_timeout=connect_s,
        read_timeout=read_s,
        retries={"total_max_attempts": settings.max_attempts, "mode": settings.retry_mode},
        max_pool_connections=pool_connections,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        user_agent_extra="lifeboat-cache",
        s3={"addressing_style": style} if style else None,
    )
    session = session or make_session(settings)
    verify: bool | str = str(settings.ca_bundle) if settings.ca_bundle and settings.verify else settings.verify
    client = session.client("s3", endpoint_url=settings.endpoint_url, region_name=settings.region, config=cfg,
                            verify=verify)
    return session, client


class S3Tier(SingleIndexTier, Probing, Describing, ObjectPurging):
    kind = "s3"
    shared = True
    durable = True
    batch_writes = True  # the store hands its put() batches to write_many: one object per batch

    def __init__(self, settings: TierSettings, *, io_workers: int = DEFAULT_IO_WORKERS,
                 client: Any = None, name: str | None = None, deadline_s: float | None = None,
                 read_only: bool = False, evict: bool = True) -> None:
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
        self.list_page_keys = LIST_PAGE_KEYS
        self.index = Index()
        self.counters = Counters()
        self._lock = threading.RLock()
        self._gc_lock = threading.Lock()
        self._objs: dict[int, _Obj] = {}
        self._by_name: dict[str, int] = {}
        self._bad: dict[str, tuple[int, float]] = {}  # unreadable trailer: name -> (failures, retry at)
        self._quarantine: set[tuple[str, int]] = set()
        self._next_id = 1
        self._gen = 0
        self._usage = 0
        self._newest_ms = 0
        self._listed_ok = False
        self._last_full = 0.0
        self._list_failing = LogOnce(log)  # one line per outage, not one per refresh
        self._tag = _writer_tag()
        self._closed = threading.Event()
        self._wake = threading.Event()
        self._rebuilt = threading.Event()
        self._thread: threading.Thread | None = None
        self._session = None
        self._multi_delete = True
        self.deadline_s = deadline_s if deadline_s is not None else DEFAULT_DEADLINE_S
        conns = settings.max_concurrency or io_workers + BACKGROUND_CONNECTIONS
        self.fetch_workers = max(1, min(io_workers, conns))  # trailer fetches in flight while listing
        self._bg_client = client
        if client is None:
            self._session, client = make_client(settings, conns,
                                                timeouts=data_path_timeouts(settings, self.deadline_s))
            _, self._bg_client = make_client(settings, conns, session=self._session)
        self._client = client
        self._put_extra: dict[str, str] = {}
        if settings.sse:
            self._put_extra["ServerSideEncryption"] = settings.sse
        if settings.sse_kms_key_id:
            self._put_extra["SSEKMSKeyId"] = settings.sse_kms_key_id
        if settings.storage_class:
            self._put_extra["StorageClass"] = settings.storage_class
        self._secrets = self._credential_strings()

    # ------------------------------------------------------------------ open / background
    def open(self, background: bool = True) -> "S3Tier":
        """Start the index rebuild (a listing); with background=False, finish it first.

        Never raises for an unreachable server: the tier starts empty and keeps listing.
        """
        self._thread = threading.Thread(target=self._run, name="lifeboat-s3-index", daemon=True)
        if not background:
            self._refresh(full=True)
            self._rebuilt.set()
        self._thread.start()
        return self

    def wait_rebuilt(self, timeout: float | None = None) -> bool:
        return self._rebuilt.wait(timeout)

    def _run(self) -> None:
        if not self._rebuilt.is_set():
            t0 = time.perf_counter()
            self._refresh(full=True)
            self._rebuilt.set()
            log.info("lifeboat: %s index rebuilt: %d pages in %d objects in %.0f ms", self.name,
                     len(self.index), len(self._objs), (time.perf_counter() - t0) * 1e3)
        while not self._closed.is_set():
            self._wake.wait(self.refresh_interval_s)
            self._wake.clear()
            if self._closed.is_set():
                break
            full = not self._listed_ok or time.monotonic() - self._last_full >= FULL_RELIST_S
            self._refresh(full=full)
            self._retry_bad()
            if not self.evict:
                continue
            try:
                self.gc()
            except Exception:  # never let the index thread die
                log.exception("lifeboat: eviction on %s failed", self.name)

    def _refresh(self, full: bool) -> None:
        try:
            self._full_refresh() if full else self._incremental_refresh()
        except OSError as e:
            self.counters.add("list_errors")
            self._list_failing.log("list", "lifeboat: listing %s failed (%s); retrying every %.0f s", self.name, e,
                                   self.refresh_interval_s)
            return
        except Exception:
            log.exception("lifeboat: index refresh of %s failed", self.name)
            return
        if self._list_failing.reset("list"):
            log.info("lifeboat: listing %s works again", self.name)

    def _full_refresh(self) -> None:
        """List everything, indexing each listing page as it arrives (pages are served meanwhile);
        then drop what another host evicted."""
        with self._lock:
            self._gen += 1
            gen = self._gen
        for mark in self._list(self.quarantine_prefix):
            obj_name, _, off = mark.rpartition("@")
            if obj_name and off.isdigit():
                with self._lock:
                    self._quarantine.add((obj_name, int(off)))
        seen: set[str] = set()
        with ThreadPoolExecutor(self.fetch_workers, thread_name_prefix="lifeboat-s3-table") as ex:
            for page in self._list_pages(self.data_prefix):
                seen.update(page)
                self._index_new(page, ex)
                if self._closed.is_set():
                    return
        with self._lock:
            gone = [o for o in self._objs.values() if o.name not in seen and o.born < gen]
        for o in gone:  # evicted by another host
            self._drop(o)
        self._listed_ok = True
        self._last_full = time.monotonic()

    def listing_start_ms(self) -> int:
        """Where an incremental listing starts: LISTING_LOOKBACK_S before min(now, newest valid name)."""
        return max(0, min(int(time.time() * 1000), self._newest_ms) - int(LISTING_LOOKBACK_S * 1000))

    def _incremental_refresh(self) -> None:
        start = self.listing_start_ms()
        with ThreadPoolExecutor(self.fetch_workers, thread_name_prefix="lifeboat-s3-table") as ex:
            for page in self._list_pages(self.data_prefix, start_after=f"{start:013d}"):
                self._index_new(page, ex)

    def _note_names(self, names: Iterator[str] | dict[str, int]) -> None:
        """Advance the newest-name watermark from valid names not dated in the future."""
        horizon = int((time.time() + MAX_FUTURE_SKEW_S) * 1000)
        for n in names:
            parsed = _parse_name(n)
            if parsed and parsed[0] <= horizon and parsed[0] > self._newest_ms:
                self._newest_ms = parsed[0]

    def _index_new(self, listing: dict[str, int], ex: ThreadPoolExecutor) -> None:
        """Fetch the tables of listed objects not indexed yet, newest first, a chunk at a time.

        Newest first: a returning user's pages are the likeliest hits. The first chunk is small,
        so the first pages are servable within milliseconds of the listing page.
        """
        now = time.monotonic()
        with self._lock:
            new = [(n, s) for n, s in sorted(listing.items(), reverse=True)
                   if n not in self._by_name and self._bad.get(n, (0, 0.0))[1] <= now]
        self._note_names(listing)
        i, step = 0, FIRST_INDEX_CHUNK_OBJECTS
        while i < len(new):
            chunk = new[i: i + step]
            self._index_tables(chunk, list(ex.map(lambda ns: self._fetch_table(*ns), chunk)))
            i += step
            step = INDEX_CHUNK_OBJECTS
            if self._closed.is_set():
                return

    def _index_tables(self, objs: list[tuple[str, int]], tables: list[np.ndarray | None]) -> None:
        """Register objects and index their records with one bulk insert (one index merge)."""
        keys, units, offs, lens = [], [], [], []
        for (obj_name, size), table in zip(objs, tables):
            if table is None:
                continue
            with self._lock:
                if obj_name in self._by_name:  # written by us meanwhile: already indexed
                    continue
                obj = self._register(obj_name, size)
                obj.records, obj.stored_bytes = len(table), int(table["length"].sum())
                obj.raw_bytes = int(table["raw_length"].sum())
            if self._quarantine and len(table):
                keep = np.array([(obj_name, int(o)) not in self._quarantine for o in table["offset"]], dtype=bool)
                table = table[keep]
            keys.append(table["key"])
            units.append(np.full(len(table), obj.id, np.uint32))
            offs.append(table["offset"])
            lens.append(table["length"])
        if keys:  # oldest first: for a key stored twice, the last (newest) copy wins
            self.index.insert_arrays(np.concatenate(keys[::-1]), np.concatenate(units[::-1]),
                                     np.concatenate(offs[::-1]), np.concatenate(lens[::-1]), if_absent=True)
            self.counters.add("listed_records", sum(map(len, keys)))

    def _fetch_table(self, obj_name: str, size: int) -> np.ndarray | None:
        """The record table of one object (one ranged GET), or None if it has no valid trailer."""
        parsed = _parse_name(obj_name)
        if parsed is None:  # not one of ours (another tool, a stray upload): never fetched
            with self._lock:
                if obj_name not in self._bad:
                    self._bad[obj_name] = (BAD_MAX_TRIES, float("inf"))
                    self.counters.add("objects_foreign")
            return None
        tsize = trailer_size(parsed[1])
        table = None
        why = "shorter than its record table"
        if size >= tsize:
            try:
                table = parse_trailer(self._get_range(obj_name, size - tsize, size - 1, background=True), size)
                why = "no valid record table"
            except S3Error as e:
                if e.code in STALE_CODES:
                    return None  # deleted since the listing
                why = f"trailer read failed ({e})"
        if table is None:
            self._mark_bad(obj_name, why)
        else:
            with self._lock:
                self._bad.pop(obj_name, None)
        return table

    def _retry_bad(self) -> None:
        """Fetch again the trailers of unreadable objects whose backoff is over, even when they
        fall before the incremental listing's window (HEAD gives the current size)."""
        now = time.monotonic()
        with self._lock:
            due = [n for n, (tries, at) in self._bad.items() if at <= now and n not in self._by_name][:64]
        for obj_name in due:
            try:
                size = int(self._call("head_object", background=True, Bucket=self.bucket,
                                      Key=self.data_prefix + obj_name)["ContentLength"])
            except S3Error as e:
                if e.code in STALE_CODES:
                    with self._lock:
                        self._bad.pop(obj_name, None)  # gone: nothing to retry
                    continue
                return  # the server is failing: try again next round
            self._index_tables([(obj_name, size)], [self._fetch_table(obj_name, size)])

    def _mark_bad(self, obj_name: str, why: str) -> None:
        """Retry an unreadable object later (backoff); give up after BAD_MAX_TRIES failures.

        A key can be listed before its body is readable (uploads in flight on some servers), and a
        read can fail on a transient error: one failure must not hide the object for good.
        """
        with self._lock:
            tries = self._bad.get(obj_name, (0, 0.0))[0] + 1
            final = tries >= BAD_MAX_TRIES
            retry_at = float("inf") if final else time.monotonic() + BAD_RETRY_S * 2 ** (tries - 1)
            self._bad[obj_name] = (tries, retry_at)
        self.counters.add("objects_invalid" if final else "objects_retry")
        if final:
            log.warning("lifeboat: %s: object %s: %s after %d tries; ignoring it", self.name, obj_name, why, tries)
        elif tries == 1:
            log.info("lifeboat: %s: object %s: %s; retrying later", self.name, obj_name, why)

    def _register(self, obj_name: str, size: int) -> _Obj:
        """Add an object to the unit table (under the lock); ids only grow."""
        uid = self._by_name.get(obj_name)
        if uid is not None:
            return self._objs[uid]
        obj = _Obj(self._next_id, obj_name, size, self._gen)
        self._next_id += 1
        self._objs[obj.id] = obj
        self._by_name[obj_name] = obj.id
        self._usage += size
        return obj

    def _drop(self, obj: _Obj) -> None:
        with self._lock:
            if self._objs.pop(obj.id, None) is None:
                return
            self._by_name.pop(obj.name, None)
            self._usage -= obj.size
        self.index.drop_unit(obj.id)

    # ------------------------------------------------------------------ S3 requests
    def _credential_strings(self) -> list[str]:
        """The resolved credential strings, only to scrub them from error messages."""
        try:
            creds = self._session.get_credentials() if self._session is not None else None
            frozen = creds.get_frozen_credentials() if creds is not None else None
        except Exception:
            return []
        if frozen is None:
            return []
        return [s for s in (frozen.access_key, frozen.secret_key, frozen.token) if s and len(s) >= 4]

    def _scrub(self, text: str) -> str:
        for s in self._secrets:
            text = text.replace(s, "***")
        return text

    def _call(self, op: str, background: bool = False, **kw: Any) -> Any:
        self.counters.add(f"{op}_requests")
        try:
            return getattr(self._bg_client if background else self._client, op)(**kw)
        except ClientError as e:
            err = e.response.get("Error", {})
            code = str(err.get("Code") or e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            raise S3Error(code, self._scrub(f"s3 {op}: {code} {err.get('Message', '')}".strip())) from None
        except Exception as e:  # transport: timeouts, refused connections, closed streams
            raise S3Error("", self._scrub(f"s3 {op}: {type(e).__name__}: {e}")) from None

    def _list(self, prefix: str, start_after: str | None = None) -> dict[str, int]:
        """name (relative to prefix) -> size, for every object under prefix (paginated)."""
        out: dict[str, int] = {}
        for page in self._list_pages(prefix, start_after):
            out.update(page)
        return out

    def _list_pages(self, prefix: str, start_after: str | None = None) -> Iterator[dict[str, int]]:
        """One dict (name relative to prefix -> size) per ListObjectsV2 page."""
        kw: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix,
                              "MaxKeys": min(FIRST_LIST_PAGE_KEYS, self.list_page_keys)}
        if start_after:
            kw["StartAfter"] = prefix + start_after
        while True:
            resp = self._call("list_objects_v2", background=True, **kw)
            yield {o["Key"][len(prefix):]: int(o["Size"]) for o in resp.get("Contents", ())}
            if not resp.get("IsTruncated") or not resp.get("NextContinuationToken"):
                return
            kw["ContinuationToken"] = resp["NextContinuationToken"]
            kw["MaxKeys"] = self.list_page_keys

    def _get_range(self, obj_name: str, first: int, last: int, background: bool = False) -> bytes:
        key = self.data_prefix + obj_name
        client = self._bg_client if background else self._client
        try:
            resp = client.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={first}-{last}")
            data = resp["Body"].read()
        except ClientError as e:
            err = e.response.get("Error", {})
            code = str(err.get("Code") or e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            raise S3Error(code, self._scrub(f"s3 get {obj_name}: {code} {err.get('Message', '')}")) from None
        except Exception as e:
            raise S3Error("", self._scrub(f"s3 get {obj_name}: {type(e).__name__}: {e}")) from None
        finally:
            self.counters.add("get_object_requests")
        self.counters.add("bytes_read", len(data))
        return data

    # ------------------------------------------------------------------ Tier API
    def write_many(self, records: Sequence[tuple[int, bytes, Sequence[object], int]],
                   affinity: int = 0, background: bool = False) -> list[Ref]:
        """Store the records as one object (one PUT), then index them.

        `background` (the copier): use the client with the configured timeouts, not the data
        path's deadline-sized ones (a large batch may take longer than SGLang may wait).
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
        obj_name = self.object_name(int(time.time() * 1000), len(records))
        self._call("put_object", background=background, Bucket=self.bucket, Key=self.data_prefix + obj_name,
                   Body=body, **self._put_extra)
        self.counters.add("bytes_written", len(body))
        with self._lock:
            obj = self._register(obj_name, len(body))
            obj.records, obj.stored_bytes, obj.raw_bytes = len(entries), end, sum(e[3] for e in entries)
            over = self.settings.capacity_bytes is not None and self._usage > self.settings.capacity_bytes
        refs = []
        for (ikey, _, _, _), (_, off, length, _) in zip(records, entries):
            loc = Loc(obj.id, off, length)
            self.index.insert(ikey, loc)
            refs.append(Ref(0, loc))
        if over:
            self._wake.set()  # evict in the background, never on the write path
        return refs

    def read_into(self, ref: Ref, bufs: Sequence[memoryview]) -> bool:
        with self._lock:
            obj = self._objs.get(ref.loc.unit)
        if obj is None:
            return False
        try:
            data = self._get_range(obj.name, ref.loc.offset, ref.loc.offset + ref.loc.length - 1)
        except S3Error as e:
            if e.code not in STALE_CODES:
                raise
            self.counters.add("stale_reads")
            self._drop(obj)  # deleted by another host's eviction (or a server that lost its data)
            return False
        if len(data) != ref.loc.length:
            return False
        src = memoryview(data)
        pos = 0
        for b in bufs:
            b = b.cast("B") if b.format != "B" else b
            b[:] = src[pos: pos + b.nbytes]
            pos += b.nbytes
        return True

    def forget(self, ikey: int, ref: Ref, reason: str) -> None:
        self.index.remove_if_match(ikey, ref.loc)
        with self._lock:
            obj = self._objs.get(ref.loc.unit)
        if obj is None:
            return
        with self._lock:
            self._quarantine.add((obj.name, ref.loc.offset))
        if self.read_only:
            return  # remembered in this process only: a read-only open writes nothing
        mark = json.dumps({"length": ref.loc.length, "reason": reason, "time": time.time()}).encode()
        try:
            self._call("put_object", background=True, Body=mark, **self._put_extra,
                       Bucket=self.bucket, Key=f"{self.quarantine_prefix}{obj.name}@{ref.loc.offset}")
        except OSError as e:
            log.warning("lifeboat: cannot record quarantine on %s: %s", self.name, e)

    def probe(self) -> None:
        """One small data-path request (a 1-key listing); raises OSError while the server fails or hangs.
        The store calls it from its probe thread while the tier is held after a missed deadline."""
        self._call("list_objects_v2", Bucket=self.bucket, Prefix=self.data_prefix, MaxKeys=1)

    def records(self) -> Iterator[tuple[int, Ref]]:
        for k, loc in self.index.items():
            yield k, Ref(0, loc)

    def object_name(self, ms: int, count: int) -> str:
        """A new object's name: creation time (ms), writer, a never-repeating sequence, record count."""
        return f"{ms:013d}-{self._tag}-{_TOKEN}{next(_SEQ):06d}-{count}{OBJECT_SUFFIX}"

    parse_object_name = staticmethod(_parse_name)

    def purge_objects(self, lines: list[dict[str, object]]) -> dict[str, Any]:
        from . import s3_purge

        return s3_purge.purge_objects(self, lines)

    def loc_name(self, ref: Ref) -> str:
        with self._lock:
            obj = self._objs.get(ref.loc.unit)
        return f"{obj.name if obj else '?'}@{ref.loc.offset}"

    # ------------------------------------------------------------------ capacity
    def usage_bytes(self) -> int:
        with self._lock:
            return self._usage

    def capacity_bytes(self) -> int | None:
        return self.settings.capacity_bytes

    def gc(self) -> int:
        """Delete whole oldest objects until usage <= capacity. Returns bytes freed."""
        cap = self.settings.capacity_bytes
        if cap is None or self.read_only or not self._gc_lock.acquire(blocking=False):
            return 0
        try:
            with self._lock:
                excess = self._usage - cap
                victims: list[_Obj] = []
                for o in sorted(self._objs.values(), key=lambda o: o.name):
                    if excess <= 0:
                        break
                    victims.append(o)
                    excess -= o.size
            freed = 0
            for i in range(0, len(victims), DELETE_BATCH_KEYS):
                batch = victims[i: i + DELETE_BATCH_KEYS]
                keys = [self.data_prefix + o.name for o in batch]
                failed = self._delete(keys)
                for o, k in zip(batch, keys):
                    if k not in failed:
                        self._drop(o)
                        freed += o.size
                        self.counters.add("evicted_objects")
                        self.counters.add("evicted_bytes", o.size)
            self._forget_marks({o.name for o in victims})
            return freed
        except OSError as e:
            log.warning("lifeboat: eviction on %s failed: %s", self.name, e)
            return 0
        finally:
            self._gc_lock.release()

    def _delete(self, keys: list[str]) -> set[str]:
        """Delete keys (DeleteObjects, or one DeleteObject each where refused); returns keys not deleted."""
        if self._multi_delete:
            try:
                resp = self._call("delete_objects", background=True, Bucket=self.bucket,
                                  Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True})
                return {e.get("Key") for e in resp.get("Errors", ())}
            except S3Error as e:
                if e.code not in NO_MULTI_DELETE_CODES:
                    raise
                self._multi_delete = False
                log.warning("lifeboat: %s refuses DeleteObjects (%s); deleting one object per request", self.name,
                            e.code)
        failed: set[str] = set()
        for k in keys:
            try:
                self._call("delete_object", background=True, Bucket=self.bucket, Key=k)
            except S3Error as e:
                if e.code not in STALE_CODES:
                    failed.add(k)
        return failed

    def _forget_marks(self, gone: set[str]) -> None:
        """Delete the quarantine marks of evicted objects (best effort: they are only hints)."""
        with self._lock:
            marks = [(n, off) for n, off in self._quarantine if n in gone]
            self._quarantine.difference_update(marks)
        if not marks:
            return
        try:
            self._delete([f"{self.quarantine_prefix}{n}@{off}" for n, off in marks[:DELETE_BATCH_KEYS]])
        except OSError:
            pass

    # ------------------------------------------------------------------ housekeeping
    def describe(self) -> list[dict[str, int | str | bool]]:
        """Per object: records, stored and raw bytes (for `lifeboat stats`), oldest first."""
        with self._lock:
            objs = sorted(self._objs.values(), key=lambda o: o.name)
        return [{"segment": o.name, "bytes": o.size, "sealed": True, "records": o.records,
                 "stored_bytes": o.stored_bytes, "raw_bytes": o.raw_bytes} for o in objs]

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        with self._lock:
            out.update(objects=len(self._objs), invalid_objects=sum(t >= BAD_MAX_TRIES for t, _ in self._bad.values()),
                       retrying_objects=sum(t < BAD_MAX_TRIES for t, _ in self._bad.values()))
        out.update(pages=len(self.index), rebuilt=self._rebuilt.is_set(), listed_ok=self._listed_ok)
        out.update(self.counters.snapshot())
        return out

    def close(self) -> None:
        self._closed.set()
        self._wake.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=10)
        for client in {id(self._client): self._client, id(self._bg_client): self._bg_client}.values():
            close = getattr(client, "close", None)
            if close is not None:
                close()
