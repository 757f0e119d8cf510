"""The S3 tier's object table: the segment objects of the bucket this process knows, and their names.

`ObjectTable` is the only owner of its lock; everything else (the tier, its listing, purge) goes
through its public methods. Besides the objects themselves it keeps the two per-name hint sets:

* Unreadable objects (`mark_bad`): a key can be listed before its body is readable (uploads in
  flight on some servers), and a read can fail on a transient error, so one failure must not hide
  the object for good: it is retried with backoff (`BAD_RETRY_S`, doubling) and given up after
  `BAD_MAX_TRIES` failures. Names this module never writes (`NAME_RE`) are given up at once.
* Quarantine marks: (object name, offset) of records that failed verification, so a later rebuild
  skips them; the marks of evicted objects are handed back (`take_marks`) to be deleted.

Names: `<ms>-<host>-<pid>-<token><seq>-<count>.lbo` (names sort by age; host, pid and a
per-process random token make every writer's names its own, so nothing needs a lock). Because the
record count is in the name, one ranged GET of exactly the trailer indexes an object.
"""

from __future__ import annotations

import itertools
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Iterable

from ...index import Index
from ...records import framing

OBJECT_SUFFIX = ".lbo"
NAME_RE = re.compile(r"^(\d{13})-([^-/]+)-(\d{1,10})-([0-9a-f]{6})(\d{6,})-([1-9]\d{0,6})\.lbo$")
BAD_RETRY_S = 5.0  # an unreadable trailer is retried after 5, 10, 20, 40 s ...
BAD_MAX_TRIES = 6  # ...and given up after this many failures
_TOKEN = os.urandom(3).hex()  # same host name and pid in two containers must not collide
_SEQ = itertools.count(1)  # shared by every tier in the process: names never repeat


def parse_name(name: str) -> tuple[int, int] | None:
    """'<ms>-<host>-<pid>-<token><seq>-<count>.lbo' -> (ms, count); None for any other name."""
    m = NAME_RE.match(name)
    return (int(m.group(1)), int(m.group(6))) if m else None


@dataclass
class S3Object:
    """One object of the bucket; `id` is its unit number in the index's locations."""

    id: int
    name: str  # relative to the data prefix
    size: int
    born: int  # listing generation when it was registered: a listing never drops a newer object
    records: int = 0
    stored_bytes: int = 0
    raw_bytes: int = 0
    counted: int = field(init=False)  # what the capacity counts: size less the framing its name's count gives

    def __post_init__(self) -> None:
        parsed = parse_name(self.name)
        self.counted = self.size - (framing(parsed[1]) if parsed else 0)


class ObjectTable:
    """Objects by id and by name, their total size, and the unreadable / quarantined hints.

    `drop` also removes the object's records from `index` (the tier's index), after the table.
    """

    def __init__(self, index: Index, tag: str) -> None:
        self.index = index
        self.tag = tag  # this writer's part of new names (host-pid)
        self._lock = threading.RLock()
        self._objs: dict[int, S3Object] = {}
        self._by_name: dict[str, int] = {}
        self._bad: dict[str, tuple[int, float]] = {}  # unreadable trailer: name -> (failures, retry at)
        self._quarantine: set[tuple[str, int]] = set()
        self._next_id = 1
        self._gen = 0
        self._usage = 0

    # ------------------------------------------------------------------ names
    def new_name(self, ms: int, count: int) -> str:
        """A new object's name: creation time (ms), writer, a never-repeating sequence, record count."""
        return f"{ms:013d}-{self.tag}-{_TOKEN}{next(_SEQ):06d}-{count}{OBJECT_SUFFIX}"

    # ------------------------------------------------------------------ objects
    def register(self, name: str, size: int, *, records: int | None = None, stored_bytes: int | None = None,
                 raw_bytes: int | None = None) -> S3Object:
        """Add an object (ids only grow), or find the one of that name; then set the counts given."""
        with self._lock:
            obj = self.register_new(name, size) or self._objs[self._by_name[name]]
            if records is not None:
                obj.records = records
            if stored_bytes is not None:
                obj.stored_bytes = stored_bytes
            if raw_bytes is not None:
                obj.raw_bytes = raw_bytes
            return obj

    def register_new(self, name: str, size: int, *, records: int = 0, stored_bytes: int = 0,
                     raw_bytes: int = 0) -> S3Object | None:
        """Add an object with these counts; None if one of that name is there already (a writer of
        this process indexed it meanwhile)."""
        with self._lock:
            if name in self._by_name:
                return None
            obj = S3Object(self._next_id, name, size, self._gen, records, stored_bytes, raw_bytes)
            self._next_id += 1
            self._objs[obj.id] = obj
            self._by_name[name] = obj.id
            self._usage += obj.counted
            return obj

    def drop(self, obj: S3Object) -> None:
        """Remove an object from the table, then its records from the index (no-op if gone already)."""
        with self._lock:
            if self._objs.pop(obj.id, None) is None:
                return
            self._by_name.pop(obj.name, None)
            self._usage -= obj.counted
        self.index.drop_unit(obj.id)

    def get(self, uid: int) -> S3Object | None:
        with self._lock:
            return self._objs.get(uid)

    def by_name(self, name: str) -> S3Object | None:
        with self._lock:
            uid = self._by_name.get(name)
            return self._objs.get(uid) if uid is not None else None

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._by_name

    def __len__(self) -> int:
        with self._lock:
            return len(self._objs)

    def oldest_first(self) -> list[S3Object]:
        """Every object, oldest (smallest name) first."""
        with self._lock:
            return sorted(self._objs.values(), key=lambda o: o.name)

    @property
    def usage(self) -> int:
        """What the capacity counts of every object in the table (S3Object.counted)."""
        with self._lock:
            return self._usage

    def new_generation(self) -> int:
        """Start a full listing: objects registered from now on are never taken for evicted by it."""
        with self._lock:
            self._gen += 1
            return self._gen

    def missing(self, seen: set[str], gen: int) -> list[S3Object]:
        """Objects a full listing of generation `gen` did not see and that were registered before it."""
        with self._lock:
            return [o for o in self._objs.values() if o.name not in seen and o.born < gen]

    # ------------------------------------------------------------------ unreadable objects
    def to_index(self, listing: dict[str, int], now: float) -> list[tuple[str, int]]:
        """(name, size) of listed objects not in the table and not waiting for a retry, newest first."""
        with self._lock:
            return [(n, s) for n, s in sorted(listing.items(), reverse=True)
                    if n not in self._by_name and self._bad.get(n, (0, 0.0))[1] <= now]

    def mark_bad(self, name: str) -> tuple[int, bool]:
        """One more failure to read `name`'s trailer: (failures so far, given up)."""
        with self._lock:
            tries = self._bad.get(name, (0, 0.0))[0] + 1
            final = tries >= BAD_MAX_TRIES
            retry_at = float("inf") if final else time.monotonic() + BAD_RETRY_S * 2 ** (tries - 1)
            self._bad[name] = (tries, retry_at)
        return tries, final

    def mark_foreign(self, name: str) -> bool:
        """Give up a name this module does not write (never fetched); True the first time."""
        with self._lock:
            if name in self._bad:
                return False
            self._bad[name] = (BAD_MAX_TRIES, float("inf"))
            return True

    def clear_bad(self, name: str) -> None:
        with self._lock:
            self._bad.pop(name, None)

    def retry_due(self, now: float, limit: int = 64) -> list[str]:
        """Unreadable names whose backoff is over (at most `limit`)."""
        with self._lock:
            return [n for n, (tries, at) in self._bad.items() if at <= now and n not in self._by_name][:limit]

    def bad_counts(self) -> tuple[int, int]:
        """(given up, still retried) unreadable objects."""
        with self._lock:
            tries = [t for t, _ in self._bad.values()]
        return sum(t >= BAD_MAX_TRIES for t in tries), sum(t < BAD_MAX_TRIES for t in tries)

    # ------------------------------------------------------------------ quarantine marks
    def quarantine(self, name: str, offset: int) -> None:
        with self._lock:
            self._quarantine.add((name, offset))

    def keep_mask(self, name: str, offsets: Iterable[int]) -> list[bool] | None:
        """Per offset: not quarantined; None when nothing is quarantined (keep everything).
        Membership tests only: no lock, as a rebuild checks every record of every object."""
        if not self._quarantine:
            return None
        return [(name, int(o)) not in self._quarantine for o in offsets]

    def take_marks(self, gone: set[str]) -> list[tuple[str, int]]:
        """Forget and return the quarantine marks of the objects named in `gone`."""
        with self._lock:
            marks = [(n, off) for n, off in self._quarantine if n in gone]
            self._quarantine.difference_update(marks)
        return marks
