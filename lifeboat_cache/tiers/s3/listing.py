"""The S3 tier's index rebuild and refresh: listings of the bucket, one ranged GET of each new trailer.

* The index is rebuilt in the background from a paginated ListObjectsV2 plus one ranged GET per
  object, `fetch_workers` trailers at a time; each listing page is indexed as soon as its trailers
  are in, so pages are served while the listing goes on. Later listings start
  `LISTING_LOOKBACK_S` before min(now, newest valid name); a full listing every `FULL_RELIST_S`
  notices objects other hosts evicted.
* A name dated more than `MAX_FUTURE_SKEW_S` ahead of this host's clock is indexed but never moves
  the listing start (a host whose clock runs ahead, or another tool, cannot hide newer objects); a
  writer whose clock runs up to `LISTING_LOOKBACK_S` behind is still found by incremental
  listings, and any skew by the next full listing.
* An object whose trailer cannot be read or parsed is retried with backoff and given up after a few
  failures (see objects.py): a key listed before its body is readable is not lost for good.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from ...cooldown import LogOnce
from ...index import Index
from ...metrics import Counters
from ...records import parse_trailer, trailer_size
from ..base import Rank, settle_twins
from .client import STALE_CODES, S3Client, S3Error
from .objects import ObjectTable, parse_name

log = logging.getLogger(__name__)

LISTING_LOOKBACK_S = 120.0  # upload time + clock skew: incremental listings start this far back
MAX_FUTURE_SKEW_S = 300.0  # a name dated further ahead than this never moves the listing start
FULL_RELIST_S = 600.0
FIRST_INDEX_CHUNK_OBJECTS = 16  # the first trailers of a listing page are indexed at once...
INDEX_CHUNK_OBJECTS = 256  # ...the rest in bigger chunks (one index merge each)


@dataclass(eq=False)
class Lister:
    """Keeps `objects` (and through it the tier's index) in step with the bucket's listing.
    `closed` is set when the tier closes: a listing in progress stops early."""

    client: S3Client
    objects: ObjectTable
    counters: Counters
    name: str
    data_prefix: str
    quarantine_prefix: str
    fetch_workers: int
    refresh_interval_s: float
    closed: threading.Event
    rank: Rank | None = None  # settles twins (base.settle_twins): the copy of a page that opens is indexed
    newest_ms: int = field(default=0, init=False)
    listed_ok: bool = field(default=False, init=False)
    last_full: float = field(default=0.0, init=False)
    _list_failing: LogOnce = field(default_factory=lambda: LogOnce(log), init=False)  # one line per outage

    @property
    def index(self) -> Index:
        return self.objects.index

    def full_due(self) -> bool:
        """The next refresh should be a full listing (none has worked yet, or FULL_RELIST_S passed)."""
        return not self.listed_ok or time.monotonic() - self.last_full >= FULL_RELIST_S

    def refresh(self, full: bool) -> None:
        """One listing; never raises (a failing server is logged once per outage)."""
        try:
            self.full_refresh() if full else self.incremental_refresh()
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

    def full_refresh(self) -> None:
        """List everything, indexing each listing page as it arrives (pages are served meanwhile);
        then drop what another host evicted."""
        gen = self.objects.new_generation()
        for mark in self.client.list(self.quarantine_prefix):
            obj_name, _, off = mark.rpartition("@")
            if obj_name and off.isdigit():
                self.objects.quarantine(obj_name, int(off))
        seen: set[str] = set()
        with ThreadPoolExecutor(self.fetch_workers, thread_name_prefix="lifeboat-s3-table") as ex:
            for page in self.client.list_pages(self.data_prefix):
                seen.update(page)
                self._index_new(page, ex)
                if self.closed.is_set():
                    return
        for o in self.objects.missing(seen, gen):  # evicted by another host
            self.objects.drop(o)
        self.listed_ok = True
        self.last_full = time.monotonic()

    def listing_start_ms(self) -> int:
        """Where an incremental listing starts: LISTING_LOOKBACK_S before min(now, newest valid name)."""
        return max(0, min(int(time.time() * 1000), self.newest_ms) - int(LISTING_LOOKBACK_S * 1000))

    def incremental_refresh(self) -> None:
        start = self.listing_start_ms()
        with ThreadPoolExecutor(self.fetch_workers, thread_name_prefix="lifeboat-s3-table") as ex:
            for page in self.client.list_pages(self.data_prefix, start_after=f"{start:013d}"):
                self._index_new(page, ex)

    def _note_names(self, names: Iterator[str] | dict[str, int]) -> None:
        """Advance the newest-name watermark from valid names not dated in the future."""
        horizon = int((time.time() + MAX_FUTURE_SKEW_S) * 1000)
        for n in names:
            parsed = parse_name(n)
            if parsed and parsed[0] <= horizon and parsed[0] > self.newest_ms:
                self.newest_ms = parsed[0]

    def _index_new(self, listing: dict[str, int], ex: ThreadPoolExecutor) -> None:
        """Fetch the tables of listed objects not indexed yet, newest first, a chunk at a time.

        Newest first: a returning user's pages are the likeliest hits. The first chunk is small,
        so the first pages are servable within milliseconds of the listing page.
        """
        new = self.objects.to_index(listing, time.monotonic())
        self._note_names(listing)
        i, step = 0, FIRST_INDEX_CHUNK_OBJECTS
        while i < len(new):
            chunk = new[i: i + step]
            self._index_tables(chunk, list(ex.map(lambda ns: self._fetch_table(*ns), chunk)))
            i += step
            step = INDEX_CHUNK_OBJECTS
            if self.closed.is_set():
                return

    def _index_tables(self, objs: list[tuple[str, int]], tables: list[np.ndarray | None]) -> None:
        """Register objects and index their records with one bulk insert (one index merge)."""
        keys, units, offs, lens = [], [], [], []
        for (obj_name, size), table in zip(objs, tables):
            if table is None:
                continue
            obj = self.objects.register_new(obj_name, size, records=len(table),
                                            stored_bytes=int(table["length"].sum()),
                                            raw_bytes=int(table["raw_length"].sum()))
            if obj is None:  # written by us meanwhile: already indexed
                continue
            if len(table) and (keep := self.objects.keep_mask(obj_name, table["offset"])) is not None:
                table = table[np.array(keep, dtype=bool)]
            keys.append(table["key"])
            units.append(np.full(len(table), obj.id, np.uint32))
            offs.append(table["offset"])
            lens.append(table["length"])
        if keys:  # oldest first: for a key stored twice, the last (newest) copy wins, unless it ranks lower
            cols = settle_twins(self.index, self.rank, self.read_record, np.concatenate(keys[::-1]),
                                np.concatenate(units[::-1]), np.concatenate(offs[::-1]), np.concatenate(lens[::-1]))
            self.index.insert_arrays(*cols, if_absent=True)
            self.counters.add("listed_records", sum(map(len, keys)))

    def read_record(self, unit_id: int, offset: int, length: int) -> bytes | None:
        """One record's bytes (a twin to rank: one ranged GET), or None when it cannot be read."""
        obj = self.objects.get(unit_id)
        if obj is None:
            return None
        try:
            return self.client.get_range(self.data_prefix + obj.name, offset, offset + length - 1, True)
        except S3Error:
            return None

    def _fetch_table(self, obj_name: str, size: int) -> np.ndarray | None:
        """The record table of one object (one ranged GET), or None if it has no valid trailer."""
        parsed = parse_name(obj_name)
        if parsed is None:  # not one of ours (another tool, a stray upload): never fetched
            if self.objects.mark_foreign(obj_name):
                self.counters.add("objects_foreign")
            return None
        tsize = trailer_size(parsed[1])
        table = None
        why = "shorter than its record table"
        if size >= tsize:
            try:
                table = parse_trailer(self.client.get_range(self.data_prefix + obj_name, size - tsize, size - 1,
                                                            background=True, label=obj_name), size)
                why = "no valid record table"
            except S3Error as e:
                if e.code in STALE_CODES:
                    return None  # deleted since the listing
                why = f"trailer read failed ({e})"
        if table is None:
            self._mark_bad(obj_name, why)
        else:
            self.objects.clear_bad(obj_name)
        return table

    def retry_bad(self) -> None:
        """Fetch again the trailers of unreadable objects whose backoff is over, even when they
        fall before the incremental listing's window (HEAD gives the current size)."""
        for obj_name in self.objects.retry_due(time.monotonic()):
            try:
                size = int(self.client.call("head_object", background=True, Bucket=self.client.bucket,
                                            Key=self.data_prefix + obj_name)["ContentLength"])
            except S3Error as e:
                if e.code in STALE_CODES:
                    self.objects.clear_bad(obj_name)  # gone: nothing to retry
                    continue
                return  # the server is failing: try again next round
            self._index_tables([(obj_name, size)], [self._fetch_table(obj_name, size)])

    def _mark_bad(self, obj_name: str, why: str) -> None:
        """Retry an unreadable object later (backoff); give up after a few failures."""
        tries, final = self.objects.mark_bad(obj_name)
        self.counters.add("objects_invalid" if final else "objects_retry")
        if final:
            log.warning("lifeboat: %s: object %s: %s after %d tries; ignoring it", self.name, obj_name, why, tries)
        elif tries == 1:
            log.info("lifeboat: %s: object %s: %s; retrying later", self.name, obj_name, why)
