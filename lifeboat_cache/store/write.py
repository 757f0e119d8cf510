"""The store's one write path: pages in, records on the first tier (and queued for the tiers behind it).

`WritePath.put` cuts a call's missing pages into groups and runs one io task per group through
`IoCalls.until` (the call's deadline): the task passes the call's gate, encodes its pages (the one
encoding, `WritePath.encode`), hands them to a *sink*, offers what the sink stored to the copier, and
counts it (`_count`). What differs between tiers is only the grouping and the sink:

- a first tier that writes runs (RecordRuns: local, nfs): up to WRITE_RUNS groups, one `write_some`
  each (one reservation, pwritev and index insert), sealed or compressed records built in the task's
  arena buffer (then runs of at most ARENA_RUN_BYTES);
- a first tier that stores batches (S3): the pages are encoded one task each first (kept), then
  written as a few multi-page objects (`write_many`, one PUT each) by a second round;
- any other tier: one page per group, one `write` each;
- a first tier cooling down: the pages are encoded and queued for the copier only (not stored yet).

A write to a shared tier (NFS, S3) may outlive the call, so its parts are the store's own bytes and the
task leaves the gate before writing. Storage trouble is counted (`write_errors`) and cools the tier down.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np

from ..records import raw_length
from ..tiers import RecordRuns, Tier
from .calls import chunks
from .context import StoreContext
from .copier import COPY_BATCH_BYTES
from .io_workers import Gate

BATCH_WRITE_RECORDS = 256  # pages per object when the first tier stores batches (S3)
# a first tier that writes and reads runs (RecordRuns: local, nfs) gets a call's pages as at most this
# many io tasks, each one reservation + pwritev calls of at most the tier's write_call_size + one index
# insert (writes) or coalesced preadvs
# (reads): per-record costs dominate small pages (a small model's page is 2 x layers blocks of KiBs)
WRITE_RUNS = 4
# ...and a run whose records are built in the io task's arena (sealed or compressed) holds at most this
# many bytes of pages, so the arena's buffers stay this size and are reused call after call. A quarter
# of a call (48 MiB for 64 pages of 768 KiB) took fresh memory on every call, and fresh memory costs a
# fault per 4 KiB on a VM that hands freed pages back to its host: sealed writes spent 0.3-1.9 kernel
# s/GB more than unsealed ones (docs/storage.md, "Sealed records": its cost)
ARENA_RUN_BYTES = 8 << 20

#: one encoded page: (index key, digest, header, payload parts, record length)
Encoded = tuple[int, bytes, bytes, list[object], int]
#: stores a group's records (the group: page positions in the call); returns (how many of them, from
#: the first, were stored; the error that stopped it)
Sink = Callable[[list[int], list[Encoded]], tuple[int, OSError | None]]


def _owned(parts: Sequence[object], pieces: Sequence[np.ndarray]) -> list[object]:
    """The record's parts, with a copy of each part that views the caller's page (a raw payload);
    parts the codec made (compressed frames, byte planes) are the store's already."""
    def views_page(p: object) -> bool:
        return isinstance(p, np.ndarray) and any(np.may_share_memory(p, q) for q in pieces)

    return [bytes(p) if views_page(p) else p for p in parts]  # type: ignore[call-overload]


def within_bytes(group: list[int], views: list[tuple[list[np.ndarray], int, int]], limit: int) -> list[list[int]]:
    """group cut into runs of adjacent pages holding at most `limit` bytes of pages each (a larger
    page is a run of its own)."""
    runs: list[list[int]] = []
    held = limit
    for i in group:
        size = sum(p.nbytes for p in views[i][0])
        if held + size > limit:
            runs.append([])
            held = 0
        runs[-1].append(i)
        held += size
    return runs


class WritePath:
    """Writes of one store (see the module docstring) over its shared context."""

    def __init__(self, ctx: StoreContext) -> None:
        self.ctx = ctx

    def put(self, ns: bytes, ds: Sequence[bytes], ik: np.ndarray, views: list[tuple[list[np.ndarray], int, int]],
            affinity: int, started: float) -> list[bool]:
        """Store pages (digests ds, index keys ik, page views); True per page stored afterwards
        (already-present pages count). `started`: the call's perf_counter start, for its latency."""
        results = [False] * len(ds)
        tier, cd = self.ctx.tiers[0], self.ctx.write_cooldowns[0]
        present = tier.contains(ik) if len(ik) else np.zeros(0, bool)
        refused = self.ctx.refused.mask(0, ik)  # held, but not a record this store can open: write it again
        if refused is not None:
            present &= ~refused
        todo = []
        for i in range(len(ds)):
            if present[i]:
                results[i] = True
            else:
                todo.append(i)
        if len(todo) < len(ds):
            tier.touch(ik[present])  # a page recomputed while stored is in use: retention keeps it
        redirect = False  # first tier cooling down: queue the pages for the tiers behind it
        if todo and cd.active():
            if self.ctx.copier is None:
                self.ctx.counters.add("writes_dropped_cooldown", len(todo))
                todo = []
            else:
                redirect = True
        if todo:
            self._write(ns, ds, ik, views, todo, results, affinity, redirect)
            if all(results[i] for i in todo):
                cd.ok()
            if refused is not None:  # this store's own records now
                self.ctx.refused.discard(0, (int(ik[i]) for i in todo if results[i]))
        self.ctx.counters.observe("set", time.perf_counter() - started)
        return results

    def encode(self, ns: bytes, digest: bytes, view: tuple[list[np.ndarray], int, int], own: bool,
               alloc: Callable[[int], np.ndarray] | None = None) -> tuple[bytes, list[object], int]:
        """One page's record (header, payload parts, length); owned parts never view the caller's page.
        With `alloc` (the io task's arena) the record's new bytes (sealed or compressed) are built in
        that buffer: it must then be written before the task ends."""
        pieces, itemsize, dt = view
        header, parts, length = self.ctx.sealer.build(pieces if len(pieces) > 1 else pieces[0], itemsize=itemsize,
                                                  dtype=dt, digest=digest, namespace=ns, compress=self.ctx.compress,
                                                  alloc=alloc)
        return header, _owned(parts, pieces) if own else parts, length

    def _write(self, ns: bytes, ds: Sequence[bytes], ik: np.ndarray, views: list, todo: list[int],
               results: list[bool], affinity: int, redirect: bool) -> None:
        """The pages `todo` to the first tier (or the copier), by the call's deadline: results set."""
        tier = self.ctx.tiers[0]
        t_end = self.ctx.calls.t_end()

        def encoder(own: bool, alloc: Callable[[int], np.ndarray] | None = None
                    ) -> Callable[[list[int]], list[Encoded]]:
            return lambda group: [(int(ik[i]), ds[i], *self.encode(ns, ds[i], views[i], own, alloc)) for i in group]

        if redirect:
            groups = [[i] for i in todo]
            wrote = self._run(ns, groups, encoder(False), self._redirect(affinity), affinity, own=False, t_end=t_end)
        elif tier.batch_writes:  # encoded in parallel first (kept: owned bytes), then a few objects
            kept: dict[int, Encoded] = {}

            def keep(group: list[int], recs: list[Encoded]) -> tuple[int, OSError | None]:
                kept[group[0]] = recs[0]
                return 1, None

            singles = [[i] for i in todo]
            encoded = self._run(ns, singles, encoder(True), keep, affinity, own=True, t_end=t_end, count=False)
            groups = self._batches([g[0] for g, n in zip(singles, encoded) if n], kept)
            wrote = self._run(ns, groups, lambda group: [kept[i] for i in group], self._write_many(tier, affinity),
                              affinity, own=False, t_end=t_end)
        elif isinstance(tier, RecordRuns):
            groups = chunks(todo, WRITE_RUNS)
            if self.ctx.sealer.active or self.ctx.compress:
                groups = [run for g in groups for run in within_bytes(g, views, ARENA_RUN_BYTES)]
            wrote = self._run(ns, groups, encoder(tier.shared, self.ctx.calls.arena.take),
                              self._write_some(tier, affinity), affinity, own=tier.shared, t_end=t_end)
        else:
            groups = [[i] for i in todo]
            wrote = self._run(ns, groups, encoder(tier.shared), self._write_one(tier, affinity),
                              affinity, own=tier.shared, t_end=t_end)
        for c, n in enumerate(wrote):
            for i in groups[c][: int(n)]:
                results[i] = True

    def _run(self, ns: bytes, groups: list[list[int]], encode: Callable[[list[int]], list[Encoded]], sink: Sink,
             affinity: int, *, own: bool, t_end: float, count: bool = True) -> list[int]:
        """One io task per group, all by t_end: gate, encode, sink, copier, counters. Returns the number
        of pages stored per group (0 for a group not done by the deadline: counted as dropped)."""
        cd = self.ctx.write_cooldowns[0]
        gate = Gate(len(groups))  # one slot per group: a group touches the caller's pages until encoded

        def task(c: int) -> int:
            with self.ctx.calls.arena.task():  # sealed records built in its buffer are written before it ends
                if not gate.enter(c):
                    return 0
                try:
                    recs = encode(groups[c])
                    if own:  # the parts are the store's own bytes: the caller may reuse its pages
                        gate.leave(c)
                    n, err = sink(groups[c], recs)
                    if count and self.ctx.copier is not None:  # it snapshots the parts: still inside the gate
                        for k, d, h, parts, length in recs[:n]:
                            self.ctx.copier.offer(k, d, [h, *parts], length, affinity)
                finally:
                    gate.leave(c)
            if count:
                self._count(ns, recs[:n])
            if err is not None:
                self.ctx.counters.add("write_errors", len(recs) - n)
                cd.fail("write", err)
            return n

        return self.ctx.calls.until(task, list(range(len(groups))), t_end, gate, cd, "write",
                                pages=lambda c: len(groups[c]))

    def _count(self, ns: bytes, done: list[Encoded]) -> None:
        """Pages stored: counted once per group (the header holds each page's raw length)."""
        if not done:
            return
        stored = sum(rec[4] for rec in done)
        self.ctx.counters.add("pages_written", len(done))
        self.ctx.counters.add("bytes_written_raw", sum(raw_length(rec[2]) for rec in done))
        self.ctx.counters.add("bytes_written_stored", stored)
        self.ctx.counters.add_namespace(ns, len(done), stored)

    # ------------------------------------------------------------------ sinks
    def _write_one(self, tier: Tier, affinity: int) -> Sink:
        def sink(group: list[int], recs: list[Encoded]) -> tuple[int, OSError | None]:
            k, d, h, parts, length = recs[0]
            try:
                tier.write(k, d, [h, *parts], length, affinity)
            except OSError as e:
                return 0, e
            return 1, None
        return sink

    def _write_some(self, tier: RecordRuns, affinity: int) -> Sink:
        """A run's records after a failure (full disk) are dropped and counted."""
        def sink(group: list[int], recs: list[Encoded]) -> tuple[int, OSError | None]:
            try:
                refs, err = tier.write_some([(k, d, [h, *parts], n) for k, d, h, parts, n in recs], affinity)
            except OSError as e:
                return 0, e
            return len(refs), err
        return sink

    def _write_many(self, tier: Tier, affinity: int) -> Sink:
        def sink(group: list[int], recs: list[Encoded]) -> tuple[int, OSError | None]:
            try:
                tier.write_many([(k, d, [h, *parts], n) for k, d, h, parts, n in recs], affinity)
            except OSError as e:
                return 0, e
            return len(recs), None
        return sink

    def _redirect(self, affinity: int) -> Sink:
        """Not stored yet (so 0): the copier writes the records to the lower tiers."""
        def sink(group: list[int], recs: list[Encoded]) -> tuple[int, OSError | None]:
            for k, d, h, parts, length in recs:
                self.ctx.counters.add("writes_redirected")
                self.ctx.copier.offer(k, d, [h, *parts], length, affinity)  # type: ignore[union-attr]
            return 0, None
        return sink

    @staticmethod
    def _batches(done: list[int], kept: dict[int, Encoded]) -> list[list[int]]:
        """Encoded pages as objects of at most BATCH_WRITE_RECORDS records and COPY_BATCH_BYTES bytes."""
        groups: list[list[int]] = []
        size = 0
        for i in done:
            if not groups or len(groups[-1]) >= BATCH_WRITE_RECORDS or size + kept[i][4] > COPY_BATCH_BYTES:
                groups.append([])
                size = 0
            groups[-1].append(i)
            size += kept[i][4]
        return groups
