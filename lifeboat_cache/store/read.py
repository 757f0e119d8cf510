"""The store's one read path: records from the tiers, verified, into the caller's pages.

`ReadPath.get` runs a call's io tasks through `IoCalls.until` (the call's deadline). Every record is
read and checked by one function, `_read_group` (size bound, the call's gate, one read of the group's
records, verification and decoding into the page, misses counted by cause), used in two task shapes:

- a first tier that reads runs (RecordRuns: local, nfs): the pages it holds as up to READ_RUNS tasks,
  adjacent records coalesced into one preadv, each record verified before its page counts;
- per page, over the tiers from the first one not asked yet (all of them when the first tier reads no
  runs, the lower ones for the first tier's misses); a hit from a lower tier is promoted to the first.

The gate protects the caller's pages: a task enters it before its I/O when a record is read straight
into a page (raw, or sealed and opened in place), after it otherwise (a shared tier, NFS or S3, always
reads into a private buffer first, so a read that outlives the deadline never writes into a page
SGLang has reused; a hung local drive is not covered). A record that fails verification is a miss, and
a bad one (not an intact record of another key or size) is dropped from the index and quarantined.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, NamedTuple, Sequence

import numpy as np

from ..records import (
    DTYPE_ITEMSIZE, DTYPE_NAMES, HEADER_SIZE, NONCE_BYTES, OPENABLE_REASONS, RAW, SEAL_OVERHEAD, TAG_BYTES,
    Header, RecordError, unpack_header, verify_record)
from ..tiers import RecordRuns, Ref
from .calls import chunks
from .context import StoreContext
from .io_workers import Gate

log = logging.getLogger(__name__)

READ_RUNS = 8  # cold reads: 8 coalesced requests in flight beat 4 (noisy 2-core VM: 1.3-2.0 vs 0.9-1.5 GB/s)
HIT, MISS, LATE = 1, 0, -1  # a page's outcome on the first tier's run read (MISS: try lower tiers)


class Want(NamedTuple):
    """One page to read from one tier: where its record is, and the page's identity and pieces."""
    ref: Ref
    ikey: int
    digest: bytes
    dst: list[np.ndarray]
    size: int


#: a verified record: (its header, the buffers it was read into, whether straight into the page)
Got = tuple[Header, list[memoryview], bool]


def read_bufs(ref: Ref, dst: list[np.ndarray], n: int, private: bool,
              alloc: Callable[[int], np.ndarray] | None = None) -> tuple[list[memoryview], bool]:
    """(buffers to read a record into, direct): a raw record straight into the page's pieces (n
    bytes) after a header buffer (no extra copy), anything else (or `private`) into its own buffer
    (`alloc(n)`, default a new one; no zero-fill pass)."""
    if not private and ref.length == HEADER_SIZE + n:
        return [memoryview(bytearray(HEADER_SIZE)), *(memoryview(p) for p in dst)], True
    if not private and n and ref.length == HEADER_SIZE + n + SEAL_OVERHEAD:
        # only a sealed raw page has this length: its ciphertext straight into the page (opened in
        # place), header + nonce and the tag into buffers of their own
        return [memoryview(bytearray(HEADER_SIZE + NONCE_BYTES)), *(memoryview(p) for p in dst),
                memoryview(bytearray(TAG_BYTES))], True
    return [memoryview(np.empty(ref.length, dtype=np.uint8) if alloc is None else alloc(ref.length))], False


class ReadPath:
    """Reads of one store (see the module docstring) over its shared context."""

    def __init__(self, ctx: StoreContext) -> None:
        self.ctx = ctx

    def get(self, ns: bytes, ds: Sequence[bytes], ik: np.ndarray, views: list[tuple[list[np.ndarray], int, int]],
            affinity: int, started: float) -> list[bool]:
        """Read pages into their views' pieces; True per verified page. `started`: the call's
        perf_counter start, for its latency."""
        n = len(ds)
        sizes = [sum(p.nbytes for p in pieces) for pieces, _, _ in views]
        gate = Gate(n)
        where = [-1] * n  # the tier each page is being read from: a late page blames it
        t_end = self.ctx.calls.t_end()
        results = [False] * n
        todo, first = list(range(n)), [0] * n  # pages left, and the tier to start at
        if n and isinstance(self.ctx.tiers[0], RecordRuns) and not self.ctx.read_cooldowns[0].active():
            runs = self._runs(ns, ik, ds, views, sizes, t_end)
            results = [o == HIT for o in runs]
            todo = [i for i, o in enumerate(runs) if o == MISS] if len(self.ctx.tiers) > 1 else []
            first = [1] * n

        def one(i: int) -> bool:
            return self._over_tiers(ns, int(ik[i]), ds[i], views[i][0], sizes[i], affinity, gate, i, where, first[i])

        for i, ok in zip(todo, self.ctx.calls.until(one, todo, t_end, gate, None, "read", where, ikeys=ik)):
            results[i] = ok
        n_ok = sum(results)
        self.ctx.counters.add("pages_read", n_ok)
        self.ctx.counters.add("read_misses", n - n_ok)
        self.ctx.counters.add("bytes_read", sum(s for s, ok in zip(sizes, results) if ok))
        self.ctx.counters.observe("get", time.perf_counter() - started)
        return results

    def _runs(self, ns: bytes, ik: np.ndarray, ds: Sequence[bytes], views: list, sizes: list[int],
              t_end: float) -> list[int]:
        """The pages the first tier (RecordRuns) holds, as up to READ_RUNS io tasks of adjacent
        records. Per page: HIT, MISS (not there or not served: the lower tiers are tried) or LATE."""
        tier = self.ctx.tiers[0]
        assert isinstance(tier, RecordRuns)
        refs = tier.locate_many(ik)
        out = [MISS] * len(ik)
        found = sorted((i for i, r in enumerate(refs) if r is not None),
                       key=lambda i: (refs[i].part, refs[i].loc.unit, refs[i].loc.offset))  # type: ignore[union-attr]
        tasks = chunks(found, READ_RUNS)
        gate = Gate(len(tasks))  # one slot per task: it touches the caller's pages inside it only

        def read(c: int) -> list[int]:
            with self.ctx.calls.arena.task():  # private reads land in its buffer, decoded before it ends
                wants = [Want(refs[i], int(ik[i]), ds[i], views[i][0], sizes[i])  # type: ignore[arg-type]
                         for i in tasks[c]]
                got = self._read_group(0, ns, wants, gate, c, runs=True, alloc=self.ctx.calls.arena.take)
                return [LATE] * len(wants) if got is None else [MISS if g is None else HIT for g in got]

        for c, res in enumerate(self.ctx.calls.until(read, list(range(len(tasks))), t_end, gate, self.ctx.read_cooldowns[0], "read",
                                                 where=[0] * len(tasks), pages=lambda c: len(tasks[c]),
                                                 ikeys=np.array([ik[t[0]] for t in tasks], np.int64))):
            for i, o in zip(tasks[c], res if isinstance(res, list) else [LATE] * len(tasks[c])):
                out[i] = o
        return out

    def _over_tiers(self, ns: bytes, ikey: int, digest: bytes, dst: list[np.ndarray], size: int, affinity: int,
              gate: Gate, slot: int, where: list[int], first: int) -> bool:
        """One page over the tiers from level `first` on (the first hit is promoted to tier 0)."""
        skipped = False
        for level in range(first, len(self.ctx.tiers)):
            tier, cd = self.ctx.tiers[level], self.ctx.read_cooldowns[level]
            if cd.active():
                self.ctx.counters.add("tier_skipped_cooldown")
                skipped = True
                continue
            ref = tier.locate(ikey)
            if ref is None:
                continue
            if gate.closed:
                return False  # the call has returned: no more I/O for it
            where[slot] = level
            got = self._read_group(level, ns, [Want(ref, ikey, digest, dst, size)], gate, slot, runs=False)
            if got is None or got[0] is None:
                continue
            if level > 0:
                self.ctx.counters.add(f"hits_tier{level}")
                self._promote(ikey, digest, self._record(got[0], dst, ns, digest), affinity)
            return True
        if skipped:
            self.ctx.counters.add("miss_cooldown")
        return False

    def _read_group(self, level: int, ns: bytes, wants: list[Want], gate: Gate, slot: int, *, runs: bool,
                    alloc: Callable[[int], np.ndarray] | None = None) -> list[Got | None] | None:
        """Read, verify and decode the records of `wants` from tier `level` into their pages, inside the
        gate's `slot`: per want the verified record or None (a miss, counted by cause); None for all of
        them when the call returned first. `runs`: one read_run for the group (else read_into each)."""
        tier, cd = self.ctx.tiers[level], self.ctx.read_cooldowns[level]
        res: list[Got | None] = [None] * len(wants)
        fit = [k for k, w in enumerate(wants) if self._fits(w.ref, w.size)]
        if not fit:
            return res
        if gate.closed:
            return None  # the call has returned: no more I/O for it
        plan = {k: read_bufs(wants[k].ref, wants[k].dst, wants[k].size, private=tier.shared, alloc=alloc)
                for k in fit}
        early = any(direct for _, direct in plan.values())  # I/O straight into a page: inside the gate
        if early and not gate.enter(slot):
            return None
        try:
            try:
                if runs:
                    assert isinstance(tier, RecordRuns)
                    ok = tier.read_run([wants[k].ref for k in fit], [plan[k][0] for k in fit])
                else:
                    ok = [tier.read_into(wants[k].ref, plan[k][0]) for k in fit]
            except OSError as e:
                self.ctx.counters.add("read_errors", len(fit))
                cd.fail("read", e)
                return res
            if not early and not gate.enter(slot):
                return None  # the call has returned: its pages are no longer ours
            for k, good in zip(fit, ok):
                if not good:
                    self.ctx.counters.add("miss_stale")
                    continue
                w, (bufs, direct) = wants[k], plan[k]
                h = self._verified(level, w, ns, bufs, direct)
                res[k] = None if h is None else (h, bufs, direct)
        finally:
            gate.leave(slot, done=any(g is not None for g in res))
        if any(g is not None for g in res):
            cd.ok()
        return res

    def _record(self, got: Got, dst: list[np.ndarray], ns: bytes, digest: bytes) -> bytes | memoryview:
        """A verified record as the first tier stores it (for promotion)."""
        h, bufs, direct = got
        if direct and not h.sealed:
            return b"".join([bytes(bufs[0]), *(p.tobytes() for p in dst)])
        # promoted to a first tier that stores raw (built again from the page), or read in place from a
        # sealed record (its ciphertext was opened in the page): built again, sealed anew
        if direct or not self.ctx.compress:
            header, parts, _ = self.ctx.sealer.build(dst if len(dst) > 1 else dst[0],
                                                 itemsize=DTYPE_ITEMSIZE[DTYPE_NAMES[h.dtype]],
                                                 dtype=h.dtype, digest=digest, namespace=ns, compress=self.ctx.compress)
            return b"".join([header, *parts])  # type: ignore[list-item]
        return bufs[0]

    def _fits(self, ref: Ref, n: int) -> bool:
        """Whether a stored record can be that of an n-byte page: none stores more than its raw page (a
        larger one is foreign or crafted: read nothing, allocate nothing)."""
        if HEADER_SIZE <= ref.length <= HEADER_SIZE + n + SEAL_OVERHEAD:
            return True
        self.ctx.counters.add("miss_size")
        return False

    def _verified(self, level: int, w: Want, ns: bytes, bufs: list[memoryview], direct: bool) -> Header | None:
        """Check a record read into bufs (header, identity, size, payload checksum) and, unless it was
        read straight into the page, decode it into the page. None on a miss: counted by cause; a bad
        record (not an intact one of another key or size) is dropped from the index and quarantined,
        and one this store cannot open (a key it does not hold) is left out of its lookups (refused.py)."""
        tier, into_page = self.ctx.tiers[level], direct
        try:
            h = unpack_header(bufs[0])
            if direct and (h.codec != RAW or (len(bufs[0]) > HEADER_SIZE) != h.sealed):
                # read straight in by its length alone, but laid out otherwise (a sealed compressed
                # page of a few hundred bytes is as long as a raw one): the whole record out of the
                # page into a buffer of its own, then decoded from there like any private read
                bufs[:] = [memoryview(b"".join(bytes(b) for b in bufs))]
                direct = False
            payload = (([bufs[0][HEADER_SIZE:], *bufs[1:]] if h.sealed else bufs[1:]) if direct
                       else bufs[0][HEADER_SIZE:])
            if h.raw_len != w.size:
                raise RecordError("size", f"stored page is {h.raw_len} bytes, buffer is {w.size}")
            # a sealed record's tag (checked when it is opened) covers every byte the checksum would
            verify_record(h, payload, digest=w.digest, namespace=ns, checksum=not h.sealed)
            if direct:  # read straight into the page: a sealed raw page is opened in place, a plaintext
                self.ctx.sealer.open_in_place(h, payload)  # one is served only if plaintext may be
            else:
                self.ctx.sealer.decode_into(h, payload, w.dst)
        except RecordError as e:
            if into_page:  # never leave a refused record's bytes (planted, or opened before its tag failed)
                for piece in w.dst:  # in the caller's page
                    piece.view(np.uint8)[...] = 0
            self.ctx.counters.add(f"miss_{e.reason}")
            # intact records of other keys, and ones another process may open (a key this one does not
            # hold, plaintext while sealed ones are required: gc drops those), are left alone
            if e.reason in OPENABLE_REASONS:
                self.ctx.refused.add(level, w.ikey)
            elif e.reason not in ("foreign", "size"):
                tier.forget(w.ikey, w.ref, e.reason)
                self.ctx.counters.add("quarantined")
                log.warning("lifeboat: dropped a bad record on %s (%s)", tier.name, e)
            return None
        return h

    def _promote(self, ikey: int, digest: bytes, record: bytes | memoryview, affinity: int = 0) -> None:
        """A hit from a lower tier is written to the first tier so the next read is local (a write:
        the first tier's write cooldown applies)."""
        tier, cd = self.ctx.tiers[0], self.ctx.write_cooldowns[0]
        if cd.active():
            return
        try:
            tier.write(ikey, digest, [record], len(record), affinity)
            self.ctx.refused.discard(0, [ikey])
            self.ctx.counters.add("promotions")
        except OSError as e:
            cd.fail("promote", e)
