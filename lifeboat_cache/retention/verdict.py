"""The policy applied to the unit at the head of the queue, for any tier that stores units with a trailer
table (segment files, S3 objects): which of its records were read and are still current, and what to
do with the unit."""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from ..index import Index, Loc
from ..metrics import Counters
from .access import AccessTable
from .policy import EVICT, KEEP, REINSERT, RewriteBudget, choose

Row = tuple[int, int, bytes, int]  # a read record of the unit: (index key, offset, digest, length)


def judge(table: np.ndarray, unit_id: int, unit_bytes: int, index: Index, hits: dict[int, int],
          budget: RewriteBudget, *, keep_allowed: bool) -> tuple[str, list[Row], int]:
    """(action, read records the index still points at in this unit, how many current ones were not read).

    `table` is the unit's trailer table (records/trailer.py); only current records count, so a record
    purged, replaced or quarantined since is neither kept nor rewritten. `keep_allowed` False: the
    evictor has kept many units this pass already, so KEEP becomes a rewrite or an eviction."""
    keys = np.asarray(table["key"], np.int64)
    offs, lens = table["offset"].tolist(), table["length"].tolist()
    current = _current(table, unit_id, index)
    key_bytes, tails = keys.astype("<i8").tobytes(), table["digest_tail"].tobytes()
    rows = [(int(keys[i]), offs[i], key_bytes[8 * i:8 * i + 8] + tails[8 * i:8 * i + 8], lens[i])
            for i in range(len(keys)) if current[i] and offs[i] in hits]
    read_bytes = sum(r[3] for r in rows)
    action = choose(unit_bytes, read_bytes, budget)
    if action == KEEP and not keep_allowed:
        action = REINSERT if budget.allows(read_bytes) else EVICT
    return action, rows, sum(current) - len(rows)


def _current(table: np.ndarray, unit_id: int, index: Index) -> list[bool]:
    """Per record of the trailer table: whether the index still points at it in this unit."""
    offs, lens = table["offset"].tolist(), table["length"].tolist()
    return [loc == Loc(unit_id, o, n) for loc, o, n in
            zip(index.get_many(np.asarray(table["key"], np.int64)), offs, lens)]


def gone_keys(table: np.ndarray, unit_id: int, index: Index, kept: list[Row]) -> list[int]:
    """Keys of the unit's current records that go with it (not rewritten elsewhere): the ghost's input."""
    rewritten = {r[0] for r in kept}
    return [k for k, c in zip(table["key"].tolist(), _current(table, unit_id, index)) if c and k not in rewritten]


def offsets_by_unit(index: Index, ikeys: np.ndarray, name_of: Callable[[int], str | None]) -> dict[str, list[int]]:
    """The records of these keys the index holds, as unit name -> offsets (AccessTable.hit_many's input):
    vector lookups and one name per unit, so counting a batch of uses costs little more than finding it."""
    found, units, offs, _ = index.locate(np.asarray(ikeys, np.int64))
    units, offs = units[found], offs[found]
    order = np.argsort(units, kind="stable")
    units, offs = units[order], offs[order]
    uniq, starts = np.unique(units, return_index=True)
    out: dict[str, list[int]] = {}
    for u, group in zip(uniq.tolist(), np.split(offs, starts[1:])):
        name = name_of(int(u))
        if name is not None:
            out[name] = group.tolist()
    return out


def tail_position() -> int:
    """A queue position after every unit now in it (ms, as units' ages): where kept records go."""
    return int(time.time() * 1000)


def keep_whole(access: AccessTable, counters: Counters, unit: str, read_records: int) -> None:
    """The unit at the head stays where it is on disk: it goes back in the queue, its reads used up."""
    access.keep(unit, tail_position())
    counters.add("retention_kept_segments")
    counters.add("retention_kept_records", read_records)
