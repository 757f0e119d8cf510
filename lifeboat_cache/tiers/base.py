"""The tier interface the store coordinates: an indexed place to append and read records.

A tier owns its index (a scan of its own layout rebuilds it) and knows nothing of codecs: it stores
the bytes of whole records and returns them. I/O failures raise OSError (the store turns them into
misses and a cooldown); a stale location returns False.

What a tier can do beyond the `Tier` core is declared, never probed for: the `batch_writes` flag, and
the capability mixins below (`Probing`, `Auditing`, `Describing`, `SegmentDirs`, `RecordRuns`,
`ObjectPurging`, `Marking`) that a tier lists among its bases. Callers check them with `isinstance`;
the conformance suite (testing/tiers.py) checks that a tier declares exactly the capabilities whose
methods it has. `settle_twins`, at the end, is the one rule for a key an index rebuild meets twice.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterator, Sequence

import numpy as np

from ..index import Index, Loc
from ..records import Record


@dataclass(frozen=True, slots=True)
class Ref:
    """A record's place in a tier: which part (drive / directory) and where in it."""

    part: int
    loc: Loc

    @property
    def length(self) -> int:
        return self.loc.length


class Tier(ABC):
    kind: ClassVar[str]
    shared: ClassVar[bool] = False  # several hosts may use it at once
    durable: ClassVar[bool] = True
    # the store hands a put() batch to write_many as one unit (S3: one object per batch), and the copier
    # passes write_many(..., background=True); a tier that sets it must accept that keyword
    batch_writes: ClassVar[bool] = False

    name: str

    @abstractmethod
    def contains(self, ikeys: np.ndarray) -> np.ndarray:
        """Per-key presence (bool array) from the in-memory index; never does I/O."""

    @abstractmethod
    def locate(self, ikey: int) -> Ref | None:
        """Where the record of ikey is, or None."""

    @abstractmethod
    def write(self, ikey: int, digest: bytes, bufs: Sequence[object], length: int, affinity: int = 0) -> Ref:
        """Append one record (its header and payload parts, `length` bytes) and index it."""

    @abstractmethod
    def read_into(self, ref: Ref, bufs: Sequence[memoryview]) -> bool:
        """Fill bufs with the record's bytes; False when the location went stale."""

    @abstractmethod
    def forget(self, ikey: int, ref: Ref, reason: str) -> None:
        """Drop a record that failed verification, so it is never served or rediscovered."""

    def touch(self, ikeys: np.ndarray) -> None:
        """Pages in use (written again while stored, or the leading hits of a batch_exists, read next): a use,
        as a read is, for retention. No I/O."""

    @abstractmethod
    def records(self) -> Iterator[tuple[int, Ref]]:
        """Every indexed record (for verify)."""

    @abstractmethod
    def close(self) -> None:
        """Flush, persist what speeds up the next open, release resources."""

    # ---- defaults built on the core
    def write_many(self, records: Sequence[tuple[int, bytes, Sequence[object], int]],
                   affinity: int = 0) -> list[Ref]:
        """Append several records (ikey, digest, bufs, length); raises OSError like `write`.

        The default writes them one by one (records before a failing one stay written). Note for
        implementers: a tier with a per-request cost (S3) overrides this to store the batch as one
        unit; the store's background copier calls it.
        """
        return [self.write(ikey, digest, bufs, length, affinity) for ikey, digest, bufs, length in records]

    def wait_rebuilt(self, timeout: float | None = None) -> bool:
        return True

    def flush(self) -> None:
        return None

    def gc(self) -> int:
        return 0

    def usage_bytes(self) -> int:
        return 0

    def capacity_bytes(self) -> int | None:
        return None

    def stats(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "usage_bytes": self.usage_bytes(),
                "capacity_bytes": self.capacity_bytes()}

    def loc_name(self, ref: Ref) -> str:
        """A record's place as people read it (verify's reports): a segment / object name and offset."""
        return repr(ref)


# ---- capabilities: optional abilities a tier declares by listing the mixin among its bases

class Probing(ABC):
    """A tier with a cheap request of its own that tells whether it answers again after a missed deadline
    (the store's prober calls it; tiers without one are probed by reading a record back)."""

    @abstractmethod
    def probe(self) -> None:
        """One small request; returns when the tier answered, raises OSError when it did not."""


class Auditing(ABC):
    """A tier that can check the other half of verify: every intact record it stores is indexed."""

    @abstractmethod
    def audit(self, fix: bool = False) -> list[str]:
        """Problems found (file -> index); with fix, intact unindexed records are indexed."""


class Describing(ABC):
    """A tier that reports per-unit (segment / object) figures for `lifeboat stats`."""

    @abstractmethod
    def describe(self) -> list[dict[str, int | str | bool]]:
        """One dict per unit, with at least `raw_bytes` and `stored_bytes`."""


class SegmentDirs(ABC):
    """A tier made of segment directories (local, nfs): purge counts and gc compaction work on them."""

    dirs: list[Any]  # tiers.segments.SegmentDir (not imported: the segments package imports this module)


class RecordRuns(ABC):
    """A tier whose per-request cost is worth sharing (segment directories): a put's run of records is
    written with one space reservation, pwritev calls of at most `write_call_size` and one index
    insert, and a get's adjacent records are read with one preadv. The store uses it on its first tier; records are verified as always."""

    @abstractmethod
    def write_some(self, records: Sequence[Record], affinity: int = 0) -> tuple[list[Ref], OSError | None]:
        """Append records in order: (refs of the leading records written and indexed, the error that
        stopped the rest or None). Records after a failure are dropped, never indexed."""

    @abstractmethod
    def locate_many(self, ikeys: np.ndarray) -> list[Ref | None]:
        """`locate` for many keys at once (index only, no I/O)."""

    @abstractmethod
    def read_run(self, refs: Sequence[Ref], bufs: Sequence[Sequence[memoryview]]) -> list[bool]:
        """`read_into` for many records (bufs[k] hold refs[k].length bytes), adjacent records of one
        unit in one request. Per record: False when stale; raises OSError for I/O failures."""


class ObjectPurging(ABC):
    """A tier whose purge rewrites stored units now (S3), instead of compacting directories at gc."""

    @abstractmethod
    def purge_objects(self, lines: list[dict[str, object]]) -> dict[str, Any]:
        """Apply purge.list rule lines to the stored units now; counts for the purge report."""


class Marking(ABC):
    """A tier that keeps small named marks about itself next to its units (a sealed store's seal
    mark, records/seal_mark.py): files in each directory, objects under the prefix. The store decides
    what they mean; the tier only lists, reads and writes them."""

    @abstractmethod
    def read_marks(self, prefix: str, limit_bytes: int) -> dict[str, bytes]:
        """name -> contents (at most limit_bytes read; b"" when unreadable) of every mark whose name
        starts with `prefix`, in every part; raises OSError when the tier cannot be listed."""

    @abstractmethod
    def write_mark(self, name: str, data: bytes) -> None:
        """Create or replace a mark in every part, atomically; raises OSError."""


class SingleIndexTier(Tier):
    """A tier with one index and one part, whose writes go through `write_many` (memory, S3)."""

    index: Index

    def contains(self, ikeys: np.ndarray) -> np.ndarray:
        return self.index.contains(ikeys)

    def locate(self, ikey: int) -> Ref | None:
        loc = self.index.get(ikey)
        return None if loc is None else Ref(0, loc)

    def write(self, ikey: int, digest: bytes, bufs: Sequence[object], length: int, affinity: int = 0) -> Ref:
        return self.write_many([(ikey, digest, bufs, length)], affinity)[0]


# ---- twins: a key met twice by an index rebuild (local, nfs, s3)

Rank = Callable[[bytes], int]  # a whole record's rank (records/sealing.py `Sealer.rank`): higher is kept


def settle_twins(index: Index, rank: Rank | None, read: Callable[[int, int, int], bytes | None], keys: np.ndarray,
                 units: np.ndarray, offs: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, ...]:
    """Scanned entries (int64 keys, unit ids, offsets, lengths) to insert if absent, twins settled.

    Why: an index entry names one record per key. A writer without the key can copy a plaintext (or
    otherwise unopenable) twin of a page into a sealed store; whichever copy a rebuild indexed then
    shadowed the other, so every read of the page missed across restarts, and gc, which keeps only
    indexed records, deleted the copy that opens. With the store's `rank`, a key already indexed or
    met twice in one batch has its copies read (`read(unit, offset, length)`, None when unreadable)
    and ranked: an indexed entry that ranks below a scanned copy is replaced here (index.insert), a
    scanned copy that ranks below another is left out; on a tie the old rule stands (what is indexed
    stays; within a batch the later record). The tier never decides what a rank means. Cost (only with
    a rank, i.e. encryption on): one index lookup per scanned key (a 200k-page rescan without a
    snapshot: 0.05-0.06 -> 0.06-0.11 CPU-s, noisy 2-vCPU VM), and each copy of a twice-met key read and checked (rare: pages are content
    addressed and written once; a planted twin costs what reading it once costs).
    """
    if rank is None or not len(keys):
        return keys, units, offs, lens
    again = index.contains(keys)
    ordered = np.sort(keys)  # a plain sort to ask whether any key repeats; the argsort only when one does
    if len(keys) > 1 and bool((ordered[1:] == ordered[:-1]).any()):
        order = np.argsort(keys, kind="stable")
        same = keys[order][1:] == keys[order][:-1]
        again[order[1:][same]] = True
        again[order[:-1][same]] = True
    if not again.any():
        return keys, units, offs, lens

    def rank_at(unit: int, off: int, n: int) -> int:
        data = read(unit, off, n)
        return -1 if data is None else rank(data)

    keep = np.ones(len(keys), bool)
    groups: dict[int, list[int]] = {}
    for i in np.flatnonzero(again).tolist():
        groups.setdefault(int(keys[i]), []).append(i)
    for key, idx in groups.items():
        best_rank, best = max((rank_at(int(units[i]), int(offs[i]), int(lens[i])), i) for i in idx)
        keep[idx] = False
        cur = index.get(key)
        if cur is None:
            keep[best] = True  # twins within the batch only: the best one goes in
        elif (cur.unit, cur.offset) != (int(units[best]), int(offs[best])) and \
                best_rank > rank_at(cur.unit, cur.offset, cur.length):
            index.insert(key, Loc(int(units[best]), int(offs[best]), int(lens[best])))
    return keys[keep], units[keep], offs[keep], lens[keep]
