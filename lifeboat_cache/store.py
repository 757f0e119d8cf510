"""ChunkStore: batch put / get / count_leading_hits of pages over the configured tiers.

The store coordinates; tiers store record bytes, the codec encodes and checks them. Encoding,
writing, reading and decoding run on io worker threads (`engine.io_workers`), so a 128-page call
from SGLang is processed in parallel (zstd and file I/O release the GIL). Storage trouble never
raises out of put / get_into / count_leading_hits: it is a miss or a dropped write, counted by cause, logged
once per cooldown, and the failing tier is skipped for a cooldown that doubles while it keeps
failing. A record is verified (header, identity, payload checksum) before its bytes are trusted;
one that fails is dropped from the index and quarantined. Records are built and opened by the
store's `Sealer` (sealing.py): sealed with AES-256-GCM when `encryption:` is on, plaintext otherwise;
a record it will not serve (plaintext where sealed ones are required, a key it does not hold, a tag
that does not verify) is a miss counted under its own reason.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np

from . import codec
from .codec import HEADER_SIZE, RecordError
from .config import Settings, TierSettings, load_settings
from .cooldown import Cooldown  # noqa: F401  (re-exported: `store.Cooldown` stays importable)
from .copier import COPY_BATCH_BYTES, DEFAULT_COPY_WORKERS, Copier
from .io_workers import Gate, IoWorkers, TaskArena
from .keys import DigestCache
from .metrics import Counters
from .sealing import OPENABLE_REASONS, UNKNOWN_KEY, UNSEALED, Sealer, key_id_text, sealer_for
from .tiers import Ref, Tier, open_tier
from .tiers.base import Auditing, Probing, RecordRuns
from .tracing import trace_store

log = logging.getLogger(__name__)

FLUSH_COPY_TIMEOUT_S = 60.0
CLOSE_COPY_TIMEOUT_S = 30.0
IO_THREADS_PER_WORKER = 4  # the io pool grows to io_workers * this while tiers hang, no further
DEADLINE_GRACE_S = 1.0  # after the deadline, wait at most this long for pages mid-copy into buffers
PROBE_INTERVAL_S = 0.25  # a held (hung) tier is probed this often, from one background thread
BATCH_WRITE_RECORDS = 256  # pages per object when the first tier stores batches (S3)
# a first tier that writes and reads runs (RecordRuns: local, nfs) gets a call's pages as at most this
# many io tasks, each one reservation + one pwritev + one index insert (writes) or coalesced preadvs
# (reads): per-record costs dominate small pages (a small model's page is 2 x layers blocks of KiBs)
WRITE_RUNS = 4
READ_RUNS = 8  # cold reads: 8 coalesced requests in flight beat 4 (noisy 2-core VM: 1.3-2.0 vs 0.9-1.5 GB/s)
_HIT, _MISS, _LATE = 1, 0, -1  # a page's outcome on the first tier's run read (_MISS: try lower tiers)


class PageBlocks(NamedTuple):
    """A page as flat uint8 blocks in page order, already checked by its maker (an integration that
    checked its pool's layout once): `put` / `get_into` take it as is. A plain list of arrays is
    checked and viewed as bytes block by block (~2 us a block in Python: a small model's
    layer_first page is 48 blocks, and that was a third of the store's Python time per page).

    pieces: 1-D C-contiguous uint8 arrays (views of the caller's memory); itemsize / dtype: the
    element width and codec dtype code of the page (codec.dtype_code). `writable`: whether the
    blocks may be read into (get_into refuses a page that is not)."""
    pieces: list[np.ndarray]
    itemsize: int
    dtype: int
    writable: bool = True


def _view(buf: object) -> tuple[list[np.ndarray], int, int]:
    """(flat uint8 pieces, itemsize, dtype code) of a page, no copy.

    A page is one C-contiguous buffer, or a list/tuple of them that make the page in order
    (scatter-gather: an SGLang layer_first KV page is 2*L separate blocks of the host pool), or a
    PageBlocks (checked by its maker).
    """
    if type(buf) is PageBlocks:
        return buf.pieces, buf.itemsize, buf.dtype
    bufs = list(buf) if isinstance(buf, (list, tuple)) else [buf]
    if not bufs:
        raise ValueError("a page needs at least one buffer")
    first = bufs[0]
    if len(bufs) > 1 and isinstance(first, np.ndarray) and first.ndim == 1:
        # fast path for many blocks (a layer_first page is 2 x layers of them): one dtype, 1-D, contiguous
        dt = first.dtype
        if all(type(b) is np.ndarray and b.dtype == dt and b.ndim == 1 and b.flags.c_contiguous for b in bufs):
            code = codec.dtype_code(first)
            return [b.view(np.uint8) for b in bufs], codec.DTYPE_ITEMSIZE[codec.DTYPE_NAMES[code]], code
    codes = {codec.dtype_code(b) if isinstance(b, np.ndarray) else codec.DTYPE_CODES["u1"] for b in bufs}
    code = codes.pop() if len(codes) == 1 else codec.DTYPE_CODES["u1"]
    return [codec.as_bytes_view(b) for b in bufs], codec.DTYPE_ITEMSIZE[codec.DTYPE_NAMES[code]], code


def _owned(parts: Sequence[object]) -> list[object]:
    """The record's parts as bytes the store owns (a raw payload part is a view of the caller's page)."""
    return [p if isinstance(p, bytes) else bytes(p) for p in parts]  # type: ignore[call-overload]


def compresses(ts: TierSettings, engine_compression: str) -> bool:
    """Whether a tier stores pages compressed: its own `compression:`, else the engine's, else
    (`auto`) the rule: a local drive stores raw (zstd costs more CPU per byte than an NVMe write or
    read saves, and raw pages read straight into SGLang's host pool), nfs and s3 store compressed (the
    network and the remote capacity are what is scarce there; ~1.45x smaller on real bf16 KV)."""
    choice = ts.compression or engine_compression
    if choice == "auto":
        return ts.type in ("nfs", "s3")
    return choice == "zstd"


class ChunkStore:
    """Pages in, pages out, under (namespace, key). See docs/architecture.md for the contract."""

    def __init__(self, settings: Settings, tiers: Sequence[Tier], sealer: Sealer | None = None) -> None:
        if not tiers:
            raise ValueError("a ChunkStore needs at least one tier")
        self.settings = settings
        # builds and opens every record (sealed when `encryption:` is on): the one place that decides
        self.sealer = sealer if sealer is not None else sealer_for(settings.encryption, settings.key_namespace)
        self.tiers = list(tiers)
        eng = settings.engine
        # per tier: store compressed or raw (see compresses); put encodes for the first tier, and
        # the background copy re-encodes a raw record for a lower tier that compresses
        self.tier_compress = [compresses(ts, eng.compression) for ts in self._tier_settings()]
        self.compress = self.tier_compress[0]
        self.counters = Counters()
        self._digests = DigestCache()  # exists asks about the same keys again and again
        # reads and writes cool down separately: a full disk stops writes, not reads
        self.read_cooldowns = [self._cooldown(t, ts, "read") for t, ts in zip(self.tiers, self._tier_settings())]
        self.write_cooldowns = [self._cooldown(t, ts, "write") for t, ts in zip(self.tiers, self._tier_settings())]
        self.deadline_s = eng.deadline_s
        self._probes: dict[int, int | None] = {}  # held tier level -> a key to probe it with
        self._prober: threading.Thread | None = None
        self._probe_lock = threading.Lock()
        self._pool = IoWorkers(eng.io_workers, max_workers=eng.io_workers * IO_THREADS_PER_WORKER,
                               counters=self.counters, stuck_s=eng.deadline_s)
        self._arena = TaskArena()  # per io task: sealed records being written, records read privately
        self._closed = False
        # the drive-choice rule of the first multi-drive tier: a dialog's first N pages pick its drive
        self.affinity_chunks = next((ts.affinity_chunks for ts in settings.storage if len(ts.paths) > 1), 1)
        # a single tier needs no copy, and so pays nothing for it
        self._copier = Copier(self.tiers, self.write_cooldowns, self.counters, max_bytes=eng.copy_queue_bytes,
                              workers=min(DEFAULT_COPY_WORKERS, eng.io_workers),
                              recode=self._recode if not self.compress and any(self.tier_compress[1:]) else None
                              ) if len(self.tiers) > 1 else None
        if eng.trace:  # a wrapper on this instance (tracing.py), not a flag the data path checks
            trace_store(self, log)

    def _recode(self, level: int, record: bytes) -> bytes | memoryview:
        """The record as tier `level` stores it: compressed there when its rule says so."""
        return self.sealer.recode(record, self.tier_compress[level])

    def _tier_settings(self) -> list[TierSettings]:
        given = list(self.settings.storage)
        return given + [TierSettings(type="local")] * (len(self.tiers) - len(given))

    def _cooldown(self, tier: Tier, ts: TierSettings, what: str) -> Cooldown:
        eng = self.settings.engine
        base = ts.failure_cooldown_s if ts.failure_cooldown_s is not None else eng.failure_cooldown_s
        top = ts.failure_cooldown_max_s if ts.failure_cooldown_max_s is not None else eng.failure_cooldown_max_s
        return Cooldown(f"{tier.name} ({what})", base, top, logger=log)

    @classmethod
    def open(cls, settings: Settings | None = None, *, background: bool = True, read_only: bool = False,
             evict: bool = True, seal: bool = True) -> "ChunkStore":
        """Open every configured tier; the index rebuild runs in the background unless told not to.

        `read_only`: create, change and delete no file (no eviction, no quarantine writes, no missing
        directory created): for `lifeboat stats` / `verify`. `evict=False`: files may change (quarantine)
        but nothing is evicted (`verify --fix`). Only `gc` and serving processes evict. `seal=False`
        (the CLI's inspection and maintenance): with `encryption:` on, a config whose key_namespace has
        no key of its own still opens (every listed key opens records; no page can be written).
        """
        settings = settings or load_settings()
        # key file trouble is a ConfigError before any tier is opened
        sealer = sealer_for(settings.encryption, settings.key_namespace, seal=seal)
        tiers: list[Tier] = []
        try:
            for ts in settings.storage:
                tiers.append(open_tier(ts, background=background, io_workers=settings.engine.io_workers,
                                       deadline_s=settings.engine.deadline_s, read_only=read_only,
                                       evict=evict))
        except BaseException:
            for t in tiers:
                t.close()
            raise
        store = cls(settings, tiers, sealer)
        log.info("lifeboat: store open (%s): %s", settings.source, ", ".join(t.name for t in tiers))
        return store

    # ------------------------------------------------------------------ lookups
    def contains(self, ns: bytes, keys: Sequence[str | bytes]) -> list[bool]:
        """Per-key presence in any tier that is not cooling down. Index only, no I/O."""
        return self._present(ns, keys).tolist()

    def _present(self, ns: bytes, keys: Sequence[str | bytes]) -> np.ndarray:
        """`contains` as a bool array (what `count_leading_hits` reduces without a Python list)."""
        ik = self._digests.index_keys(ns, keys)
        hit = np.zeros(len(ik), dtype=bool)
        asked = False
        for tier, cd in zip(self.tiers, self.read_cooldowns):
            if cd.active():
                continue
            if not asked:  # the first tier answers for every key: no mask, no gather
                hit[:] = tier.contains(ik)
                asked = True
                continue
            miss = ~hit
            if not miss.any():
                break
            hit[miss] = tier.contains(ik[miss])
        return hit

    def count_leading_hits(self, ns: bytes, keys: Sequence[str | bytes]) -> int:
        """How many keys, from the first, are stored (SGLang's batch_exists contract)."""
        t0 = time.perf_counter()
        hit = self._present(ns, keys)
        n = int(hit.argmin()) if len(hit) else 0  # the first miss; 0 too when every key hits
        if n == 0 and len(hit) and hit[0]:
            n = len(hit)
        self.counters.add_many({"lookup_keys": len(keys), "lookup_hits": n},
                               observe=("exists", time.perf_counter() - t0))
        return n

    # ------------------------------------------------------------------ writes
    def affinity_of(self, ns: bytes, dialog_keys: Sequence[str | bytes]) -> int:
        """The drive-choice value of a dialog, from its first `affinity_chunks` page keys.

        Pass it as `affinity=` to every `put` / `get_into` of that dialog (the keys of its first
        pages, not of the batch), so all its pages sit on one drive of a multi-drive tier.
        """
        ds, _ = self._digests(ns, list(dialog_keys[: self.affinity_chunks]))
        return self._affinity(ds)

    def _affinity(self, ds: Sequence[bytes]) -> int:
        first = b"".join(ds[: self.affinity_chunks])
        return int.from_bytes(hashlib.blake2b(first, digest_size=8).digest(), "little") if first else 0

    def put(self, ns: bytes, keys: Sequence[str | bytes], buffers: Sequence[object],
            *, affinity: int | None = None) -> list[bool]:
        """Store pages; True per page that is stored afterwards (already-present pages count).

        `affinity` picks the drive of a multi-drive tier (see `affinity_of`); by default it comes
        from the first `affinity_chunks` keys of this batch. Raises only for caller bugs (length
        mismatch, non-contiguous buffers).
        """
        if len(keys) != len(buffers):
            raise ValueError(f"put: {len(keys)} keys but {len(buffers)} buffers")
        t0 = time.perf_counter()
        ds, ik = self._digests(ns, keys)
        views = [_view(b) for b in buffers]
        results = [False] * len(keys)
        tier, cd = self.tiers[0], self.write_cooldowns[0]
        present = tier.contains(ik) if len(ik) else np.zeros(0, bool)
        if affinity is None:
            affinity = self._affinity(ds)
        todo = []
        for i in range(len(keys)):
            if present[i]:
                results[i] = True
            else:
                todo.append(i)
        redirect = False  # first tier cooling down: queue the pages for the tiers behind it
        if todo and cd.active():
            if self._copier is None:
                self.counters.add("writes_dropped_cooldown", len(todo))
                todo = []
            else:
                redirect = True

        gate = Gate(len(keys))
        t_end = time.monotonic() + self.deadline_s
        # a write to a shared/remote tier may outlive the call: it must then own its bytes
        own = tier.shared
        if todo and not redirect and tier.batch_writes:
            self._put_batches(tier, cd, ns, ds, ik, views, todo, results, affinity, gate, t_end)
            todo = []
        elif todo and not redirect and isinstance(tier, RecordRuns):
            self._put_runs(tier, cd, ns, ds, ik, views, todo, results, affinity, t_end)
            todo = []

        def one(i: int) -> bool:
            if not gate.enter(i):
                return False
            pieces, itemsize, dt = views[i]
            try:
                header, parts, length = self.sealer.build(
                    pieces if len(pieces) > 1 else pieces[0], itemsize=itemsize, dtype=dt, digest=ds[i],
                    namespace=ns, compress=self.compress)
                if redirect:  # not stored yet, so False; the copier writes it to the lower tiers
                    self.counters.add("writes_redirected")
                    self._copier.offer(int(ik[i]), ds[i], [header, *parts], length, affinity)  # type: ignore[union-attr]
                    return False
                if own:
                    parts = _owned(parts)
                    gate.leave(i)
                tier.write(int(ik[i]), ds[i], [header, *parts], length, affinity)
                if self._copier is not None:  # it snapshots the parts: still inside the gate
                    self._copier.offer(int(ik[i]), ds[i], [header, *parts], length, affinity)
            except OSError as e:
                self.counters.add("write_errors")
                cd.fail("write", e)
                return False
            finally:
                gate.leave(i)
            self.counters.add("pages_written")
            self.counters.add("bytes_written_raw", sum(p.nbytes for p in pieces))
            self.counters.add("bytes_written_stored", length)
            self.counters.add_namespace(ns, 1, length)
            return True

        for i, ok in zip(todo, self._map_until(one, todo, t_end, gate, cd, "write")):
            results[i] = ok
        if todo and all(results[i] for i in todo):
            cd.ok()
        self.counters.observe("set", time.perf_counter() - t0)
        return results

    def _encode(self, ns: bytes, digest: bytes, view: tuple[list[np.ndarray], int, int],
                own: bool) -> tuple[bytes, list[object], int]:
        """One page's record (header, payload parts, length); owned parts never view the caller's page.
        A sealed record is built in the io task's arena buffer (it is written before the task ends)."""
        pieces, itemsize, dt = view
        sealed = self.sealer.active
        header, parts, length = self.sealer.build(pieces if len(pieces) > 1 else pieces[0], itemsize=itemsize,
                                                  dtype=dt, digest=digest, namespace=ns, compress=self.compress,
                                                  alloc=self._arena.take if sealed else None)
        return header, _owned(parts) if own and not sealed else parts, length

    def _put_runs(self, tier: Tier, cd: Cooldown, ns: bytes, ds: Sequence[bytes], ik: np.ndarray,
                  views: list, todo: list[int], results: list[bool], affinity: int, t_end: float) -> None:
        """First tier that writes runs (RecordRuns): the pages as up to WRITE_RUNS runs, one io task
        each: encode the run, then one write_some (one reservation, pwritev and index insert), all by
        the call's deadline. A run's records after a failure (full disk) are dropped and counted."""
        assert isinstance(tier, RecordRuns)
        runs = _chunks(todo, WRITE_RUNS)
        gate = Gate(len(runs))  # one slot per run: a run touches the caller's pages until written
        own = tier.shared  # a write to a shared tier may outlive the call: it must own its bytes

        def write(c: int) -> int:
            with self._arena.task():  # sealed records are built in its buffer, written before it ends
                return write_run(c)

        def write_run(c: int) -> int:
            if not gate.enter(c):
                return 0
            try:
                recs = [(int(ik[i]), ds[i], *self._encode(ns, ds[i], views[i], own)) for i in runs[c]]
                if own:
                    gate.leave(c)
                try:
                    refs, err = tier.write_some([(k, d, [h, *parts], n) for k, d, h, parts, n in recs], affinity)
                except OSError as e:
                    refs, err = [], e
                if self._copier is not None:  # it snapshots the parts: still inside the gate
                    for k, d, h, parts, n in recs[: len(refs)]:
                        self._copier.offer(k, d, [h, *parts], n, affinity)
            finally:
                gate.leave(c)
            done = recs[: len(refs)]  # counted once per run (the header holds each page's raw length)
            if done:
                stored = sum(rec[4] for rec in done)
                self.counters.add("pages_written", len(done))
                self.counters.add("bytes_written_raw", sum(codec.raw_length(rec[2]) for rec in done))
                self.counters.add("bytes_written_stored", stored)
                self.counters.add_namespace(ns, len(done), stored)
            if err is not None:
                self.counters.add("write_errors", len(runs[c]) - len(refs))
                cd.fail("write", err)
            return len(refs)

        written = self._map_until(write, list(range(len(runs))), t_end, gate, cd, "write",
                                  pages=lambda c: len(runs[c]))
        for c, n in enumerate(written):
            for i in runs[c][: int(n)]:
                results[i] = True
        if all(results[i] for i in todo):
            cd.ok()

    def _put_batches(self, tier: Tier, cd: Cooldown, ns: bytes, ds: Sequence[bytes], ik: np.ndarray,
                     views: list, todo: list[int], results: list[bool], affinity: int, gate: Gate,
                     t_end: float) -> None:
        """First tier that stores batches (S3): encode the pages in parallel, then write them as a few
        multi-page objects (one PUT each), all by the call's deadline."""
        recs: dict[int, tuple[bytes, list[object], int, int]] = {}

        def encode(i: int) -> bool:
            if not gate.enter(i):
                return False
            try:
                pieces, itemsize, dt = views[i]
                header, parts, length = self.sealer.build(
                    pieces if len(pieces) > 1 else pieces[0], itemsize=itemsize, dtype=dt, digest=ds[i],
                    namespace=ns, compress=self.compress)
                # a sealed record's parts are a buffer of its own already (never a view of the page)
                recs[i] = (header, parts if self.sealer.active else _owned(parts), length,
                           sum(p.nbytes for p in pieces))
                return True
            finally:
                gate.leave(i)

        done = [i for i, ok in zip(todo, self._map_until(encode, todo, t_end, gate, cd, "write")) if ok]
        chunks: list[list[int]] = []
        size = 0
        for i in done:
            if not chunks or len(chunks[-1]) >= BATCH_WRITE_RECORDS or size + recs[i][2] > COPY_BATCH_BYTES:
                chunks.append([])
                size = 0
            chunks[-1].append(i)
            size += recs[i][2]

        def write(c: int) -> bool:
            group = chunks[c]
            try:
                tier.write_many([(int(ik[i]), ds[i], [recs[i][0], *recs[i][1]], recs[i][2]) for i in group], affinity)
            except OSError as e:
                self.counters.add("write_errors", len(group))
                cd.fail("write", e)
                return False
            for i in group:
                header, parts, length, raw = recs[i]
                self.counters.add("pages_written")
                self.counters.add("bytes_written_raw", raw)
                self.counters.add("bytes_written_stored", length)
                if self._copier is not None:
                    self._copier.offer(int(ik[i]), ds[i], [header, *parts], length, affinity)
            return True

        wrote = self._map_until(write, list(range(len(chunks))), t_end, Gate(len(chunks)), cd, "write",
                                pages=lambda c: len(chunks[c]))
        for c, ok in enumerate(wrote):
            for i in chunks[c]:
                results[i] = ok

    # ------------------------------------------------------------------ reads
    def get_into(self, ns: bytes, keys: Sequence[str | bytes], buffers: Sequence[object],
                 *, affinity: int | None = None) -> list[bool]:
        """Read pages straight into the given writable buffers; True per verified page.

        On False the buffer's content is unspecified: never use a page whose result is False.
        A page found on a lower tier is promoted to the first one, on the drive `affinity` picks
        (default as in `put`).
        """
        if len(keys) != len(buffers):
            raise ValueError(f"get_into: {len(keys)} keys but {len(buffers)} buffers")
        t0 = time.perf_counter()
        ds, ik = self._digests(ns, keys)
        views = [_view(b) for b in buffers]
        if not all(b.writable if type(b) is PageBlocks else all(p.flags.writeable for p in v[0])
                   for b, v in zip(buffers, views)):
            raise ValueError("get_into: destination buffers must be writable")
        sizes = [sum(p.nbytes for p in pieces) for pieces, _, _ in views]

        if affinity is None:
            affinity = self._affinity(ds)

        gate = Gate(len(keys))
        where = [-1] * len(keys)  # the tier each page is being read from: a late page blames it
        t_end = time.monotonic() + self.deadline_s
        results = [False] * len(keys)
        todo, first = list(range(len(keys))), [0] * len(keys)  # pages left, and the tier to start at
        if keys and isinstance(self.tiers[0], RecordRuns) and not self.read_cooldowns[0].active():
            runs = self._get_runs(ns, ik, ds, views, sizes, t_end)
            results = [o == _HIT for o in runs]
            todo = [i for i, o in enumerate(runs) if o == _MISS] if len(self.tiers) > 1 else []
            first = [1] * len(keys)

        def one(i: int) -> bool:
            return self._read_one(ns, int(ik[i]), ds[i], views[i][0], affinity, slot=(gate, i, where),
                                  first=first[i])

        for i, ok in zip(todo, self._map_until(one, todo, t_end, gate, None, "read", where, ikeys=ik)):
            results[i] = ok
        n_ok = sum(results)
        self.counters.add("pages_read", n_ok)
        self.counters.add("read_misses", len(keys) - n_ok)
        self.counters.add("bytes_read", sum(n for n, ok in zip(sizes, results) if ok))
        self.counters.observe("get", time.perf_counter() - t0)
        return results

    def _get_runs(self, ns: bytes, ik: np.ndarray, ds: Sequence[bytes], views: list, sizes: list[int],
                  t_end: float) -> list[int]:
        """Read the pages the first tier (RecordRuns) holds as up to READ_RUNS io tasks, adjacent
        records coalesced into one preadv, each record verified before its page counts (`_verified`).
        Per page: _HIT, _MISS (not there or not served: the lower tiers are tried) or _LATE."""
        tier, cd = self.tiers[0], self.read_cooldowns[0]
        assert isinstance(tier, RecordRuns)
        refs = tier.locate_many(ik)
        out = [_MISS] * len(ik)
        found = sorted((i for i, r in enumerate(refs) if r is not None),
                       key=lambda i: (refs[i].part, refs[i].loc.unit, refs[i].loc.offset))  # type: ignore[union-attr]
        tasks = _chunks(found, READ_RUNS)
        gate = Gate(len(tasks))  # one slot per task: it touches the caller's pages inside it only

        def read(c: int) -> list[int]:
            with self._arena.task():  # private reads land in its buffer, decoded before it ends
                return read_run(c)

        def read_run(c: int) -> list[int]:
            group = [i for i in tasks[c] if self._fits(refs[i], sizes[i])]  # type: ignore[arg-type]
            res = [_MISS] * len(tasks[c])
            pos = {i: k for k, i in enumerate(tasks[c])}
            if not group:
                return res
            if gate.closed:
                return [_LATE] * len(res)  # the call has returned: no more I/O for it
            # into the caller's page when raw, as in _read_record; a shared tier reads privately first,
            # into the task's arena buffer (verified and decoded before this task returns)
            plan = [self._read_bufs(refs[i], views[i][0], sizes[i], private=tier.shared,  # type: ignore[arg-type]
                                    alloc=self._arena.take) for i in group]
            early = not tier.shared
            if early and not gate.enter(c):
                return [_LATE] * len(res)
            try:
                try:
                    ok = tier.read_run([refs[i] for i in group], [bufs for bufs, _ in plan])  # type: ignore[misc]
                except OSError as e:
                    self.counters.add("read_errors", len(group))
                    cd.fail("read", e)
                    return res
                if not early and not gate.enter(c):
                    return [_LATE] * len(res)  # the call has returned: its pages are no longer ours
                for i, good, (bufs, direct) in zip(group, ok, plan):
                    if not good:
                        self.counters.add("miss_stale")
                        continue
                    h = self._verified(tier, refs[i], ns, int(ik[i]), ds[i], bufs, views[i][0], sizes[i],  # type: ignore[arg-type]
                                       direct)
                    res[pos[i]] = _MISS if h is None else _HIT
            finally:
                gate.leave(c)
            if _HIT in res:
                cd.ok()
            return res

        for c, res in enumerate(self._map_until(read, list(range(len(tasks))), t_end, gate, cd, "read",
                                                where=[0] * len(tasks), pages=lambda c: len(tasks[c]),
                                                ikeys=np.array([ik[t[0]] for t in tasks], np.int64))):
            for i, o in zip(tasks[c], res if isinstance(res, list) else [_LATE] * len(tasks[c])):
                out[i] = o
        return out

    def _fits(self, ref: Ref, n: int) -> bool:
        """Whether a stored record can be that of an n-byte page: none stores more than its raw page (a
        larger one is foreign or crafted: read nothing, allocate nothing)."""
        if HEADER_SIZE <= ref.length <= HEADER_SIZE + n + codec.SEAL_OVERHEAD:
            return True
        self.counters.add("miss_size")
        return False

    @staticmethod
    def _read_bufs(ref: Ref, dst: list[np.ndarray], n: int, private: bool,
                   alloc: Callable[[int], np.ndarray] | None = None) -> tuple[list[memoryview], bool]:
        """(buffers to read a record into, direct): a raw record straight into the page's pieces (n
        bytes) after a header buffer (no extra copy), anything else (or `private`) into its own buffer
        (`alloc(n)`, default a new one; no zero-fill pass)."""
        if not private and ref.length == HEADER_SIZE + n:
            return [memoryview(bytearray(HEADER_SIZE)), *(memoryview(p) for p in dst)], True
        if not private and n and ref.length == HEADER_SIZE + n + codec.SEAL_OVERHEAD:
            # only a sealed raw page has this length: its ciphertext straight into the page (opened in
            # place), header + nonce and the tag into buffers of their own
            return [memoryview(bytearray(HEADER_SIZE + codec.NONCE_BYTES)), *(memoryview(p) for p in dst),
                    memoryview(bytearray(codec.TAG_BYTES))], True
        return [memoryview(np.empty(ref.length, dtype=np.uint8) if alloc is None else alloc(ref.length))], False

    def _verified(self, tier: Tier, ref: Ref, ns: bytes, ikey: int, digest: bytes, bufs: list[memoryview],
                  dst: list[np.ndarray], n: int, direct: bool) -> codec.Header | None:
        """Check a record read into bufs (header, identity, size, payload checksum) and, unless it was
        read straight into dst, decode it into dst. None on a miss: counted by cause, and a bad record
        (not an intact one of another key or size) is dropped from the index and quarantined."""
        try:
            h = codec.unpack_header(bufs[0])
            payload = (([bufs[0][HEADER_SIZE:], *bufs[1:]] if h.sealed else bufs[1:]) if direct
                       else bufs[0][HEADER_SIZE:])
            if h.raw_len != n:
                raise RecordError("size", f"stored page is {h.raw_len} bytes, buffer is {n}")
            # a sealed record's tag (checked when it is opened) covers every byte the checksum would
            codec.verify_record(h, payload, digest=digest, namespace=ns, checksum=not h.sealed)
            if direct:  # read straight into dst: a sealed raw page is opened in place, a plaintext
                self.sealer.open_in_place(h, payload)  # one is served only if plaintext may be
            else:
                self.sealer.decode_into(h, payload, dst)
        except RecordError as e:
            self.counters.add(f"miss_{e.reason}")
            # intact records of other keys, and ones another process may open (a key this one does not
            # hold, plaintext while sealed ones are required: gc drops those), are left alone
            if e.reason not in ("foreign", "size", *OPENABLE_REASONS):
                tier.forget(ikey, ref, e.reason)
                self.counters.add("quarantined")
                log.warning("lifeboat: dropped a bad record on %s (%s)", tier.name, e)
            return None
        return h

    def _read_one(self, ns: bytes, ikey: int, digest: bytes, dst: list[np.ndarray], affinity: int = 0,
                  slot: tuple[Gate, int, list[int]] | None = None, first: int = 0) -> bool:
        """One page over the tiers from level `first` on (the first hit is promoted to tier 0)."""
        skipped = False
        for level, (tier, cd) in enumerate(zip(self.tiers, self.read_cooldowns)):
            if level < first:
                continue
            if cd.active():
                self.counters.add("tier_skipped_cooldown")
                skipped = True
                continue
            ref = tier.locate(ikey)
            if ref is None:
                continue
            if slot is not None:
                if slot[0].closed:
                    return False  # the call has returned: no more I/O for it
                slot[2][slot[1]] = level
            try:
                raw = self._read_record(tier, ref, ns, ikey, digest, dst, want_record=level > 0,
                                        gate=slot[:2] if slot is not None else None)
            except OSError as e:
                self.counters.add("read_errors")
                cd.fail("read", e)
                continue
            if raw is None:
                continue
            cd.ok()
            if level > 0:
                self.counters.add(f"hits_tier{level}")
                self._promote(ikey, digest, raw, affinity)
            return True
        if skipped:
            self.counters.add("miss_cooldown")
        return False

    def _read_record(self, tier: Tier, ref: Ref, ns: bytes, ikey: int, digest: bytes,
                     dst: list[np.ndarray], want_record: bool,
                     gate: tuple[Gate, int] | None = None) -> bytes | memoryview | None:
        """Read, verify, decode into dst (the page's pieces). Returns the record's bytes (for
        promotion) or None on a miss.

        With a gate, dst is touched only inside it: a read that outlives the call's deadline must
        not write into a buffer SGLang has reused. A shared tier (NFS, S3) reads into a private
        buffer first; a local drive keeps the zero-copy read (a hung local drive is not covered).
        """
        n = sum(p.nbytes for p in dst)
        if not self._fits(ref, n):
            return None
        bufs, direct = self._read_bufs(ref, dst, n, private=gate is not None and tier.shared)
        if gate is not None and direct and not gate[0].enter(gate[1]):
            return None
        try:
            if not tier.read_into(ref, bufs):
                self.counters.add("miss_stale")
                return None
            if gate is not None and not direct and not gate[0].enter(gate[1]):
                return None  # the call has returned: dst is no longer ours
            h = self._verified(tier, ref, ns, ikey, digest, bufs, dst, n, direct)
        finally:
            if gate is not None:
                gate[0].leave(gate[1])
        if h is None:
            return None
        if direct and not h.sealed:
            return b"".join([bytes(bufs[0]), *(p.tobytes() for p in dst)]) if want_record else bufs[0]
        # promoted to a first tier that stores raw (built again from the page), or read in place from a
        # sealed record (its ciphertext was opened in the page): built again, sealed anew
        if want_record and (direct or not self.compress):
            header, parts, _ = self.sealer.build(dst if len(dst) > 1 else dst[0],
                                                 itemsize=codec.DTYPE_ITEMSIZE[codec.DTYPE_NAMES[h.dtype]],
                                                 dtype=h.dtype, digest=digest, namespace=ns, compress=self.compress)
            return b"".join([header, *parts])  # type: ignore[list-item]
        return bufs[0]

    def _promote(self, ikey: int, digest: bytes, record: memoryview, affinity: int = 0) -> None:
        """A hit from a lower tier is written to the first tier so the next read is local."""
        tier, cd = self.tiers[0], self.write_cooldowns[0]
        if cd.active():
            return
        try:
            tier.write(ikey, digest, [record], len(record), affinity)
            self.counters.add("promotions")
        except OSError as e:
            cd.fail("promote", e)

    # ------------------------------------------------------------------ housekeeping
    def _map(self, fn: Callable[[int], bool], items: Sequence[int] | range) -> list[bool]:
        items = list(items)
        if len(items) <= 1 or self._closed:
            return [fn(i) for i in items]
        futs = []
        try:
            for i in items:
                futs.append(self._pool.submit(fn, i))
        except RuntimeError:  # at interpreter exit the pool takes no new work: the rest runs inline
            return [f.result() for f in futs] + [fn(i) for i in items[len(futs):]]
        return [f.result() for f in futs]

    def _map_until(self, fn: Callable[[int], Any], items: list[int], t_end: float, gate: Gate,
                   cd: Cooldown | None, what: str, where: list[int] | None = None,
                   pages: Callable[[int], int] | None = None, ikeys: np.ndarray | None = None) -> list[Any]:
        """fn over items on the io pool, returning by t_end (the call's deadline): fn's results, False
        for an item not done by then (a miss / dropped write: counted, and its tier cools down).
        `pages(item)`: how many pages an item stands for (a run), for the counts."""
        if not items:
            return []
        if self._closed:
            return [fn(i) for i in items]
        futs, late = self._pool.run_until(fn, items, t_end, gate, min(DEADLINE_GRACE_S, self.deadline_s))
        out: list[bool] = []
        for f in futs:
            if not f.done() or f.cancelled():
                out.append(False)
                continue
            err = f.exception()
            if err is not None:
                raise err  # a bug, not storage trouble (that is caught inside fn)
            out.append(f.result())
        if late:
            self._overdue(what, [items[k] for k in late], cd, where, pages, ikeys)
        return out

    def _overdue(self, what: str, late: list[int], cd: Cooldown | None, where: list[int] | None,
                 pages: Callable[[int], int] | None = None, ikeys: np.ndarray | None = None) -> None:
        """Pages not done by the deadline: count them and cool down the tier they wait on."""
        err = TimeoutError(f"no answer within the {self.deadline_s:g} s deadline (engine.deadline_s)")
        if what == "write":
            self.counters.add("writes_dropped_deadline", sum(map(pages, late)) if pages else len(late))
            if cd is not None:
                cd.fail("write", err)
            self._hold(0, None)
            return
        self.counters.add("read_deadline_misses", sum(map(pages, late)) if pages else len(late))
        levels: dict[int, int] = {}
        for i in late:
            if where is not None and where[i] >= 0:
                levels.setdefault(where[i], i)
        for level, i in levels.items():
            self.read_cooldowns[level].fail("read", err)
            self._hold(level, int(ikeys[i]) if ikeys is not None else None)

    def _hold(self, level: int, ikey: int | None) -> None:
        """Skip a tier that missed a deadline until a background probe gets an answer from it."""
        tier = self.tiers[level]
        if not isinstance(tier, Probing) and ikey is None:
            return  # nothing to probe it with: the plain cooldown decides
        with self._probe_lock:
            if self._closed:
                return
            self._probes.setdefault(level, ikey)
            self.read_cooldowns[level].hold()
            self.write_cooldowns[level].hold()
            if self._prober is None or not self._prober.is_alive():
                self._prober = threading.Thread(target=self._probe_loop, name="lifeboat-probe", daemon=True)
                self._prober.start()

    def _probe_loop(self) -> None:
        while not self._closed:
            with self._probe_lock:
                todo = list(self._probes.items())
            if not todo:
                with self._probe_lock:
                    if not self._probes:
                        self._prober = None
                        return
            for level, ikey in todo:
                if self._probe(level, ikey):
                    with self._probe_lock:
                        self._probes.pop(level, None)
                    self.read_cooldowns[level].release()
                    self.write_cooldowns[level].release()
                    self.counters.add("tier_recovered")
                    log.warning("lifeboat: tier %s answers again", self.tiers[level].name)
            time.sleep(PROBE_INTERVAL_S)

    def _probe(self, level: int, ikey: int | None) -> bool:
        """One request to a held tier (it may block: this thread only). True when it answered."""
        tier = self.tiers[level]
        try:
            if isinstance(tier, Probing):
                tier.probe()
                return True
            ref = tier.locate(ikey) if ikey is not None else None
            if ref is not None:
                tier.read_into(ref, [memoryview(bytearray(ref.length))])
            return True
        except OSError:
            return False
        except Exception:  # a bug must not keep the tier held for good
            log.exception("lifeboat: probing %s failed", tier.name)
            return True

    def wait_rebuilt(self, timeout: float | None = None) -> bool:
        """Block until every tier's background index rebuild is done (tests, CLI)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self.tiers:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not t.wait_rebuilt(left):
                return False
        return True

    def stats(self) -> dict[str, Any]:
        c = self.counters.snapshot()
        raw, stored = c.get("bytes_written_raw", 0), c.get("bytes_written_stored", 0)
        return {
            "counters": c,
            "compression_ratio": (raw / stored) if stored else None,
            "copy_queue_bytes": self._copier.pending_bytes if self._copier is not None else 0,
            "io_threads": self._pool.threads, "io_threads_stuck": self._pool.stuck(),
            "tiers": [dict(t.stats(), reads_cooling_down=r.active(), writes_cooling_down=w.active())
                      for t, r, w in zip(self.tiers, self.read_cooldowns, self.write_cooldowns)],
        }

    def verify(self, fix: bool = False, progress: Callable[[int, int], None] | None = None) -> list[str]:
        """Check both ways, like diskcache's `check`: every indexed record is intact (index -> file),
        and every intact record on disk is indexed (file -> index, tiers with `audit`).

        With fix, bad records are quarantined and intact ones missing from the index are indexed.
        """
        problems: list[str] = []
        for tier in self.tiers:
            recs = list(tier.records())
            for n, (ikey, ref) in enumerate(recs, 1):
                rec = bytearray(ref.length)
                try:
                    ok = tier.read_into(ref, [memoryview(rec)])
                    if not ok:
                        raise RecordError("truncated", "record shorter than indexed")
                    h = self.sealer.check(rec)  # checksums, then: may it be served, does it open
                    if int.from_bytes(h.digest[:8], "little", signed=True) != ikey:
                        raise RecordError("foreign", "index key does not match the header's digest")
                    if h.record_len != ref.length:
                        raise RecordError("truncated", "length differs from the index")
                except (RecordError, OSError) as e:
                    where = tier.loc_name(ref)
                    problems.append(f"{tier.name}: {where}: {e}")
                    if fix and isinstance(e, RecordError) and e.reason not in OPENABLE_REASONS:
                        tier.forget(ikey, ref, getattr(e, "reason", "verify"))
                        self.counters.add("quarantined")
                if progress is not None:
                    progress(n, len(recs))
            if isinstance(tier, Auditing):
                problems.extend(tier.audit(fix))
        return problems

    def gc(self) -> int:
        return sum(t.gc() for t in self.tiers)

    def _headers(self, tier: Tier) -> Iterator[tuple[int, Ref, codec.Header | None]]:
        """(index key, place, parsed header or None when unreadable) of every indexed record of a tier:
        64 bytes read per record, for `stats` per key id and `drop_unreadable`."""
        for ikey, ref in list(tier.records()):
            buf = bytearray(HEADER_SIZE)
            try:
                ok = ref.length >= HEADER_SIZE and tier.read_into(
                    Ref(ref.part, type(ref.loc)(ref.loc.unit, ref.loc.offset, HEADER_SIZE)), [memoryview(buf)])
                yield ikey, ref, codec.unpack_header(buf) if ok else None
            except (OSError, RecordError):
                yield ikey, ref, None

    def pages_by_key_id(self) -> list[dict[str, int]]:
        """Per tier: indexed pages per sealing key id (hex), plaintext ones under "plaintext" (`lifeboat
        stats` with encryption on). Reads each record's header; changes nothing."""
        out = []
        for tier in self.tiers:
            counts: dict[str, int] = {}
            for _, _, h in self._headers(tier):
                name = "unreadable" if h is None else key_id_text(h.key_id) if h.sealed else "plaintext"
                counts[name] = counts.get(name, 0) + 1
            out.append(dict(sorted(counts.items())))
        return out

    def drop_unreadable(self) -> int:
        """Drop (quarantine) every record none of the configured keys opens: sealed with a key no
        longer configured (rotated out, shredded), or plaintext while sealed records are required.
        Their bytes leave at this gc's compaction. Only with encryption on and
        `encryption.gc_drops_unreadable` (the config must list every key in use in the store).
        Returns the number of records dropped."""
        enc = self.settings.encryption
        if not self.sealer.active or not enc.gc_drops_unreadable:
            return 0
        every = self.sealer.keyring.every  # type: ignore[union-attr]
        plain_ok = not self.sealer.require_sealed
        dropped = self.drop_records(lambda h: (UNKNOWN_KEY if h.sealed and h.key_id not in every else
                                               None if h.sealed or plain_ok else UNSEALED))
        if dropped:
            self.counters.add("gc_dropped_unreadable", dropped)
            log.warning("lifeboat: gc dropped %d record(s) no configured key opens", dropped)
        return dropped

    def drop_records(self, why: Callable[[codec.Header], str | None]) -> int:
        """Drop (quarantine: never served or rediscovered; bytes removed by gc) every indexed record
        whose header `why` gives a reason for. `lifeboat purge --key-id` (crypto-shredding) and gc use
        it. Returns the number dropped."""
        dropped = 0
        for tier in self.tiers:
            for ikey, ref, h in self._headers(tier):
                reason = None if h is None else why(h)
                if reason is not None:
                    tier.forget(ikey, ref, reason)
                    dropped += 1
        return dropped

    def flush(self) -> None:
        """Write out what is buffered: queued background copies first, then each tier."""
        if self._copier is not None and not self._copier.drain(FLUSH_COPY_TIMEOUT_S):
            log.warning("lifeboat: flush: background copies still queued after %.0f s", FLUSH_COPY_TIMEOUT_S)
        for t in self.tiers:
            try:
                t.flush()
            except OSError as e:
                log.warning("lifeboat: flush of %s failed: %s", t.name, e)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=True, timeout=self.deadline_s + DEADLINE_GRACE_S)
        if self._copier is not None:
            self._copier.close(CLOSE_COPY_TIMEOUT_S)
        for t in self.tiers:
            try:
                t.close()
            except OSError as e:
                log.warning("lifeboat: close of %s failed: %s", t.name, e)

    def __enter__(self) -> "ChunkStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _chunks(items: list[int], n: int) -> list[list[int]]:
    """items in at most n contiguous runs of near-equal length (none empty)."""
    k = min(n, len(items))
    if k <= 0:
        return []
    q, r = divmod(len(items), k)
    bounds = [c * q + min(c, r) for c in range(k + 1)]
    return [items[bounds[c]:bounds[c + 1]] for c in range(k)]
