"""MemoryTier: the reference tier, in memory. The smallest code that passes `TierTests`.

One unit per write batch (like an S3 object), ids that only grow, eviction of whole oldest units
when over capacity. Not durable: a new instance starts empty unless it is given the same `units`
dict (which is how tests "reopen" it).
"""

from __future__ import annotations

import threading
from typing import Iterator, Sequence


from ..index import Index, Loc
from ..records import HEADER_SIZE, unpack_header
from ..tiers import Ref, SingleIndexTier


class MemoryTier(SingleIndexTier):
    kind = "memory"
    durable = False

    def __init__(self, units: dict[int, bytearray] | None = None, *, capacity_bytes: int | None = None,
                 name: str = "memory") -> None:
        self.name = name
        self.units = units if units is not None else {}  # unit id -> bytes; shared to simulate reopen
        self._capacity = capacity_bytes
        self.index = Index()
        self._lock = threading.Lock()
        self._next = max(self.units, default=0) + 1
        self._forgotten: set[tuple[int, int]] = set()
        for uid, data in sorted(self.units.items()):  # "rebuild": walk each unit's records
            pos = 0
            while pos + HEADER_SIZE <= len(data):
                try:
                    h = unpack_header(bytes(data[pos: pos + HEADER_SIZE]))
                except ValueError:
                    break
                if pos + h.record_len > len(data):
                    break
                self.index.insert(int.from_bytes(h.digest[:8], "little", signed=True), Loc(uid, pos, h.record_len))
                pos += h.record_len

    def write_many(self, records: Sequence[tuple[int, bytes, Sequence[object], int]],
                   affinity: int = 0) -> list[Ref]:
        data = bytearray()
        offs = []
        for _, _, bufs, _ in records:
            offs.append(len(data))
            for b in bufs:
                data += memoryview(b).cast("B")  # type: ignore[arg-type]
        with self._lock:
            uid = self._next
            self._next += 1
            self.units[uid] = data
        refs = []
        for (ikey, _, _, length), off in zip(records, offs):
            loc = Loc(uid, off, length)
            self.index.insert(ikey, loc)  # write, then index
            refs.append(Ref(0, loc))
        self.gc()
        return refs

    def read_into(self, ref: Ref, bufs: Sequence[memoryview]) -> bool:
        data = self.units.get(ref.loc.unit)
        if data is None or ref.loc.offset + ref.loc.length > len(data):
            return False
        src = memoryview(data)[ref.loc.offset: ref.loc.offset + ref.loc.length]
        pos = 0
        for b in bufs:
            b.cast("B")[:] = src[pos: pos + b.nbytes]
            pos += b.nbytes
        return True

    def forget(self, ikey: int, ref: Ref, reason: str) -> None:
        self.index.remove_if_match(ikey, ref.loc)
        self._forgotten.add((ref.loc.unit, ref.loc.offset))

    def records(self) -> Iterator[tuple[int, Ref]]:
        for k, loc in self.index.items():
            yield k, Ref(0, loc)

    def usage_bytes(self) -> int:
        return sum(len(d) for d in self.units.values())

    def capacity_bytes(self) -> int | None:
        return self._capacity

    def gc(self) -> int:
        freed = 0
        while self._capacity is not None and self.usage_bytes() > self._capacity and self.units:
            with self._lock:
                uid = min(self.units)
                freed += len(self.units.pop(uid))
            self.index.drop_unit(uid)
        return freed

    def close(self) -> None:
        return None
