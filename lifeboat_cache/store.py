"""ChunkStore: batch put / get / exists of pages over the configured tiers.

The store coordinates; tiers store record bytes, the codec encodes and checks them. Encoding,
writing, reading and decoding run on an io worker pool (`engine.io_workers`), so a 128-page call
from SGLang is processed in parallel (zstd and CRC-32 release the GIL). Storage trouble never
raises out of put / get_into / exists: it is a miss or a dropped write, counted by cause, logged
once per cooldown, and the failing tier is skipped for a cooldown that doubles while it keeps
failing. A record is verified (header, identity, payload checksum) before its bytes are trusted;
one that fails is dropped from the index and quarantined.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import numpy as np

from . import codec
from .codec import HEADER_SIZE, RecordError
from .config import Settings, TierSettings, load_settings
from .copier import DEFAULT_COPY_WORKERS, Copier
from .keys import digests
from .metrics import Counters
from .tiers import Ref, Tier, open_tier

log = logging.getLogger(__name__)

FLUSH_COPY_TIMEOUT_S = 60.0
CLOSE_COPY_TIMEOUT_S = 30.0


class Cooldown:
    """Skip a failing tier for base, 2*base, 4*base ... up to max_s seconds; reset on success."""

    def __init__(self, name: str, base_s: float, max_s: float) -> None:
        self.name, self.base_s, self.max_s = name, base_s, max_s
        self._lock = threading.Lock()
        self._until = 0.0
        self._streak = 0

    def active(self) -> bool:
        return time.monotonic() < self._until

    def fail(self, what: str, err: BaseException) -> None:
        with self._lock:
            if self.active():
                return  # already cooling down: one log line per cooldown
            delay = min(self.max_s, self.base_s * (2 ** self._streak))
            self._streak += 1
            self._until = time.monotonic() + delay
        log.warning("lifeboat: %s failed on tier %s (%s); skipping the tier for %.1f s",
                    what, self.name, err, delay)

    def ok(self) -> None:
        if self._streak and not self.active():
            with self._lock:
                self._streak = 0


def _view(buf: object) -> tuple[list[np.ndarray], int, int]:
    """(flat uint8 pieces, itemsize, dtype code) of a page, no copy.

    A page is one C-contiguous buffer, or a list/tuple of them that make the page in order
    (scatter-gather: an SGLang layer_first KV page is 2*L separate blocks of the host pool).
    """
    bufs = list(buf) if isinstance(buf, (list, tuple)) else [buf]
    if not bufs:
        raise ValueError("a page needs at least one buffer")
    codes = {codec.dtype_code(b) if isinstance(b, np.ndarray) else codec.DTYPE_CODES["u1"] for b in bufs}
    code = codes.pop() if len(codes) == 1 else codec.DTYPE_CODES["u1"]
    return [codec.as_bytes_view(b) for b in bufs], codec.DTYPE_ITEMSIZE[codec.DTYPE_NAMES[code]], code


class ChunkStore:
    """Pages in, pages out, under (namespace, key). See docs/architecture.md for the contract."""

    def __init__(self, settings: Settings, tiers: Sequence[Tier]) -> None:
        if not tiers:
            raise ValueError("a ChunkStore needs at least one tier")
        self.settings = settings
        self.tiers = list(tiers)
        eng = settings.engine
        self.compress = eng.compression == "zstd"
        self.trace = eng.trace
        self.counters = Counters()
        # reads and writes cool down separately: a full disk stops writes, not reads
        self.read_cooldowns = [self._cooldown(t, ts, "read") for t, ts in zip(self.tiers, self._tier_settings())]
        self.write_cooldowns = [self._cooldown(t, ts, "write") for t, ts in zip(self.tiers, self._tier_settings())]
        self._pool = ThreadPoolExecutor(max_workers=eng.io_workers, thread_name_prefix="lifeboat-io")
        self._closed = False
        # the drive-choice rule of the first multi-drive tier: a dialog's first N pages pick its drive
        self.affinity_chunks = next((ts.affinity_chunks for ts in settings.storage if len(ts.paths) > 1), 1)
        # a single tier needs no copy, and so pays nothing for it
        self._copier = Copier(self.tiers, self.write_cooldowns, self.counters, max_bytes=eng.copy_queue_bytes,
                              workers=min(DEFAULT_COPY_WORKERS, eng.io_workers)) if len(self.tiers) > 1 else None

    def _tier_settings(self) -> list[TierSettings]:
        given = list(self.settings.storage)
        return given + [TierSettings(type="local")] * (len(self.tiers) - len(given))

    def _cooldown(self, tier: Tier, ts: TierSettings, what: str) -> Cooldown:
        eng = self.settings.engine
        base = ts.failure_cooldown_s if ts.failure_cooldown_s is not None else eng.failure_cooldown_s
        top = ts.failure_cooldown_max_s if ts.failure_cooldown_max_s is not None else eng.failure_cooldown_max_s
        return Cooldown(f"{tier.name} ({what})", base, top)

    @classmethod
    def open(cls, settings: Settings | None = None, *, background: bool = True, read_only: bool = False,
             evict: bool = True) -> "ChunkStore":
        """Open every configured tier; the index rebuild runs in the background unless told not to.

        `read_only`: create, change and delete no file (no eviction, no quarantine writes, no missing
        directory created): for `lifeboat stats` / `verify`. `evict=False`: files may change (quarantine)
        but nothing is evicted (`verify --fix`). Only `gc` and serving processes evict.
        """
        settings = settings or load_settings()
        tiers: list[Tier] = []
        try:
            for ts in settings.storage:
                tiers.append(open_tier(ts, background=background, io_workers=settings.engine.io_workers,
                                       read_only=read_only, evict=evict))
        except BaseException:
            for t in tiers:
                t.close()
            raise
        store = cls(settings, tiers)
        log.info("lifeboat: store open (%s): %s", settings.source, ", ".join(t.name for t in tiers))
        return store

    # ------------------------------------------------------------------ lookups
    def contains(self, ns: bytes, keys: Sequence[str | bytes]) -> list[bool]:
        """Per-key presence in any tier that is not cooling down. Index only, no I/O."""
        _, ik = digests(ns, keys)
        hit = np.zeros(len(ik), dtype=bool)
        for tier, cd in zip(self.tiers, self.read_cooldowns):
            if cd.active():
                continue
            miss = ~hit
            if not miss.any():
                break
            hit[miss] = tier.contains(ik[miss])
        return hit.tolist()

    def exists(self, ns: bytes, keys: Sequence[str | bytes]) -> int:
        """How many keys, from the first, are stored (SGLang's batch_exists contract)."""
        hits = self.contains(ns, keys)
        n = hits.index(False) if False in hits else len(hits)
        if self.trace:
            log.info("lifeboat trace: exists %d keys -> %d leading hits", len(keys), n)
        return n

    # ------------------------------------------------------------------ writes
    def affinity_of(self, ns: bytes, dialog_keys: Sequence[str | bytes]) -> int:
        """The drive-choice value of a dialog, from its first `affinity_chunks` page keys.

        Pass it as `affinity=` to every `put` / `get_into` of that dialog (the keys of its first
        pages, not of the batch), so all its pages sit on one drive of a multi-drive tier.
        """
        ds, _ = digests(ns, list(dialog_keys[: self.affinity_chunks]))
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
        ds, ik = digests(ns, keys)
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

        def one(i: int) -> bool:
            pieces, itemsize, dt = views[i]
            try:
                header, parts, length = codec.build_record(
                    pieces if len(pieces) > 1 else pieces[0], itemsize=itemsize, dtype=dt, digest=ds[i],
                    namespace=ns, compress=self.compress)
                if redirect:  # not stored yet, so False; the copier writes it to the lower tiers
                    self.counters.add("writes_redirected")
                    self._copier.offer(int(ik[i]), ds[i], [header, *parts], length, affinity)  # type: ignore[union-attr]
                    return False
                tier.write(int(ik[i]), ds[i], [header, *parts], length, affinity)
            except OSError as e:
                self.counters.add("write_errors")
                cd.fail("write", e)
                return False
            self.counters.add("pages_written")
            self.counters.add("bytes_written_raw", sum(p.nbytes for p in pieces))
            self.counters.add("bytes_written_stored", length)
            if self._copier is not None:
                self._copier.offer(int(ik[i]), ds[i], [header, *parts], length, affinity)
            return True

        for i, ok in zip(todo, self._map(one, todo)):
            results[i] = ok
        if todo and all(results[i] for i in todo):
            cd.ok()
        if self.trace:
            log.info("lifeboat trace: put %d pages, %d new, %d ok in %.2f ms", len(keys), len(todo),
                     sum(results), (time.perf_counter() - t0) * 1e3)
        return results

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
        ds, ik = digests(ns, keys)
        views = [_view(b) for b in buffers]
        if not all(p.flags.writeable for pieces, _, _ in views for p in pieces):
            raise ValueError("get_into: destination buffers must be writable")

        if affinity is None:
            affinity = self._affinity(ds)

        def one(i: int) -> bool:
            return self._read_one(ns, int(ik[i]), ds[i], views[i][0], affinity)

        results = list(self._map(one, range(len(keys))))
        n_ok = sum(results)
        self.counters.add("pages_read", n_ok)
        self.counters.add("read_misses", len(keys) - n_ok)
        if self.trace:
            log.info("lifeboat trace: get %d pages, %d hits in %.2f ms", len(keys), n_ok,
                     (time.perf_counter() - t0) * 1e3)
        return results

    def _read_one(self, ns: bytes, ikey: int, digest: bytes, dst: list[np.ndarray], affinity: int = 0) -> bool:
        for level, (tier, cd) in enumerate(zip(self.tiers, self.read_cooldowns)):
            if cd.active():
                self.counters.add("tier_skipped_cooldown")
                continue
            ref = tier.locate(ikey)
            if ref is None:
                continue
            try:
                raw = self._read_record(tier, ref, ns, ikey, digest, dst, want_record=level > 0)
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
        return False

    def _read_record(self, tier: Tier, ref: Ref, ns: bytes, ikey: int, digest: bytes,
                     dst: list[np.ndarray], want_record: bool) -> bytes | memoryview | None:
        """Read, verify, decode into dst (the page's pieces). Returns the record's bytes (for
        promotion) or None on a miss."""
        n = sum(p.nbytes for p in dst)
        direct = ref.length == HEADER_SIZE + n
        if direct:  # raw record: the payload lands in the caller's buffers with no extra copy
            hdr = bytearray(HEADER_SIZE)
            bufs = [memoryview(hdr), *(memoryview(p) for p in dst)]
        else:
            bufs = [memoryview(np.empty(ref.length, dtype=np.uint8))]  # no zero-fill pass
        if not tier.read_into(ref, bufs):
            self.counters.add("miss_stale")
            return None
        try:
            h = codec.unpack_header(bufs[0])
            payload = bufs[1:] if direct else bufs[0][HEADER_SIZE:]
            if h.raw_len != n:
                raise RecordError("size", f"stored page is {h.raw_len} bytes, buffer is {n}")
            codec.verify_record(h, payload, digest=digest, namespace=ns)
            if not direct:
                plane_size = codec.DTYPE_ITEMSIZE[codec.DTYPE_NAMES[h.dtype]]
                codec.decode_into(h.codec, payload, dst, plane_size)
        except RecordError as e:
            self.counters.add(f"miss_{e.reason}")
            if e.reason not in ("foreign", "size"):  # intact records of other keys are left alone
                tier.forget(ikey, ref, e.reason)
                log.warning("lifeboat: dropped a bad record on %s (%s)", tier.name, e)
            return None
        if direct:
            return b"".join([bytes(hdr), *(p.tobytes() for p in dst)]) if want_record else hdr
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
        return list(self._pool.map(fn, items))

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
                    h = codec.verify_record(rec, memoryview(rec)[HEADER_SIZE:])
                    if int.from_bytes(h.digest[:8], "little", signed=True) != ikey:
                        raise RecordError("foreign", "index key does not match the header's digest")
                    if h.record_len != ref.length:
                        raise RecordError("truncated", "length differs from the index")
                except (RecordError, OSError) as e:
                    where = getattr(tier, "loc_name", lambda r: repr(r))(ref)
                    problems.append(f"{tier.name}: {where}: {e}")
                    if fix and isinstance(e, RecordError):
                        tier.forget(ikey, ref, getattr(e, "reason", "verify"))
                if progress is not None:
                    progress(n, len(recs))
            audit = getattr(tier, "audit", None)
            if audit is not None:
                problems.extend(audit(fix))
        return problems

    def gc(self) -> int:
        return sum(t.gc() for t in self.tiers)

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
        self._pool.shutdown(wait=True)
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
