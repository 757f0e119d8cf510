"""Index snapshot (format 2, tiers/snapshot.py): round trip, shard-by-shard visibility, and every way a
snapshot can be unusable (version, truncation, a flipped byte, stale against the segments, format 1,
a crashed save), each of which must end in a full, correct index rebuilt by scan.

Real files throughout: sealed segments with real trailers (sparse, from the index benchmark's
`make_store`), opened by the real SegmentDir.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import numpy as np
import pytest

from lifeboat_cache.bench.index_reopen import PER_UNIT, make_store, open_dir
from lifeboat_cache.index import DEAD, SHARDS, Index, Loc, mix_keys, shard_of, unmix_keys
from lifeboat_cache.tiers.segments import snapshot_file as snap
from lifeboat_cache.tiers.segments.snapshot_file import SNAPSHOT_NAME

N = 3 * PER_UNIT + 77


def _store(tmp_path: Path) -> tuple[str, np.ndarray]:
    """A directory of sealed segments and a clean close's snapshot of them."""
    root = str(tmp_path)
    keys = make_store(root, N)
    d = open_dir(root)
    d.open(background=False)
    d.close()
    assert os.path.exists(os.path.join(root, SNAPSHOT_NAME))
    return root, keys


def _reopen(root: str):
    d = open_dir(root)
    d.open(background=False)
    d.stop_refresh()  # no refresh thread work, no snapshot save
    return d


def _assert_full(d, keys: np.ndarray, root: str) -> None:
    """Every key indexed exactly once, at its record (unit i // PER_UNIT, offset (i % PER_UNIT) << 16)."""
    assert d.rebuilt and len(d.index) == len(keys)
    names = sorted(f for f in os.listdir(root) if f.endswith(".seg"))
    found, units, offs, lens = d.index.locate(keys)
    assert found.all()
    want_names = [names[i // PER_UNIT] for i in range(len(keys))]
    assert [d.unit_name(int(u)) for u in units] == want_names
    assert (offs == (np.arange(len(keys), dtype=np.uint64) % PER_UNIT) << np.uint64(16)).all()
    assert (lens == 1 << 16).all()


def test_round_trip_uses_the_snapshot_and_scans_nothing(tmp_path: Path) -> None:
    root, keys = _store(tmp_path)
    s = snap.parse(Path(root, SNAPSHOT_NAME).read_bytes())
    assert s.dropped == 0 and sorted(s.keys.tolist()) == sorted(keys.tolist())
    d = _reopen(root)
    _assert_full(d, keys, root)
    c = d.counters
    assert c["snapshot_discarded"] == 0 and c["snapshot_mismatched_units"] == 0 and c["snapshot_dropped_entries"] == 0
    assert c["scan_records"] == 0  # every entry came from the snapshot, every trailer only checked


def test_each_shard_answers_once_loaded_and_misses_before(tmp_path: Path) -> None:
    """Between two shard installs, a key of a loaded shard hits at its right place and a key of a shard
    not yet loaded misses: never a wrong location."""
    root, keys = _store(tmp_path)
    d = open_dir(root)
    truth = {}
    names = sorted(f for f in os.listdir(root) if f.endswith(".seg"))
    for i, k in enumerate(keys.tolist()):
        truth[k] = (names[i // PER_UNIT], (i % PER_UNIT) << 16)
    shard = shard_of(mix_keys(keys))
    seen: list[int] = []
    real = d.index.insert_sorted_shard

    def spy(s, *a, **kw):
        real(s, *a, **kw)
        seen.append(s)
        found, units, offs, _ = d.index.locate(keys)
        loaded = np.isin(shard, seen)
        assert (found == loaded).all(), f"after shard {s}: a loaded key missed or a pending one hit"
        for i in np.flatnonzero(found)[::97].tolist():
            assert (d.unit_name(int(units[i])), int(offs[i])) == truth[int(keys[i])]
        assert not d.index.contains(keys[~loaded]).any()

    d.index.insert_sorted_shard = spy  # type: ignore[method-assign]
    d.open(background=False)
    d.stop_refresh()
    assert sorted(seen) == sorted(set(shard.tolist())) and seen == sorted(seen)
    _assert_full(d, keys, root)


def _expect_rescan(root: str, keys: np.ndarray, caplog, message: str) -> None:
    with caplog.at_level(logging.WARNING):
        d = _reopen(root)
    _assert_full(d, keys, root)
    assert d.counters["snapshot_discarded"] == 1
    assert d.counters["scan_records"] == len(keys)  # rebuilt by the scan
    hits = [r for r in caplog.records if "ignoring index snapshot" in r.getMessage()]
    assert len(hits) == 1 and message in hits[0].getMessage(), [r.getMessage() for r in caplog.records]


def test_version_mismatch_is_dropped_and_rescanned(tmp_path: Path, caplog) -> None:
    root, keys = _store(tmp_path)
    p = Path(root, SNAPSHOT_NAME)
    data = bytearray(p.read_bytes())
    data[8:12] = (snap.SNAPSHOT_VERSION + 1).to_bytes(4, "little")
    p.write_bytes(bytes(data))
    _expect_rescan(root, keys, caplog, f"snapshot version {snap.SNAPSHOT_VERSION + 1}")


@pytest.mark.parametrize("cut", [1, 24, 5000, 10**9])
def test_truncated_file_is_dropped_and_rescanned(tmp_path: Path, caplog, cut: int) -> None:
    root, keys = _store(tmp_path)
    p = Path(root, SNAPSHOT_NAME)
    data = p.read_bytes()
    p.write_bytes(data[:max(0, len(data) - cut)])
    _expect_rescan(root, keys, caplog, "truncated" if cut < len(data) else "")


def test_flipped_byte_in_one_shard_block_drops_the_loaded_shards_too(tmp_path: Path, caplog) -> None:
    root, keys = _store(tmp_path)
    p = Path(root, SNAPSHOT_NAME)
    r, fd = snap.open_reader(p)
    os.close(fd)
    s = SHARDS // 2  # shards before it are already in the index when its checksum fails
    at = r.data_at + snap.ENTRY_BYTES * sum(r.counts[:s]) + 16 * r.counts[s] + 3  # a byte of a unit id
    data = bytearray(p.read_bytes())
    data[at] ^= 0x10
    p.write_bytes(bytes(data))
    _expect_rescan(root, keys, caplog, f"shard {s}: checksum mismatch")


def test_stale_snapshot_against_segments(tmp_path: Path, caplog) -> None:
    """Segments changed since the save: one gone, one grown (new trailer), one rewritten with the same
    name and size but other records, one new. The snapshot's entries of each are left out or dropped
    after the trailer check; everything ends at its true place."""
    root, keys = _store(tmp_path)
    names = sorted(f for f in os.listdir(root) if f.endswith(".seg"))
    saved = Path(root, SNAPSHOT_NAME).read_bytes()
    # unit 1 rewritten in place: same name and size, its keys at other records (the snapshot now lies
    # about it)
    part = keys[PER_UNIT:2 * PER_UNIT].copy()
    rng = np.random.default_rng(3)
    rng.shuffle(part)
    import struct
    import zlib

    from lifeboat_cache.records.trailer import FOOTER, FOOTER_MAGIC, TABLE_ENTRY

    table = np.zeros(len(part), dtype=TABLE_ENTRY)
    table["key"] = part
    table["offset"] = np.arange(len(part), dtype=np.uint64) << np.uint64(16)
    table["length"] = table["raw_length"] = 1 << 16
    blob = b"LBTB" + table.tobytes()
    at = len(part) << 16
    footer = FOOTER.pack(FOOTER_MAGIC, len(part), at, zlib.crc32(blob))
    with open(os.path.join(root, names[1]), "r+b") as f:
        f.seek(at)
        f.write(blob + footer + struct.pack("<I", zlib.crc32(footer)))
    keys = keys.copy()
    keys[PER_UNIT:2 * PER_UNIT] = part
    # unit 3 (the last, partly full) is removed; a new one appears after it
    os.unlink(os.path.join(root, names[3]))
    keep = np.r_[0:3 * PER_UNIT]
    keys = np.concatenate([keys[keep], make_store(root, PER_UNIT // 2, first_unit=4)])
    Path(root, SNAPSHOT_NAME).write_bytes(saved)
    with caplog.at_level(logging.WARNING):
        d = _reopen(root)
    assert d.counters["snapshot_discarded"] == 0
    assert d.counters["snapshot_mismatched_units"] == 1  # unit 1: same count, other entries (hash sums)
    assert d.counters["snapshot_dropped_entries"] == N - 3 * PER_UNIT  # unit 3's: its file is gone
    names = sorted(f for f in os.listdir(root) if f.endswith(".seg"))
    assert len(d.index) == len(keys)
    found, units, offs, _ = d.index.locate(keys)
    assert found.all()
    for i in range(0, len(keys), 31):
        u = i // PER_UNIT
        assert d.unit_name(int(units[i])) == names[u] and int(offs[i]) == (i % PER_UNIT) << 16


def test_snapshot_naming_entries_outside_the_trailer_is_caught_with_fewer_entries(tmp_path: Path) -> None:
    """A unit with fewer snapshot entries than trailer rows (keys written again elsewhere): a lying entry
    among them is caught by the index lookup of the trailer, and the unit is rescanned."""
    root, keys = _store(tmp_path)
    s = snap.parse(Path(root, SNAPSHOT_NAME).read_bytes())
    first = next(u.id for u in s.units if u.name == sorted(f for f in os.listdir(root) if f.endswith(".seg"))[0])
    mine = np.flatnonzero(s.unit_ids == first)
    drop, lie = mine[:10], mine[10]
    offs = s.offsets.copy()
    offs[lie] += np.uint64(1 << 16)  # points at another record of the same unit
    keep = np.setdiff1d(np.arange(len(s.keys)), drop)
    Path(root, SNAPSHOT_NAME).write_bytes(snap.encode(s.units, s.keys[keep], s.unit_ids[keep], offs[keep],
                                                      s.lengths[keep]))
    d = _reopen(root)
    assert d.counters["snapshot_mismatched_units"] == 1 and d.counters["snapshot_discarded"] == 0
    _assert_full(d, keys, root)
    # the same without the lie: fewer entries only; the trailer fills in the rest, no unit is dropped
    Path(root, SNAPSHOT_NAME).write_bytes(snap.encode(s.units, s.keys[keep], s.unit_ids[keep],
                                                      s.offsets[keep], s.lengths[keep]))
    d = _reopen(root)
    assert d.counters["snapshot_mismatched_units"] == 0
    _assert_full(d, keys, root)


def test_old_npz_snapshot_is_removed_and_the_index_scanned(tmp_path: Path, caplog) -> None:
    root, keys = _store(tmp_path)
    os.unlink(os.path.join(root, SNAPSHOT_NAME))
    old = Path(root, "index.snapshot.npz")
    np.savez(old, keys=keys)  # a format-1 file (its content is never read)
    _expect_rescan(root, keys, caplog, "older snapshot format")
    assert not old.exists()


def test_crashed_save_leaves_a_temp_file_that_is_ignored(tmp_path: Path, monkeypatch) -> None:
    root, keys = _store(tmp_path)
    good = Path(root, SNAPSHOT_NAME).read_bytes()
    # a save that dies half way (here: an error from the index export) keeps the old snapshot whole
    d = _reopen(root)
    real = d.index.export_shards

    def dying():
        for i, part in enumerate(real()):
            if i == 5:
                raise OSError(28, "No space left on device")
            yield part

    monkeypatch.setattr(d.index, "export_shards", dying)
    d.save_snapshot()
    assert Path(root, SNAPSHOT_NAME).read_bytes() == good
    assert not [f for f in os.listdir(root) if f.endswith(".tmp")]
    # a process killed mid-save leaves its temp file: ignored on open, removed once surely stale
    young = Path(root, f".{SNAPSHOT_NAME}.0123456789abcdef.tmp")
    stale = Path(root, f".{SNAPSHOT_NAME}.fedcba9876543210.tmp")
    for p in (young, stale):
        p.write_bytes(good[: len(good) // 2])
    past = time.time() - 2 * snap.STALE_TEMP_S
    os.utime(stale, (past, past))
    d = _reopen(root)
    _assert_full(d, keys, root)
    assert d.counters["snapshot_discarded"] == 0 and d.counters["scan_records"] == 0
    assert young.exists() and not stale.exists()  # a young one may be another process's save in flight


# ------------------------------------------------------------------ Index: the shard API itself
def _columns(n: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(-2**63, 2**63 - 1, n, dtype=np.int64))
    rng.shuffle(keys)
    return keys, rng.integers(1, 50, len(keys)).astype(np.uint32), \
        rng.integers(0, 1 << 40, len(keys)).astype(np.uint64), rng.integers(64, 1 << 20, len(keys)).astype(np.uint32)


def test_export_shards_round_trips_through_insert_sorted_shard_with_pending_changes() -> None:
    keys, units, offs, lens = _columns(20000)
    ix = Index(delta_limit=512)
    ix.insert_arrays(keys[:15000], units[:15000], offs[:15000], lens[:15000])
    for k, u in zip(keys[15000:16000].tolist(), units[15000:16000].tolist()):  # in deltas (some merged)
        ix.insert(k, Loc(u, 7, 100))
    for k in keys[:50].tolist():  # removals pending
        assert ix.remove_if_match(k, ix.get(k))
    ix.drop_units([3, 4])
    model = {k: loc for k, loc in ix.items()}
    out = Index()
    last = -1
    for s, x, u, o, ln in ix.export_shards():
        assert s > last and (len(x) < 2 or (x[1:] > x[:-1]).all()) and (shard_of(x) == s).all()
        last = s
        out.insert_sorted_shard(s, x, u, o, ln, total_hint=len(model))
    assert dict(out.items()) == model and len(out) == len(model)


def test_insert_sorted_shard_checks_its_input_and_never_overrides_what_is_there() -> None:
    keys, units, offs, lens = _columns(4000, seed=1)
    x = mix_keys(keys)
    order = np.argsort(x)
    x, units, offs, lens = x[order], units[order], offs[order], lens[order]
    s = int(shard_of(x[:1])[0])
    mine = shard_of(x) == s
    ix = Index()
    with pytest.raises(ValueError, match="strictly increasing"):
        ix.insert_sorted_shard(s, x[mine][::-1].copy(), units[mine], offs[mine], lens[mine])
    with pytest.raises(ValueError, match="of that shard"):
        ix.insert_sorted_shard((s + 1) % SHARDS, x[mine], units[mine], offs[mine], lens[mine])
    k0 = int(unmix_keys(x[mine][:1])[0])
    ix.insert(k0, Loc(999, 1, 64))  # a newer write of a key the shard also holds, merged first
    ix.settle()
    u = units[mine].copy()
    u[1] = DEAD  # an entry left out
    ix.insert_sorted_shard(s, x[mine], u, offs[mine], lens[mine])
    assert ix.get(k0) == Loc(999, 1, 64)
    assert ix.get(int(unmix_keys(x[mine][1:2])[0])) is None
    assert len(ix) == int(mine.sum()) - 1
    others = unmix_keys(x[~mine])
    assert not ix.contains(others).any()


def test_drop_units_forgets_many_units_in_main_and_deltas() -> None:
    keys, units, offs, lens = _columns(5000, seed=2)
    ix = Index()
    ix.insert_arrays(keys, units, offs, lens)
    ix.insert(12345, Loc(7, 0, 64))
    gone = {7, 8, 9, 40}
    n = ix.drop_units(gone)
    assert n == int(np.isin(units, list(gone)).sum()) + 1
    left = {k for k, loc in ix.items()}
    assert left == {int(k) for k, u in zip(keys.tolist(), units.tolist()) if u not in gone}
    found, u, _, _ = ix.locate(keys)
    assert (found == ~np.isin(units, list(gone))).all() and not set(u[found].tolist()) & gone


def test_every_unit_is_checked_whatever_the_order_of_lies(tmp_path: Path) -> None:
    """A same-count lie (two entries' offsets swapped: only the hash sums tell) in the first unit and a
    fewer-entries lie in the last: both units are caught and rescanned."""
    root, keys = _store(tmp_path)
    s = snap.parse(Path(root, SNAPSHOT_NAME).read_bytes())
    names = sorted(f for f in os.listdir(root) if f.endswith(".seg"))
    ids = {u.name: u.id for u in s.units}
    first = np.flatnonzero(s.unit_ids == ids[names[0]])
    last = np.flatnonzero(s.unit_ids == ids[names[-1]])
    offs = s.offsets.copy()
    offs[first[0]], offs[first[1]] = offs[first[1]], offs[first[0]]
    offs[last[5]] += np.uint64(1 << 16)
    keep = np.setdiff1d(np.arange(len(s.keys)), last[:5])
    Path(root, SNAPSHOT_NAME).write_bytes(snap.encode(s.units, s.keys[keep], s.unit_ids[keep], offs[keep],
                                                      s.lengths[keep]))
    d = _reopen(root)
    assert d.counters["snapshot_mismatched_units"] == 2
    _assert_full(d, keys, root)
