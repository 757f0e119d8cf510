"""Retention on an S3 tier: retention/'s policy over objects, as segments/capacity.py applies it to files.

Reads (and pages written again while stored) are counted per (object, offset). Over capacity, the
object at the head of the queue (its position: where it was kept, else its age) is evicted, kept
whole (it goes to the tail, no request made), or its read records are copied into a new object
(ranged GETs, one PUT, then the index) before it is deleted: a crash in between leaves two valid
copies. The new object is named with the old one's creation time, so age rules see the first write.
The state (read counts, positions) is published as `<prefix>r/<host>-<pid>-<token>.state` at most
every PUBLISH_S and at close, and the others' are absorbed, so hosts sharing a bucket count each
other's reads; a state object that speaks only of deleted objects is removed.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol, Sequence

import numpy as np

from ...index import Index
from ...metrics import Counters
from ...records import parse_trailer, process_token, trailer_size, writer_tag
from ...retention import (
    KEEP, REINSERT, RETENTION_COUNTERS, STATE_MAX_BYTES, AccessTable, RewriteBudget, Row, decode, encode, judge,
    keep_whole, offsets_by_unit, tail_position)
from .client import DELETE_BATCH_KEYS
from .objects import ObjectTable, S3Object, parse_name

log = logging.getLogger(__name__)

STATE_DIR = "r/"
PUBLISH_S = 30.0
COUNTERS = ("evicted_objects", "evicted_bytes", *RETENTION_COUNTERS)


class KeptTier(Protocol):
    """What retention uses of its S3 tier (tier.py)."""

    name: str
    prefix: str
    data_prefix: str
    read_only: bool
    client: Any
    objects: ObjectTable
    index: Index
    counters: Counters

    def write_many(self, records: Sequence[tuple[int, bytes, Sequence[object], int]], affinity: int = 0,
                   background: bool = False, born_ms: int | None = None) -> list[Any]: ...

    def forget_marks(self, gone: set[str]) -> None: ...


def _born(name: str) -> int:
    parsed = parse_name(name)
    return parsed[0] if parsed else 0


class S3Keeping:
    """The access table, rewrite budget and capacity gc of one S3 tier (see the module docstring)."""

    def __init__(self, tier: KeptTier) -> None:
        self.tier = tier
        self.access = AccessTable()
        self.budget = RewriteBudget(slack_bytes=64 << 20)
        self.state_prefix = tier.prefix + STATE_DIR
        self.own = f"{writer_tag()}-{process_token()}.state"
        self._published = -1
        self._synced = 0.0

    def hit(self, obj: S3Object, offset: int) -> None:
        self.access.hit(obj.name, offset)

    def touch(self, ikeys: np.ndarray) -> None:
        def name(unit: int) -> str | None:
            obj = self.tier.objects.get(unit)
            return None if obj is None else obj.name

        self.access.hit_many(offsets_by_unit(self.tier.index, ikeys, name))

    # ------------------------------------------------------------------ capacity gc
    def gc(self, cap: int) -> int:
        """Free objects as retention decides until usage <= cap. Returns bytes freed."""
        t = self.tier
        freed, kept = 0, 0
        doomed: list[tuple[S3Object, int]] = []
        while t.objects.usage - sum(o.counted for o, _ in doomed) > cap:
            gone = {o.id for o, _ in doomed}
            objs = [o for o in t.objects.oldest_first() if o.id not in gone]
            if not objs:
                break
            head = min(objs, key=lambda o: self.access.rank(o.name, _born(o.name)))
            action, rows, unread = self._choose(head, keep_allowed=kept <= 4 * len(objs))
            if action == KEEP:
                kept += 1
                keep_whole(self.access, t.counters, head.name, len(rows))
                continue
            if action == REINSERT:
                self._reinsert(head, rows)
            elif rows:
                t.counters.add("retention_over_budget_records", len(rows))
            doomed.append((head, unread))
            if len(doomed) >= DELETE_BATCH_KEYS:
                freed += self._delete(doomed)
                doomed = []
        return freed + self._delete(doomed)

    def _delete(self, doomed: list[tuple[S3Object, int]]) -> int:
        if not doomed:
            return 0
        t = self.tier
        keys = [t.data_prefix + o.name for o, _ in doomed]
        failed = t.client.delete(keys)
        freed = 0
        for (o, unread), k in zip(doomed, keys):
            if k in failed:
                continue
            t.objects.drop(o)
            self.access.forget([o.name])
            freed += o.size
            t.counters.add("evicted_objects")
            t.counters.add("evicted_bytes", o.size)
            t.counters.add("evicted_unread_records", unread)
        t.forget_marks({o.name for o, _ in doomed})
        return freed

    def _choose(self, obj: S3Object, *, keep_allowed: bool) -> tuple[str, list[Row], int]:
        """The policy's action, the read records still current (rows), and how many current ones were
        not read. An object nothing was read from costs no request."""
        hits = self.access.hits_of(obj.name)
        if not hits:
            return "evict", [], obj.records
        t = self.tier
        size = trailer_size(obj.records)
        try:
            tail = t.client.get_range(t.data_prefix + obj.name, obj.size - size, obj.size - 1, True, label=obj.name)
        except OSError:
            return "evict", [], obj.records
        table = parse_trailer(tail, obj.size)
        if table is None:
            return "evict", [], obj.records
        return judge(table, obj.id, obj.size, t.index, hits, self.budget, keep_allowed=keep_allowed)

    def _reinsert(self, obj: S3Object, rows: list[Row]) -> None:
        """Copy the read records into a new object named with obj's creation time, counts less one."""
        t = self.tier
        hits = self.access.hits_of(obj.name)
        records = []
        try:
            for key, off, digest, length in rows:
                data = t.client.get_range(t.data_prefix + obj.name, off, off + length - 1, True, label=obj.name)
                if len(data) == length:
                    records.append((key, digest, [data], length))
            refs = t.write_many(records, background=True, born_ms=_born(obj.name)) if records else []
        except OSError as e:
            log.warning("lifeboat: %s: cannot keep the read records of %s (%s); they are evicted with it",
                        t.name, obj.name, e)
            return
        new = t.objects.get(refs[0].loc.unit) if refs else None
        if new is None:
            return
        self.access.place(new.name, tail_position())
        self.access.carry(new.name, {ref.loc.offset: hits.get(r[1], 1) - 1 for ref, r in zip(refs, rows)
                                     if hits.get(r[1], 1) > 1})
        n = sum(r[3] for r in records)
        self.budget.spend(n)
        t.counters.add("retention_reinserted_records", len(records))
        t.counters.add("retention_rewritten_bytes", n)

    # ------------------------------------------------------------------ shared state
    def sync(self, force: bool = False) -> None:
        """Absorb the other processes' state, then publish ours (at most every PUBLISH_S unless forced)."""
        now = time.monotonic()
        if not force and now - self._synced < PUBLISH_S:
            return
        self._synced = now
        t = self.tier
        live = {o.name for o in t.objects.oldest_first()}
        stale = []
        try:
            listed = t.client.list(self.state_prefix)
            for name, size in listed.items():
                if name == self.own or not name.endswith(".state") or not 0 < size <= STATE_MAX_BYTES:
                    continue
                try:
                    hits, order = decode(t.client.get_range(self.state_prefix + name, 0, size - 1, True))
                except ValueError as e:
                    log.info("lifeboat: %s: ignoring retention state %s (%s)", t.name, name, e)
                    continue
                self.access.merge(hits, order)
                if live and not (set(hits) | set(order)) & live:
                    stale.append(self.state_prefix + name)
            if not t.read_only and self.access.version != self._published:
                version = self.access.version
                hits, order = self.access.export(live)
                t.client.put(self.state_prefix + self.own, encode(hits, order), background=True)
                self._published = version
                if stale:
                    t.client.delete(stale)
        except OSError as e:
            log.info("lifeboat: %s: retention state not shared this time (%s)", t.name, e)
