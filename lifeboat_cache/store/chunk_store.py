"""ChunkStore: batch put / get / count_leading_hits of pages over the configured tiers.

The store coordinates; tiers store record bytes, the codec encodes and checks them. Encoding,
writing, reading and decoding run on io worker threads (`engine.io_workers`), so a 128-page call
from SGLang is processed in parallel (zstd and file I/O release the GIL). Storage trouble never
raises out of put / get_into / count_leading_hits: it is a miss or a dropped write, counted by cause, logged
once per cooldown, and the failing tier is skipped for a cooldown that doubles while it keeps
failing. A record is verified (header, identity, payload checksum) before its bytes are trusted;
one that fails is dropped from the index and quarantined. Records are built and opened by the
store's `Sealer` (records/sealing.py): sealed with AES-256-GCM when `encryption:` is on, plaintext otherwise;
a record it will not serve (plaintext where sealed ones are required, a key it does not hold, a tag
that does not verify) is a miss counted under its own reason.

This module is the facade; the jobs behind it each have a module of their own (the folder's
docstring lists them).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from ..config import Settings, TierSettings, load_settings
from ..cooldown import Cooldown
from ..metrics import Counters
from ..records import FINGERPRINT_BYTES, UNKNOWN_KEY, UNSEALED, DigestCache, Header, Sealer, sealer_for
from ..tiers import Auditing, Tier, open_tier
from ..tracing import trace_store
from . import maint
from .calls import IoCalls
from .context import StoreContext
from .copier import DEFAULT_COPY_WORKERS, Copier
from .namespace_names import NamespaceNames, read_names
from .pages import page_view, writable
from .read import ReadPath
from .refused import Refused, audit_keys
from .seal_marks import check_seal_marks
from .write import WritePath

log = logging.getLogger(__name__)

__all__ = ["CLOSE_COPY_TIMEOUT_S", "FLUSH_COPY_TIMEOUT_S", "ChunkStore", "compresses"]

FLUSH_COPY_TIMEOUT_S = 60.0
CLOSE_COPY_TIMEOUT_S = 30.0


def compresses(ts: TierSettings, engine_compression: str) -> bool:
    """Whether a tier stores pages compressed: its own `compression:`, else the engine's, else
    (`auto`) the rule: a local drive stores raw (zstd costs more CPU per byte than an NVMe write or
    read saves, and raw pages read straight into SGLang's host pool), nfs and s3 store compressed (the
    network and the remote capacity are what is scarce there; ~1.45x smaller on real bf16 KV)."""
    choice = ts.compression or engine_compression
    if choice == "auto":
        return ts.type in ("nfs", "s3")
    return choice == "zstd"


def check_namespace(ns: object, call: str) -> None:
    """A namespace is a `namespace_fingerprint(...)` (16 bytes): every record header holds exactly 16,
    so any other value was acknowledged by `put` yet could never be read back (a caller bug: raise)."""
    if not isinstance(ns, bytes) or len(ns) != FINGERPRINT_BYTES:
        got = f"{type(ns).__name__} of {len(ns)} bytes" if isinstance(ns, (bytes, bytearray)) else type(ns).__name__
        raise ValueError(f"{call}: the namespace must be the {FINGERPRINT_BYTES}-byte value of "
                         f"namespace_fingerprint(model=..., ...), got a {got}")


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
        self.names = NamespaceNames(self.tiers, self.counters)
        # reads and writes cool down separately: a full disk stops writes, not reads
        self.read_cooldowns = [self._cooldown(t, ts, "read") for t, ts in zip(self.tiers, self._tier_settings())]
        self.write_cooldowns = [self._cooldown(t, ts, "write") for t, ts in zip(self.tiers, self._tier_settings())]
        self.deadline_s = eng.deadline_s
        # the io pool, the deadline of every call and the hold / probe of hung tiers
        self.io = IoCalls(self.tiers, self.read_cooldowns, self.write_cooldowns, self.counters,
                          io_workers=eng.io_workers, deadline_s=eng.deadline_s, policy=eng.io_scheduling)
        # the drive-choice rule of the first multi-drive tier: a dialog's first N pages pick its drive
        self.affinity_chunks = next((ts.affinity_chunks for ts in settings.storage if len(ts.paths) > 1), 1)
        # a single tier needs no copy, and so pays nothing for it
        self.copier = Copier(self.tiers, self.write_cooldowns, self.counters, max_bytes=eng.copy_queue_bytes,
                             workers=min(DEFAULT_COPY_WORKERS, eng.io_workers), policy=eng.io_scheduling,
                             recode=self._recode if not self.compress and any(self.tier_compress[1:]) else None
                             ) if len(self.tiers) > 1 else None
        # pages a tier holds that this store will not serve (a key it does not hold): never "present"
        self.refused = Refused(len(self.tiers))
        self.key_audit: threading.Thread | None = None  # fills it from the local tiers' headers (open)
        ctx = StoreContext(self.tiers, self.read_cooldowns, self.write_cooldowns, self.counters, self.sealer,
                           self.io, self.compress, self.copier, self.refused)
        self.writes = WritePath(ctx)
        self.reads = ReadPath(ctx)
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
        A store that may write pages writes its seal mark into each tier, and without a key refuses
        (ConfigError) a tier marked sealed (store/seal_marks.py).
        """
        settings = settings or load_settings()
        # key file trouble is a ConfigError before any tier is opened
        sealer = sealer_for(settings.encryption, settings.key_namespace, seal=seal)
        tiers: list[Tier] = []
        try:  # with a key, a page met twice by a rebuild keeps the copy that opens (tiers.settle_twins)
            for ts in settings.storage:
                tiers.append(open_tier(ts, background=background, io_workers=settings.engine.io_workers,
                                       deadline_s=settings.engine.deadline_s, read_only=read_only,
                                       evict=evict, rank=sealer.rank if sealer.active else None))
            # a sealed store stays sealed: this store's mark written, or a keyless writer refused
            check_seal_marks(tiers, sealer, writes=seal and not read_only)
        except BaseException:
            for t in tiers:
                t.close()
            raise
        store = cls(settings, tiers, sealer)
        if sealer.active and seal and not read_only:  # pages of keys it does not hold: not "present"
            store.key_audit = threading.Thread(target=audit_keys, name="lifeboat-key-audit", daemon=True,
                                               args=(store.tiers, sealer, store.refused, lambda: store.io.closed))
            store.key_audit.start()
        log.info("lifeboat: store open (%s): %s", settings.source, ", ".join(t.name for t in tiers))
        return store

    # ------------------------------------------------------------------ lookups
    def contains(self, ns: bytes, keys: Sequence[str | bytes]) -> list[bool]:
        """Per-key presence in any tier that is not cooling down, leaving out pages a read found this
        store cannot open (a key it does not hold: store/refused.py). Index only, no I/O."""
        check_namespace(ns, "contains")
        return self._present(self._digests.index_keys(ns, keys)).tolist()

    def _present(self, ik: np.ndarray) -> np.ndarray:
        """`contains` of index keys as a bool array (what `count_leading_hits` reduces without a Python list)."""
        hit = np.zeros(len(ik), dtype=bool)
        asked = False
        for level, (tier, cd) in enumerate(zip(self.tiers, self.read_cooldowns)):
            if cd.active():
                continue
            if not asked:  # the first tier answers for every key: no mask, no gather
                hit[:] = tier.contains(ik)
                refused = self.refused.mask(level, ik)  # None (no cost) unless a page here is not ours to open
                if refused is not None:
                    hit &= ~refused
                asked = True
                continue
            miss = ~hit
            if not miss.any():
                break
            found = tier.contains(ik[miss])
            refused = self.refused.mask(level, ik[miss])
            hit[miss] = found if refused is None else found & ~refused
        return hit

    def count_leading_hits(self, ns: bytes, keys: Sequence[str | bytes]) -> int:
        """How many keys, from the first, are stored (SGLang's batch_exists contract).

        Those pages are what the caller reads next (SGLang prefetches exactly them), so each tier holding
        them counts a use now: a full store whose writers evict between this answer and the read keeps
        them (retention), instead of answering yes and then missing (SGLang's `storage_transfer`)."""
        t0 = time.perf_counter()
        check_namespace(ns, "count_leading_hits")
        ik = self._digests.index_keys(ns, keys)
        hit = self._present(ik)
        n = int(hit.argmin()) if len(hit) else 0  # the first miss; 0 too when every key hits
        if n == 0 and len(hit) and hit[0]:
            n = len(hit)
        if n:
            for tier, cd in zip(self.tiers, self.read_cooldowns):
                if not cd.active():
                    tier.touch(ik[:n])
        self.counters.add_many({"lookup_keys": len(keys), "lookup_hits": n},
                               observe=("exists", time.perf_counter() - t0))
        return n

    # ------------------------------------------------------------------ writes
    def affinity_of(self, ns: bytes, dialog_keys: Sequence[str | bytes]) -> int:
        """The drive-choice value of a dialog, from its first `affinity_chunks` page keys.

        Pass it as `affinity=` to every `put` / `get_into` of that dialog (the keys of its first
        pages, not of the batch), so all its pages sit on one drive of a multi-drive tier.
        """
        check_namespace(ns, "affinity_of")
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
        mismatch, non-contiguous buffers, a namespace that is not a namespace_fingerprint).
        """
        check_namespace(ns, "put")
        self.names.note(ns)  # its model for `lifeboat ls` / `purge --model`
        if len(keys) != len(buffers):
            raise ValueError(f"put: {len(keys)} keys but {len(buffers)} buffers")
        t0 = time.perf_counter()
        ds, ik = self._digests(ns, keys)
        views = [page_view(b) for b in buffers]
        return self.writes.put(ns, ds, ik, views, self._affinity(ds) if affinity is None else affinity, t0)

    # ------------------------------------------------------------------ reads
    def get_into(self, ns: bytes, keys: Sequence[str | bytes], buffers: Sequence[object],
                 *, affinity: int | None = None) -> list[bool]:
        """Read pages straight into the given writable buffers; True per verified page.

        On False the buffer's content is unspecified: never use a page whose result is False.
        A page found on a lower tier is promoted to the first one, on the drive `affinity` picks
        (default as in `put`).
        """
        check_namespace(ns, "get_into")
        if len(keys) != len(buffers):
            raise ValueError(f"get_into: {len(keys)} keys but {len(buffers)} buffers")
        t0 = time.perf_counter()
        ds, ik = self._digests(ns, keys)
        views = [page_view(b) for b in buffers]
        if not all(writable(b, v) for b, v in zip(buffers, views)):
            raise ValueError("get_into: destination buffers must be writable")
        return self.reads.get(ns, ds, ik, views, self._affinity(ds) if affinity is None else affinity, t0)

    # ------------------------------------------------------------------ housekeeping
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
            "copy_queue_bytes": self.copier.pending_bytes if self.copier is not None else 0,
            "io_threads": self.io.pool.threads, "io_threads_stuck": self.io.pool.stuck(),
            "gc_paused_s": round(self.io.gc_pauses.total, 3),  # this process's, not counted against deadlines
            "tiers": [dict(t.stats(), reads_cooling_down=r.active(), writes_cooling_down=w.active())
                      for t, r, w in zip(self.tiers, self.read_cooldowns, self.write_cooldowns)],
        }

    def verify(self, fix: bool = False, progress: Callable[[int, int], None] | None = None) -> list[str]:
        """Check both ways, like diskcache's `check`: every indexed record is intact (index -> file),
        and every intact record on disk is indexed (file -> index, tiers with `audit`).

        With fix, bad records are quarantined and intact ones missing from the index are indexed.
        """
        return maint.verify_tiers(self.tiers, self.sealer, self.counters, fix, progress)

    def gc(self) -> int:
        return sum(t.gc() for t in self.tiers)

    def pages_by_key_id(self) -> list[dict[str, int]]:
        """Per tier: indexed pages per sealing key id (hex), plaintext ones under "plaintext" (`lifeboat
        stats` with encryption on). Reads each record's header; changes nothing."""
        return maint.pages_by_key_id(self.tiers)

    def pages_by_namespace(self) -> dict[str, dict[str, Any]]:
        """Namespace (hex) -> pages present now, their stored bytes and pages per tier (`lifeboat ls`).
        Reads each record's header; changes nothing."""
        return maint.pages_by_namespace(self.tiers)

    def namespace_names(self) -> dict[str, dict[str, str]]:
        """Namespace (hex) -> labels (model, ...) that processes writing through the Python API left in
        the store (store/namespace_names.py); serving processes name theirs in their stats files."""
        return read_names(self.tiers)

    def count_records(self, match: Callable[[Header, str], bool]) -> list[int]:
        """Per tier: indexed pages whose header and unit name `match` accepts (`lifeboat purge`)."""
        return maint.count_records(self.tiers, match)

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
            for tier in self.tiers:  # a dropped record's twin that opens is indexed again, so compaction
                if isinstance(tier, Auditing):  # (which keeps indexed records only) never removes it
                    tier.audit(fix=True)
        return dropped

    def drop_records(self, why: Callable[[Header], str | None]) -> int:
        """Drop (quarantine: never served or rediscovered; bytes removed by gc) every indexed record
        whose header `why` gives a reason for. `lifeboat purge --key-id` (crypto-shredding) and gc use
        it. Returns the number dropped."""
        return maint.drop_records(self.tiers, why)

    def flush(self) -> None:
        """Write out what is buffered: queued background copies first, then each tier."""
        if self.copier is not None and not self.copier.drain(FLUSH_COPY_TIMEOUT_S):
            log.warning("lifeboat: flush: background copies still queued after %.0f s", FLUSH_COPY_TIMEOUT_S)
        for t in self.tiers:
            try:
                t.flush()
            except OSError as e:
                log.warning("lifeboat: flush of %s failed: %s", t.name, e)

    def close(self, copy_timeout_s: float | None = None) -> None:
        """Stop the io threads, finish queued background copies (up to `copy_timeout_s`, default
        CLOSE_COPY_TIMEOUT_S; the rest are dropped and counted), close every tier (open segments sealed,
        index snapshots saved)."""
        if self.io.closed:
            return
        self.io.close()
        self.names.join(timeout=1)  # best effort: a hung tier must not hold the close
        if self.key_audit is not None:
            self.key_audit.join(timeout=5)  # it stops at its next record once io is closed
        if self.copier is not None:
            self.copier.close(CLOSE_COPY_TIMEOUT_S if copy_timeout_s is None else copy_timeout_s)
        for t in self.tiers:
            try:
                t.close()
            except OSError as e:
                log.warning("lifeboat: close of %s failed: %s", t.name, e)

    def __enter__(self) -> "ChunkStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

