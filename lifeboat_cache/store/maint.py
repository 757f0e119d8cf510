"""The store's maintenance over its tiers: `verify` both ways, headers per key id, dropping records.

These walk every indexed record of every tier (the CLI's `verify`, `stats`, `purge --key-id` and gc
use them through ChunkStore); the data path never calls them.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

from ..metrics import Counters
from ..records import HEADER_SIZE, OPENABLE_REASONS, Header, RecordError, Sealer, key_id_text, unpack_header
from ..tiers import Auditing, Ref, Tier


def verify_tiers(tiers: Sequence[Tier], sealer: Sealer, counters: Counters, fix: bool = False,
                 progress: Callable[[int, int], None] | None = None) -> list[str]:
    """Check both ways, like diskcache's `check`: every indexed record is intact (index -> file),
    and every intact record on disk is indexed (file -> index, tiers with `audit`).

    With fix, bad records are quarantined and intact ones missing from the index are indexed.
    """
    problems: list[str] = []
    for tier in tiers:
        recs = list(tier.records())
        for n, (ikey, ref) in enumerate(recs, 1):
            rec = bytearray(ref.length)
            try:
                ok = tier.read_into(ref, [memoryview(rec)])
                if not ok:
                    raise RecordError("truncated", "record shorter than indexed")
                h = sealer.check(rec)  # checksums, then: may it be served, does it open
                if int.from_bytes(h.digest[:8], "little", signed=True) != ikey:
                    raise RecordError("foreign", "index key does not match the header's digest")
                if h.record_len != ref.length:
                    raise RecordError("truncated", "length differs from the index")
            except (RecordError, OSError) as e:
                where = tier.loc_name(ref)
                problems.append(f"{tier.name}: {where}: {e}")
                if fix and isinstance(e, RecordError) and e.reason not in OPENABLE_REASONS:
                    tier.forget(ikey, ref, getattr(e, "reason", "verify"))
                    counters.add("quarantined")
            if progress is not None:
                progress(n, len(recs))
        if isinstance(tier, Auditing):
            problems.extend(tier.audit(fix))
    return problems


def record_headers(tier: Tier) -> Iterator[tuple[int, Ref, Header | None]]:
    """(index key, place, parsed header or None when unreadable) of every indexed record of a tier:
    64 bytes read per record, for `stats` per key id and `drop_records`."""
    for ikey, ref in list(tier.records()):
        buf = bytearray(HEADER_SIZE)
        try:
            ok = ref.length >= HEADER_SIZE and tier.read_into(
                Ref(ref.part, type(ref.loc)(ref.loc.unit, ref.loc.offset, HEADER_SIZE)), [memoryview(buf)])
            yield ikey, ref, unpack_header(buf) if ok else None
        except (OSError, RecordError):
            yield ikey, ref, None


def pages_by_key_id(tiers: Sequence[Tier]) -> list[dict[str, int]]:
    """Per tier: indexed pages per sealing key id (hex), plaintext ones under "plaintext". Reads each
    record's header; changes nothing."""
    out = []
    for tier in tiers:
        counts: dict[str, int] = {}
        for _, _, h in record_headers(tier):
            name = "unreadable" if h is None else key_id_text(h.key_id) if h.sealed else "plaintext"
            counts[name] = counts.get(name, 0) + 1
        out.append(dict(sorted(counts.items())))
    return out


def drop_records(tiers: Sequence[Tier], why: Callable[[Header], str | None]) -> int:
    """Drop (quarantine: never served or rediscovered; bytes removed by gc) every indexed record
    whose header `why` gives a reason for. Returns the number dropped."""
    dropped = 0
    for tier in tiers:
        for ikey, ref, h in record_headers(tier):
            reason = None if h is None else why(h)
            if reason is not None:
                tier.forget(ikey, ref, reason)
                dropped += 1
    return dropped


def pages_by_namespace(tiers: Sequence[Tier]) -> dict[str, dict[str, Any]]:
    """Namespace (hex) -> pages present now (distinct keys over every tier), their stored bytes on the
    first tier holding each, and pages per tier. Reads each record's header (`lifeboat ls`, `purge`):
    it sees every namespace however it was written, where the stats files know only serving processes'."""
    seen: dict[str, set[int]] = {}
    stored: dict[str, int] = {}
    per_tier: dict[str, dict[str, int]] = {}
    for tier in tiers:
        for ikey, _, h in record_headers(tier):
            if h is None:
                continue
            ns = h.namespace.hex()
            counts = per_tier.setdefault(ns, {})
            counts[tier.name] = counts.get(tier.name, 0) + 1
            keys = seen.setdefault(ns, set())
            if ikey not in keys:
                keys.add(ikey)
                stored[ns] = stored.get(ns, 0) + h.record_len
    return {ns: {"pages": len(seen[ns]), "stored_bytes": stored[ns], "tiers": per_tier[ns]} for ns in sorted(seen)}


def count_records(tiers: Sequence[Tier], match: Callable[[Header, str], bool]) -> list[int]:
    """Per tier: distinct indexed pages whose header and unit (segment or object name) `match` accepts
    (`lifeboat purge`: the pages a purge removes, counted before it runs; a page held twice counts once)."""
    out = []
    for tier in tiers:
        keys = {ikey for ikey, ref, h in record_headers(tier)
                if h is not None and match(h, tier.loc_name(ref).rpartition("@")[0])}
        out.append(len(keys))
    return out
