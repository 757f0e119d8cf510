"""`lifeboat purge`: remove a model's, a namespace's or old pages from every tier and every process;
`--key-id`: the pages sealed with a key (crypto-shredding, `purge_key_ids`).

Why: KV caches hold users' prompts; deleting a tenant's data must stop its pages being served at
once and then remove their bytes. A purge appends rules to `purge.list` in every local / nfs store
directory (records/purge_list.py): this process, and every serving process on its next index refresh
(`refresh_interval_s`), drops the matching records from its index and refuses them on the read
path. Their bytes leave the disk at the next `lifeboat gc` (tiers/segments/compaction.py). S3 objects are
rewritten without the purged records (or deleted) by the purge itself.

Model -> namespaces: a namespace fingerprint is a hash, so the model's namespaces (every rank, pool
and layout) are learned from the stats files serving processes write (stats_file.py, `lifeboat ls`);
the model id matches exactly, or as a glob (`org/*`). A namespace prefix is also looked up among the
namespaces present in the store (pages written through the Python API have no stats file).

Counts: `purged_pages` is the pages present before the purge that its rules cover, each page once
(read from the record headers before the rules are written), so it is exact and a second run says 0.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import ConfigError, Settings, parse_age
from .health import tier_health

if TYPE_CHECKING:
    from ..store import ChunkStore
    from ..tiers import SegmentDirs

log = logging.getLogger(__name__)

_HEX_RE = re.compile(r"^[0-9a-f]{8,32}$")


class PurgeError(Exception):
    """A purge that cannot be done as asked (the message says why and what to do)."""


@dataclass
class PurgeRequest:
    namespaces: list[bytes] = field(default_factory=list)
    older_than_s: float | None = None
    labels: dict[str, dict[str, Any]] = field(default_factory=dict)  # hex -> labels, for the report


def known_namespaces(settings: Settings) -> dict[str, dict[str, Any]]:
    """hex namespace -> labels, from the stats files of serving processes (live and past)."""
    from . import stats_file

    return stats_file.merge_namespaces(stats_file.read_stats_files(stats_file.stats_dir(settings)))


def resolve(settings: Settings, *, models: list[str] | None = None, namespaces: list[str] | None = None,
            older_than: str | None = None, present: list[str] | None = None,
            names: dict[str, dict[str, str]] | None = None) -> PurgeRequest:
    """Turn the CLI's selectors into namespace fingerprints and an age; bad input raises ConfigError.

    `present`: namespaces (hex) found in the store itself (ChunkStore.pages_by_namespace), so a
    `--namespace` prefix finds pages written through the Python API too, which no stats file names;
    `names`: the labels Python API writers left in the store (ChunkStore.namespace_names), so `--model`
    finds those pages too (a stats file's labels win)."""
    req = PurgeRequest()
    if older_than is not None:
        req.older_than_s = parse_age(older_than, "--older-than")
    known = known_namespaces(settings)
    for ns, labels in (names or {}).items():
        if not known.get(ns, {}).get("labels"):
            known[ns] = {**known.get(ns, {}), "labels": labels}
    for ns in present or []:
        known.setdefault(ns, {"labels": {}})
    for text in namespaces or []:
        t = text.strip().lower()
        if not _HEX_RE.match(t):
            raise ConfigError(f"--namespace {text!r}: expected a namespace fingerprint in hex (8 to 32 "
                              "characters, as `lifeboat ls` prints it)")
        if len(t) == 32:
            req.namespaces.append(bytes.fromhex(t))
            req.labels[t] = known.get(t, {}).get("labels", {})
            continue
        hits = [ns for ns in known if ns.startswith(t)]
        if len(hits) != 1:
            why = "matches no namespace" if not hits else f"is ambiguous ({len(hits)} match)"
            raise ConfigError(f"--namespace {text!r} {why} in the store or the stats files; give the full 32 hex "
                              "characters (`lifeboat ls --json`)")
        req.namespaces.append(bytes.fromhex(hits[0]))
        req.labels[hits[0]] = known[hits[0]]["labels"]
    for model in models or []:
        hits = [ns for ns, d in known.items() if _model_matches(model, d["labels"].get("model", ""))]
        if not hits:
            seen = sorted({d["labels"].get("model", "?") for d in known.values()})
            raise ConfigError(f"--model {model!r}: no namespace of this model in the store or the stats files of "
                              f"{settings.source} (models seen: {', '.join(seen) or 'none'}); the model id must "
                              "match exactly (or give a glob such as 'org/*'); pages written through the Python "
                              "API under a namespace not made by namespace_fingerprint(model=...) carry no model "
                              "name: purge them by --namespace (`lifeboat ls`) or --older-than")
        for ns in hits:
            req.namespaces.append(bytes.fromhex(ns))
            req.labels[ns] = known[ns]["labels"]
    return req


def _model_matches(asked: str, label: str) -> bool:
    """The model id exactly as the stats files (`lifeboat ls`) name it, or a glob (`org/*`, `*llama*`):
    `llama` must not purge `meta/llama` and `other/llama` at once."""
    if not label:
        return False
    a, lab = asked.rstrip("/"), label.rstrip("/")
    return fnmatch.fnmatchcase(lab, a) if any(c in a for c in "*?[") else a == lab


def rule_lines(req: PurgeRequest, now: float | None = None, newest_ms: int = 0) -> list[dict[str, object]]:
    """purge.list lines. A namespace rule covers every segment that exists now: `newest_ms` (the newest
    segment name in the directory) covers a writer whose clock runs ahead of this host's."""
    now_ms = int((time.time() if now is None else now) * 1000) + 1  # covers segments created this ms
    cut = max(now_ms, newest_ms + 1)
    lines: list[dict[str, object]] = [{"namespace": ns.hex(), "before_ms": cut} for ns in req.namespaces]
    if req.older_than_s is not None:
        lines.append({"age_before_ms": now_ms - int(req.older_than_s * 1000)})
    return lines


def check_writable(settings: Settings) -> None:
    """A purge changes the store: a store it cannot write to is an error, not a silent no-op."""
    for ts in settings.storage:
        for p in ts.paths:
            if not Path(p).is_dir():
                continue  # never written: nothing to purge there
            if not os.access(p, os.W_OK | os.X_OK):
                raise PurgeError(f"store directory {p} is read-only for this user: a purge must record "
                                 "its rules there and remove files; run it as the store's owner")


def matching_pages(store: "ChunkStore", lines: list[dict[str, object]]) -> list[int]:
    """Per tier: the pages present now that the rule `lines` cover (each page once): what a purge
    removes, counted before it runs, so the figure is exact and a second run counts 0."""
    from ..records import PurgeRules
    from ..tiers.segments import unit_ms

    rules = PurgeRules()
    for line in lines:
        rules.add_line(dict(line, before_ms=(1 << 53) - 1) if "namespace" in line else line)  # every unit there now

    def covered(h: Any, unit: str) -> bool:
        ms = unit_ms(unit)
        before = rules.namespaces.get(bytes(h.namespace))
        return ms < rules.age_before_ms or (before is not None and ms < before)

    return store.count_records(covered)


def purge(settings: Settings, req: PurgeRequest, *, compact_now: bool = False,
          below: float | None = None, dry_run: bool = False) -> dict[str, Any]:
    """Record the rules in every directory, apply them here, purge S3; optionally compact now.
    `dry_run`: count what would be purged (`would_purge_pages` per tier) and change nothing."""
    from ..store import ChunkStore
    from ..records import append_rules
    from ..tiers import ObjectPurging, SegmentDirs

    lines = rule_lines(req)
    if not lines:
        raise PurgeError("nothing to purge: give --model, --namespace or --older-than")
    report: dict[str, Any] = {"namespaces": {ns.hex(): req.labels.get(ns.hex(), {}) for ns in req.namespaces},
                              "older_than_s": req.older_than_s, "dry_run": dry_run, "tiers": []}
    with ChunkStore.open(settings, background=False, read_only=True, seal=False) as before:
        bad = [h for h in tier_health(before) if not h.reachable]
        if bad:  # refused before any rule is written: a purge is all tiers or none
            raise PurgeError("nothing purged: " + "; ".join(h.message() for h in bad) + "; run it again once "
                             "every tier answers")
        counts = matching_pages(before, lines)
        names = [t.name for t in before.tiers]
    if dry_run:
        report["tiers"] = [{"tier": n, "would_purge_pages": c} for n, c in zip(names, counts)]
        return report
    check_writable(settings)
    for ts in settings.storage:
        for p in ts.paths:
            if not Path(p).is_dir():
                continue
            try:
                append_rules(Path(p), rule_lines(req, newest_ms=_newest_segment_ms(Path(p))), ts.file_mode)
            except OSError as e:
                raise PurgeError(f"cannot record the purge in {p}: {e.strerror or e}; run it as the store's "
                                 "owner on a writable store") from None
    with ChunkStore.open(settings, background=False, evict=False, seal=False) as store:
        for tier, count in zip(store.tiers, counts):
            t: dict[str, Any] = {"tier": tier.name}
            if isinstance(tier, SegmentDirs):
                t["purged_pages"] = count  # pages present before, covered by these rules (each once)
                t["segments_evicted"] = sum(d.purge_figures()["segments_evicted"] for d in tier.dirs)
                if compact_now:
                    t["compaction"] = compact_tier(tier, below)
            elif isinstance(tier, ObjectPurging):
                t.update(tier.purge_objects(lines))
            report["tiers"].append(t)
    return report


def parse_key_ids(texts: list[str]) -> set[int]:
    """`--key-id` values (8 hex digits, as `lifeboat stats` and `keygen` print them) -> key ids."""
    out = set()
    for text in texts:
        t = text.strip().lower()
        if not re.fullmatch(r"[0-9a-f]{8}", t):
            raise ConfigError(f"--key-id {text!r}: expected a key id of 8 hex digits (`lifeboat stats` lists "
                              "the key ids of the stored pages)")
        out.add(int(t, 16))
    return out


def purge_key_ids(settings: Settings, key_ids: set[int], *, compact_now: bool = False,
                  below: float | None = None) -> dict[str, Any]:
    """Crypto-shredding's second step: drop every record sealed with one of key_ids from every tier
    (quarantined, so no process serves or re-indexes it), then optionally compact the bytes away.

    The first step is deleting the key itself (from every host's config and secret store): from then
    on no copy of those records opens anywhere, in snapshots, backups or old bucket versions too.
    This step reclaims the space. Raises PurgeError for a store it cannot write."""
    from ..records import key_id_text
    from ..store import ChunkStore
    from ..tiers import SegmentDirs

    check_writable(settings)
    report: dict[str, Any] = {"key_ids": sorted(key_id_text(k) for k in key_ids), "tiers": []}
    with ChunkStore.open(settings, background=False, evict=False, seal=False) as store:
        dropped = store.drop_records(lambda h: "purged_key" if h.sealed and h.key_id in key_ids else None)
        report["dropped_pages"] = dropped
        for tier in store.tiers:
            t: dict[str, Any] = {"tier": tier.name}
            if compact_now and isinstance(tier, SegmentDirs):
                t["compaction"] = compact_tier(tier, below)
            elif compact_now:
                t["freed_bytes"] = tier.gc()
            report["tiers"].append(t)
    return report


def _newest_segment_ms(directory: Path) -> int:
    from ..tiers.segments import unit_ms
    from ..tiers.segments import SEGMENT_SUFFIX

    try:
        return max((unit_ms(e.name) for e in os.scandir(directory) if e.name.endswith(SEGMENT_SUFFIX)), default=0)
    except OSError:
        return 0


def compact_tier(tier: "SegmentDirs", below: float | None = None) -> dict[str, int]:
    """Compact every directory of a local / nfs tier; summed counts."""
    from ..tiers.segments import DEFAULT_COMPACT_BELOW, compact

    total: dict[str, int] = {}
    for d in tier.dirs:
        got = compact(d, DEFAULT_COMPACT_BELOW if below is None else below)
        for k, v in got.items():
            total[k] = total.get(k, 0) + v
    return total
