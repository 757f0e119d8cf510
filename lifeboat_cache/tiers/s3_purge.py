"""Purge on an S3 tier: delete objects holding only purged records, rewrite the others without them.

Why a separate pass: S3 objects are immutable, so `lifeboat purge` does the work at once (the next
`gc` has nothing to add). A rewritten object keeps its source's time in its name, so later age
purges still see the records' age. The copy is written (PUT) before the source is deleted, so a
failure or crash in between leaves both (the same records twice), never neither. Other hosts
reading a deleted object get a stale miss at once; their listings drop it at the next full relist.
A versioned bucket keeps old versions: deleting them needs a lifecycle rule or the bucket owner.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .. import codec
from ..index import Loc
from .compaction import NS_AT
from .purgelist import PurgeRules
from .segfile import build_trailer, parse_trailer

if TYPE_CHECKING:
    from .s3 import S3Tier

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


def purge_objects(tier: "S3Tier", lines: list[dict[str, object]]) -> dict[str, Any]:
    """Apply purge rules to every object of the bucket now (its own listing, not the index: an object
    whose trailer this process could not read is purged too). Returns counts; `errors` > 0 means
    the purge is incomplete (run it again)."""
    rules = rules_of(lines)
    out = {"objects_deleted": 0, "objects_rewritten": 0, "purged_pages": 0, "errors": 0}
    try:
        listing = tier._list(tier.data_prefix)
    except OSError as e:
        log.warning("lifeboat: purge cannot list %s: %s", tier.name, e)
        out["errors"] += 1
        return out
    named = sorted((p[0], p[1], name, size) for name, size in listing.items()
                   if (p := tier.parse_object_name(name)) is not None)
    newest = max((ms for ms, _, _, _ in named), default=0)
    for ns, before in rules.namespaces.items():  # every object that exists now, whatever its writer's clock
        rules.namespaces[ns] = max(before, newest + 1)
    ns_cut = max(rules.namespaces.values(), default=0)
    for ms, count, name, size in named:
        if ms >= max(ns_cut, rules.age_before_ms):
            continue
        with tier._lock:
            uid = tier._by_name.get(name)
            obj = tier._objs.get(uid) if uid is not None else None
        try:
            if ms < rules.age_before_ms:
                out["purged_pages"] += count
                _delete(tier, name, obj)
                out["objects_deleted"] += 1
                continue
            body = tier._get_range(name, 0, size - 1, background=True)
            table = parse_trailer(body, len(body))
            if table is None:
                log.warning("lifeboat: purge: %s has no valid trailer; deleting it", name)
                _delete(tier, name, obj)
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
                _rewrite(tier, obj, ms, body, keep)
                out["objects_rewritten"] += 1
            else:
                out["objects_deleted"] += 1
            _delete(tier, name, obj)
        except OSError as e:
            out["errors"] += 1
            log.warning("lifeboat: purge of %s on %s failed: %s", name, tier.name, e)
    return out


def _delete(tier: "S3Tier", name: str, obj: Any) -> None:
    failed = tier._delete([tier.data_prefix + name])
    if failed:
        raise OSError(f"could not delete {name}")
    if obj is not None:
        tier._drop(obj)


def _rewrite(tier: "S3Tier", obj: Any, ms: int, body: bytes, keep: list[tuple[int, int, int]]) -> None:
    parts, entries, moved, end = [], [], [], 0
    for ikey, off, n in keep:
        rec = body[off: off + n]
        try:
            h = codec.verify_record(rec[:codec.HEADER_SIZE], memoryview(rec)[codec.HEADER_SIZE:])
        except codec.RecordError:
            continue  # never carry a damaged record over
        parts.append(rec)
        entries.append((h.digest, end, n, h.raw_len))
        if obj is not None:
            moved.append((ikey, Loc(obj.id, off, n), end, n))
        end += n
    if not entries:
        return
    blob = b"".join([*parts, build_trailer(end, entries)])
    name = tier.object_name(ms, len(entries))
    tier._call("put_object", background=True, Bucket=tier.bucket, Key=tier.data_prefix + name, Body=blob,
               **tier._put_extra)
    with tier._lock:
        new = tier._register(name, len(blob))
        new.records, new.stored_bytes = len(entries), end
    for ikey, old, at, n in moved:
        if tier.index.get(ikey) == old:
            tier.index.insert(ikey, Loc(new.id, at, n))
