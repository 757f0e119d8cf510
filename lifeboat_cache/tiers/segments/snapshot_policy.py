"""The index snapshot of a segment directory: loaded at open, saved at close and periodically.

A crash reopen loads the snapshot (tiers/segments/snapshot_file.py is its file format) and scans only what is
newer. Periodic snapshots are written by the index thread when sealed segments not in the last
snapshot hold SNAPSHOT_CHANGED_SHARE of the bytes it covered (and at least SNAPSHOT_MIN_SEGMENTS of
them), at most once per SNAPSHOT_INTERVAL_S per directory: a process skips its turn while the file
on disk is younger (another process wrote it). The module constants are read when a directory is
made (tests lower them); each directory's copies (`interval_s`, ...) may be changed afterwards.

A loaded snapshot is never trusted blindly: every segment's entries are checked against its trailer
before the trailers are indexed, and a disagreeing segment is rescanned.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable, Iterator

import numpy as np

from ...index import DEAD, SHARDS, Index
from ...metrics import Counters
from ...records import framing
from . import snapshot_file as snap
from .format import read_table
from .quarantine import Quarantine
from .rebuild import Scanner
from .snapshot_file import SNAPSHOT_NAME, entry_hash
from .units import Unit, UnitTable

log = logging.getLogger(__name__)

SNAPSHOT_INTERVAL_S = 60.0
SNAPSHOT_MIN_SEGMENTS = 4
SNAPSHOT_CHANGED_SHARE = 0.05
HASH_BATCH = 16  # trailers hashed in one vectorized pass by the snapshot check (~2 MB: stays in cache)


class Snapshots:
    """Load, check and save one directory's index snapshot (see the module docstring)."""

    def __init__(self, table: UnitTable, index: Index, counters: Counters, scanner: Scanner,
                 quarantine: Quarantine, *, file_mode: int, fsync: bool, read_only: bool,
                 closed: Callable[[], bool], log_once: Callable[..., bool]) -> None:
        self.table, self.index, self.counters = table, index, counters
        self.scanner, self.quarantine = scanner, quarantine
        self.path = table.path
        self.file_mode, self.fsync, self.read_only = file_mode, fsync, read_only
        self._closed, self._log_once = closed, log_once
        self.interval_s = SNAPSHOT_INTERVAL_S
        self.min_segments = SNAPSHOT_MIN_SEGMENTS
        self.changed_share = SNAPSHOT_CHANGED_SHARE
        self.covered: dict[str, int] = {}  # segment name -> bytes, of the last snapshot written or loaded
        self.tried = time.monotonic()  # when a periodic save was last considered
        self._save_lock = threading.Lock()  # close()'s save waits for a periodic one: the last view wins

    # ------------------------------------------------------------------ save
    def save(self) -> bool:
        """Persist the index shard by shard (temp file, fsync where segments are fsync'd, rename) so
        the next open has its first hits at once. Only entries of sealed, fully scanned segments go
        in; memory: one shard.

        Returns whether it was written; a failure (full disk) is logged once and only costs a slower
        next open."""
        if self.read_only:
            return False
        with self._save_lock:
            return self._save()

    def _save(self) -> bool:
        t0 = time.perf_counter()
        units = [snap.SnapshotUnit(u.name, u.id, u.scanned, True) for u in self.eligible_units()]
        ids = np.array(sorted(u.id for u in units), dtype=np.int64)
        eligible = np.zeros(int(ids[-1]) + 2 if len(ids) else 1, dtype=bool)
        eligible[ids] = True

        def shards() -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
            for sh, x, uids, offs, lens in self.index.export_shards():
                keep = eligible[np.minimum(uids, len(eligible) - 1)]
                yield (sh, x, uids, offs, lens) if keep.all() else (sh, x[keep], uids[keep], offs[keep], lens[keep])

        ok = False
        try:
            snap.save(self.path, units, shards(), self.file_mode, fsync=self.fsync)
            ok = True
        except OSError as e:
            self.counters.add("snapshot_save_failures")
            self._log_once("snapshot-save", "lifeboat: cannot save index snapshot in %s: %s (the next open "
                                            "scans more; serving goes on)", self.path, e)
        for name in snap.remove_stale(self.path):
            log.info("lifeboat: %s: removed %s (an old snapshot format or a crashed save)", self.path, name)
        if ok:
            self.covered = {u.name: u.scanned for u in units}
            self.counters.add("snapshot_saves")
            self.counters.set("snapshot_save_ms", int((time.perf_counter() - t0) * 1000))
        return ok

    def eligible_units(self) -> list[Unit]:
        """The units a snapshot may describe: sealed (none of our writers still appends), fully scanned."""
        with self.table.lock:
            return [u for u in self.table.live() if u.sealed and not u.own and u.scanned == u.size]

    def due(self) -> bool:
        """Enough sealed bytes outside the last snapshot: changed_share of what it covered, in at least
        min_segments segments."""
        covered = self.covered
        new = [u.size for u in self.eligible_units() if u.name not in covered]
        base = sum(covered.values())
        return len(new) >= self.min_segments and sum(new) >= self.changed_share * base

    def maybe_save(self) -> None:
        """Write a periodic snapshot from the index thread when one is due."""
        if self.read_only or self._closed():
            return
        now = time.monotonic()
        if now - self.tried < self.interval_s or not self.due():
            return
        self.tried = now
        try:  # another process wrote one lately: its turn (it covers the same sealed segments)
            age = time.time() - os.stat(self.path / SNAPSHOT_NAME).st_mtime
            if 0 <= age < self.interval_s:
                return
        except OSError:
            pass
        if self.save():
            log.info("lifeboat: %s: periodic index snapshot of %d segments in %d ms", self.path,
                     len(self.covered), self.counters["snapshot_save_ms"])

    # ------------------------------------------------------------------ load
    def _discard(self, why: object) -> None:
        self.counters.add("snapshot_discarded", 1)
        self._log_once("snapshot", "lifeboat: ignoring index snapshot in %s (%s); rescanning", self.path, why)

    def load(self) -> None:
        """Index the snapshot's entries of unchanged sealed segments shard by shard (each shard answers
        lookups as soon as it is in), then check every segment's entries against its trailer."""
        if not self.read_only:
            for name in snap.remove_stale(self.path):
                if name in snap.OLD_SNAPSHOT_NAMES:
                    self._discard(f"{name} is an older snapshot format; removed")
        try:
            reader, fd = snap.open_reader(self.path / SNAPSHOT_NAME)
        except FileNotFoundError:
            return
        except (snap.SnapshotError, OSError) as e:  # a bad snapshot is only a slower start
            self._discard(e)
            return
        try:
            self._load_shards(reader)
        finally:
            os.close(fd)

    def _load_shards(self, reader: snap.Reader) -> None:
        try:
            listing = self.scanner.list()
        except OSError as e:
            self._discard(e)
            return
        # position in reader.units -> the unit it names here (new id), 0: not usable (changed, unsealed)
        lut = np.zeros(len(reader.units) + 1, dtype=np.uint32)  # [-1]: an unlisted unit
        loaded: list[tuple[Unit, int]] = []
        with self.table.lock:
            for i, su in enumerate(reader.units):
                if not su.sealed or listing.get(su.name) != su.scanned or self.table.named(su.name) is not None:
                    continue  # unsealed or changed since: scanned afresh
                unit = self.table.add(su.name)
                unit.size = unit.scanned = su.scanned
                unit.sealed = True
                lut[i] = unit.id
                loaded.append((unit, i))
        quarantined = self.quarantine.offsets_in({u.name for u, _ in loaded})
        bad_offs = np.fromiter(quarantined, dtype=np.uint64)
        counts = np.zeros(len(reader.units), dtype=np.int64)
        sums = np.zeros(len(reader.units), dtype=np.uint64)
        dropped = 0
        t0 = time.perf_counter()
        try:
            for sh in range(SHARDS):
                x, uids, offs, lens = reader.shard(sh)
                if not len(x):
                    continue
                pos = reader.unit_pos(uids)
                new = lut[pos]
                ok = reader.entries_ok(pos, offs, lens) & (new != 0)
                if len(bad_offs):
                    for i in np.flatnonzero(ok & np.isin(offs, bad_offs)).tolist():
                        ok[i] = (reader.units[pos[i]].name, int(offs[i])) not in self.quarantine
                n_ok = int(ok.sum())
                dropped += len(x) - n_ok
                if n_ok < len(x):
                    new = np.where(ok, new, DEAD).astype(np.uint32)
                self.index.insert_sorted_shard(sh, x, new, offs, lens, total_hint=reader.total)
                # per unit, for the trailer check: entries and the sum of their hashes
                p, h = (pos, entry_hash(x, offs, lens)) if n_ok == len(x) else \
                    (pos[ok], entry_hash(x[ok], offs[ok], lens[ok]))
                counts += np.bincount(p, minlength=len(counts))
                np.add.at(sums, p, h)
        except (snap.SnapshotError, ValueError, OSError) as e:  # shards already in: forget them, scan all
            self.table.drop_many([u for u, _ in loaded])
            self._discard(e)
            return
        self.counters.add("snapshot_dropped_entries", dropped)
        # each bulk insert merges into every shard (cost ~ the index's size): the scan of the segments
        # newer than the snapshot goes in as one batch (up to the snapshot's size), not a doubling series
        self.scanner.batched = max(self.scanner.batched, reader.total - dropped)
        log.info("lifeboat: %s: loaded index snapshot with %d pages in %.0f ms", self.path,
                 reader.total - dropped, (time.perf_counter() - t0) * 1000)
        self._check(loaded, counts, sums)

    def _check(self, loaded: list[tuple[Unit, int]], counts: np.ndarray, sums: np.ndarray) -> None:
        """Drop every unit whose snapshot entries are not all in its trailer, then index the trailers.

        Same count: the sums of entry_hash must match (the same entries). Fewer (keys written again
        elsewhere, quarantined): each entry the index holds for the unit must be a trailer row. Bad
        units are all dropped before any trailer is indexed, so a wrong entry can never keep a right
        one out (insert-if-absent)."""
        tables: dict[int, np.ndarray] = {}
        bad: list[Unit] = []
        same: list[tuple[Unit, int, np.ndarray]] = []  # as many entries as trailer rows: hashed in batches

        def check_same() -> None:
            sums_ok = snap.table_hash_sums([t for _, _, t in same], sums[[i for _, i, _ in same]])
            bad.extend(u for (u, _, _), ok in zip(same, sums_ok) if not ok)
            same.clear()

        for unit, i in loaded:
            try:
                fd = self.table.acquire(unit)
            except OSError:
                bad.append(unit)
                continue
            try:
                table = read_table(fd, os.fstat(fd).st_size)
            except OSError:
                table = None
            finally:
                self.table.release(unit)
            n = int(counts[i])
            if table is not None:
                unit.framing = framing(len(table))
            if table is None or n > len(table):
                bad.append(unit)
            elif n == len(table):
                if n:
                    same.append((unit, i, table))
            else:
                if n:
                    found, u, o, ln = self.index.locate(table["key"])
                    match = found & (u == unit.id) & (o == table["offset"]) & (ln == table["length"])
                    if int(match.sum()) != n:
                        bad.append(unit)
                        continue
                tables[unit.id] = table
            if len(same) >= HASH_BATCH:
                check_same()
        check_same()
        self.scanner.flush_batch()
        if bad:
            self.counters.add("snapshot_mismatched_units", len(bad))
            self.index.drop_units(u.id for u in bad)
            for unit in bad:
                unit.sealed, unit.scanned, unit.walked = False, 0, -1  # the refresh scans it afresh
            self._log_once("snapshot-bad", "lifeboat: %s: the index snapshot disagreed with %d segment(s); "
                                           "rescanning them", self.path, len(bad))
        bad_ids = {u.id for u in bad}
        kept = [u for u, _ in loaded if u.id not in bad_ids]
        self.covered = {u.name: u.size for u in kept}
        self.counters.add("snapshot_segments", len(kept))
        self.counters.add("snapshot_pages", int(sum(int(counts[i]) for u, i in loaded if u.id not in bad_ids)))
        for unit, _ in loaded:
            if unit.id in tables:
                self.scanner.index_entries(unit, tables[unit.id]["key"], tables[unit.id]["offset"],
                                           tables[unit.id]["length"])
