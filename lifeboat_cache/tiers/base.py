"""The tier interface the store coordinates: an indexed place to append and read records.

A tier owns its index (a scan of its own layout rebuilds it) and knows nothing of codecs: it stores
the bytes of whole records and returns them. I/O failures raise OSError (the store turns them into
misses and a cooldown); a stale location returns False.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator, Sequence

import numpy as np

from ..index import Index, Loc


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
