"""Purge on an S3 tier: delete objects holding only purged records, rewrite the others without them.

Why a separate pass: S3 objects are immutable, so `lifeboat purge` does the work at once (the next
`gc` has nothing to add). A rewritten object keeps its source's time in its name, so later age
purges still see the records' age. The copy is written (PUT) before the source is deleted, so a
failure or crash in between leaves both (the same records twice), never neither. Other hosts
reading a deleted object get a stale miss at once; their listings drop it at the next full relist.
A versioned bucket keeps old versions: deleting them needs a lifecycle rule or the bucket owner.

It works over the tier's public parts only: its requests (`S3Client`) and its object table
(`ObjectTable`, which also drops a deleted object's records from the tier's index).
"""

from __future__ import annotations

import logging
from typing import Any

from ...index import Loc
from ...records import HEADER_SIZE, NS_AT, PurgeRules, RecordError, build_trailer, parse_trailer, verify_record
from .client import S3Client
from .objects import ObjectTable, S3Object, parse_name

log = logging.getLogger(__name__)


def rules_of(lines: list[dict[str, object]]) -> PurgeRules:
    rules = PurgeRules()
    for ln in lines:
        rules.add_line(ln)
    return rules


def _blocks(rules: PurgeRules, ms: int, ns: bytes) -> bool:
    if ms < rules.age_before_ms:
        return True
    before = rules.namespaces.get(bytes(ns))
    return before is not None and ms < before


def purge_objects(client: S3Client, objects: ObjectTable, data_prefix: str, lines: list[dict[str, object]], *,
                  name: str) -> dict[str, Any]:
    """Apply purge rules to every object under `data_prefix` now (its own listing, not the index: an
    object whose trailer this process could not read is purged too). `name` is the tier's, for log
    lines. Returns counts; `errors` > 0 means the purge is incomplete (run it again)."""
    rules = rules_of(lines)
    out = {"objects_deleted": 0, "objects_rewritten": 0, "purged_pages": 0, "errors": 0}
    try:
        listing = client.list(data_prefix)
    except OSError as e:
        log.warning("lifeboat: purge cannot list %s: %s", name, e)
        out["errors"] += 1
        return out
    named = sorted((p[0], p[1], obj_name, size) for obj_name, size in listing.items()
                   if (p := parse_name(obj_name)) is not None)
    newest = max((ms for ms, _, _, _ in named), default=0)
    for ns, before in rules.namespaces.items():  # every object that exists now, whatever its writer's clock
        rules.namespaces[ns] = max(before, newest + 1)
    ns_cut = max(rules.namespaces.values(), default=0)
    for ms, count, obj_name, size in named:
        if ms >= max(ns_cut, rules.age_before_ms):
            continue
        obj = objects.by_name(obj_name)
        at = _Target(client, objects, data_prefix, obj_name, obj)
        try:
            if ms < rules.age_before_ms:
                out["purged_pages"] += count
                at.delete()
                out["objects_deleted"] += 1
                continue
            body = client.get_range(data_prefix + obj_name, 0, size - 1, background=True, label=obj_name)
            table = parse_trailer(body, len(body))
            if table is None:
                log.warning("lifeboat: purge: %s has no valid trailer; deleting it", obj_name)
                at.delete()
                out["objects_deleted"] += 1
                continue
            keep, dropped = [], 0
            for row in table:
                off, n = int(row["offset"]), int(row["length"])
                if _blocks(rules, ms, body[off + NS_AT: off + NS_AT + 16]):
                    dropped += 1
                else:
                    keep.append((int(row["key"]), off, n))
            if not dropped:
                continue
            out["purged_pages"] += dropped
            if keep:
                at.rewrite(ms, body, keep)
                out["objects_rewritten"] += 1
            else:
                out["objects_deleted"] += 1
            at.delete()
        except OSError as e:
            out["errors"] += 1
            log.warning("lifeboat: purge of %s on %s failed: %s", obj_name, name, e)
    return out


class _Target:
    """One listed object being purged; `obj` is its table entry, None if this process never indexed it."""

    def __init__(self, client: S3Client, objects: ObjectTable, data_prefix: str, name: str,
                 obj: S3Object | None) -> None:
        self.client, self.objects, self.data_prefix, self.name, self.obj = client, objects, data_prefix, name, obj

    def delete(self) -> None:
        failed = self.client.delete([self.data_prefix + self.name])
        if failed:
            raise OSError(f"could not delete {self.name}")
        if self.obj is not None:
            self.objects.drop(self.obj)

    def rewrite(self, ms: int, body: bytes, keep: list[tuple[int, int, int]]) -> None:
        """PUT a copy holding the `keep` records (key, offset, length) of `body`, named with the source's
        time `ms`; move the index entries that still point at the source to the copy."""
        parts, entries, moved, end = [], [], [], 0
        for ikey, off, n in keep:
            rec = body[off: off + n]
            try:
                h = verify_record(rec[:HEADER_SIZE], memoryview(rec)[HEADER_SIZE:])
            except RecordError:
                continue  # never carry a damaged record over
            parts.append(rec)
            entries.append((h.digest, end, n, h.raw_len))
            if self.obj is not None:
                moved.append((ikey, Loc(self.obj.id, off, n), end, n))
            end += n
        if not entries:
            return
        blob = b"".join([*parts, build_trailer(end, entries)])
        name = self.objects.new_name(ms, len(entries))
        self.client.put(self.data_prefix + name, blob, background=True)
        new = self.objects.register(name, len(blob), records=len(entries), stored_bytes=end)
        index = self.objects.index
        for ikey, old, at, n in moved:
            if index.get(ikey) == old:
                index.insert(ikey, Loc(new.id, at, n))
