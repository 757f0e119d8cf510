"""Item 2 (and item 1 under many faults): garbage metadata never stops the store from opening, and
no mix of data and metadata faults makes it serve a wrong page or lose a page whose record is intact.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import child
import numpy as np
from harness import FIGURES, STRESS, check, cli, config, record_map, run_writer, snapshot_tree, write_keys
from hypothesis import HealthCheck, given, settings, strategies as st

from lifeboat_cache.records.keys import key_digest
from lifeboat_cache.tiers.segments import quarantine as qlist, snapshot_file as snap

QUARANTINE_GARBAGE = [
    b"\xff\xfe\x00garbage that is not UTF-8\n",
    b'{"segment": "%s", "offset": 1e49242}\n',
    b'{"segment": "%s", "offset": "12"}\n',
    b'{"segment": "%s", "offset": -5}\n',
    b'{"segment": "%s", "offset": 1' + b"0" * 5000 + b"}\n",
    b'{"segment": "../../../etc/passwd", "offset": 0}\n',
    b'{"segment": ["x"], "offset": 0}\n',
    b"[" * 100000 + b"\n",
    b"null\n",
    b'{"segment": "%s", "off',  # truncated line (no newline)
]


def _garbage_line(rng: random.Random, segs: list[str]) -> bytes:
    g = rng.choice(QUARANTINE_GARBAGE)
    return g.replace(b"%s", rng.choice(segs).encode()) if b"%s" in g else g


def _wrong_snapshot(rng: random.Random, store: Path, segs: list[Path]) -> bytes:
    """A structurally valid snapshot that lies: entries moved, keys swapped, a unit id of 2^32-2."""
    try:
        s = snap.parse((store / snap.SNAPSHOT_NAME).read_bytes())
        units, keys, uids, offs, lens = s.units, s.keys.copy(), s.unit_ids.copy(), s.offsets.copy(), s.lengths.copy()
    except (OSError, snap.SnapshotError):  # none (or already broken): claim every segment is sealed
        units = [snap.SnapshotUnit(p.name, i + 1, p.stat().st_size, True) for i, p in enumerate(segs)]
        n = 64
        keys = np.array([rng.getrandbits(63) for _ in range(n)], np.int64)
        uids = np.array([rng.randint(1, len(units)) for _ in range(n)], np.uint32)
        offs = np.array([rng.randrange(0, 1 << 20, 64) for _ in range(n)], np.uint64)
        lens = np.full(n, 16448, np.uint32)
    if len(keys) > 1:
        how = rng.randrange(3)
        if how == 0:
            offs = np.roll(offs, 1)
        elif how == 1:
            keys = np.roll(keys, 1)
        elif units:
            first, huge = units[0].id, snap.MAX_UNIT_ID
            units = [snap.SnapshotUnit(u.name, huge if u.id == first else u.id, u.scanned, u.sealed) for u in units]
            uids = np.where(uids == first, huge, uids).astype(np.uint32)
    return snap.encode(units, keys, uids.astype(np.uint32), offs.astype(np.uint64), lens.astype(np.uint32))


def _inject(rng: random.Random, store: Path, n: int) -> set[tuple[str, int, int]]:
    """n faults over segments (flips, zeroed ranges, trailer hits) and metadata (quarantine, snapshot).

    Returns the damaged byte ranges (segment, start, end) of the data files.
    """
    segs = sorted(store.glob("*.seg"))
    damaged: set[tuple[str, int, int]] = set()
    for _ in range(n):
        kind = rng.choice(["flip", "flip", "zero", "trailer", "quarantine", "snapshot_flip", "snapshot_wrong"])
        seg = rng.choice(segs)
        size = seg.stat().st_size
        if kind in ("flip", "zero", "trailer") and size:
            if kind == "zero":
                start = rng.randrange(size)
                end = min(size, start + rng.randint(1, 40000))
            else:
                start = rng.randrange(max(0, size - 300) if kind == "trailer" else 0, size)
                end = start + 1
            with open(seg, "r+b") as f:
                f.seek(start)
                old = f.read(end - start)
                f.seek(start)
                f.write(bytes(end - start) if kind == "zero" else bytes([old[0] ^ (1 << rng.randrange(8))]))
            damaged.add((seg.name, start, end))
        elif kind == "quarantine":
            with open(store / qlist.QUARANTINE_NAME, "ab") as f:
                f.write(_garbage_line(rng, [p.name for p in segs]))
        elif kind == "snapshot_flip" and (store / snap.SNAPSHOT_NAME).exists():
            p = store / snap.SNAPSHOT_NAME
            data = bytearray(p.read_bytes())
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            p.write_bytes(bytes(data))
        else:
            (store / snap.SNAPSHOT_NAME).write_bytes(_wrong_snapshot(rng, store, segs))
    FIGURES.faults += n
    return damaged


def test_garbage_quarantine_list_and_huge_unit_id_never_stop_open(tmp_path: Path) -> None:
    store = tmp_path / "store"
    cfg = config(tmp_path, store)
    acked = run_writer(cfg, 2, 24, close=True)
    segs = [p.name for p in store.glob("*.seg")]
    rng = random.Random(5)
    (store / qlist.QUARANTINE_NAME).write_bytes(b"".join(_garbage_line(rng, segs) for _ in range(40))
                                                + QUARANTINE_GARBAGE[-1].replace(b"%s", segs[0].encode()))
    # a 1 KB snapshot naming unit 2^32-2 must not make open allocate per unit id
    (store / snap.SNAPSHOT_NAME).write_bytes(snap.encode(
        [snap.SnapshotUnit(segs[0], snap.MAX_UNIT_ID, 1, True)], np.zeros(1, np.int64),
        np.full(1, snap.MAX_UNIT_ID, np.uint32), np.zeros(1, np.uint64), np.full(1, 64, np.uint32)))
    FIGURES.trials += 1
    FIGURES.faults += 42
    (res,) = check(cfg, write_keys(tmp_path / "keys", acked, set(acked)))
    assert res["wrong"] == 0 and res["lost"] == 0, res
    for cmd in (["verify", "--quiet"], ["stats"]):
        r = cli(cfg, *cmd)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr


def test_data_and_metadata_fault_campaign(tmp_path: Path) -> None:
    """Flips, zeroed ranges and trailer hits in sealed and unsealed segments, garbage quarantine lines,
    flipped and lying snapshots. Every page is either byte-exact or a miss, and only pages whose own
    record bytes were hit may be missing; `verify` changes nothing, `verify --fix` loses nothing."""
    rng = random.Random(20261201)
    trials, per = (40, 25) if STRESS else (1, 20)
    for trial in range(trials):
        root = tmp_path / f"t{trial}"
        store = root / "store"
        root.mkdir()
        cfg = config(root, store)
        close = trial % 2 == 0  # sealed segments + snapshot, or a SIGKILL leaving them unsealed
        acked = run_writer(cfg, 3, 40, close=close)
        by_digest = {key_digest(child.NS, k): k for k in acked}
        where = {}
        for seg in store.glob("*.seg"):
            for off, length, digest in record_map(seg):
                where[by_digest[digest]] = (seg.name, off, off + length)
        assert len(where) == len(acked)
        damaged = _inject(rng, store, per)
        hit = {k for k, (name, a, b) in where.items() if any(n == name and s < b and e > a for n, s, e in damaged)}
        FIGURES.trials += 1
        FIGURES.expected_lost += len(hit)
        keys = write_keys(root / "keys", acked, set(acked))
        (res,) = check(cfg, keys)
        assert res["wrong"] == 0, res
        assert set(res["lost_keys"]) <= hit, sorted(set(res["lost_keys"]) - hit)
        before = snapshot_tree(store)
        r = cli(cfg, "verify", "--quiet")
        assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.stderr
        assert snapshot_tree(store) == before, "verify without --fix changed files"
        r = cli(cfg, "verify", "--quiet", "--fix")
        assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.stderr
        (res,) = check(cfg, keys)
        assert res["wrong"] == 0 and set(res["lost_keys"]) <= hit, res
        FIGURES.acked_lost += len(set(res["lost_keys"]) - hit)


# ---------------------------------------------------------------- property-based loaders
_HYP = settings(max_examples=400 if STRESS else 60, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


def _valid_snapshot() -> bytes:
    return snap.encode([snap.SnapshotUnit("0000000000001-h-1-abc000001.seg", 1, 1 << 20, True),
                        snap.SnapshotUnit("0000000000002-h-1-abc000002.seg", 7, 5000, False)],
                       np.arange(4, dtype=np.int64), np.array([1, 7, 7, 9], np.uint32),
                       np.array([0, 64, 4990, 0], np.uint64), np.array([100, 200, 100, 100], np.uint32))


VALID_SNAPSHOT = _valid_snapshot()


def test_snapshot_loader_keeps_only_entries_inside_listed_units() -> None:
    s = snap.parse(VALID_SNAPSHOT)
    assert sorted(s.keys.tolist()) == [0, 1] and s.dropped == 2  # past its unit's end; unknown unit 9


@_HYP
@given(st.binary(max_size=4096))
def test_snapshot_loader_rejects_arbitrary_bytes_cleanly(data: bytes) -> None:
    try:
        snap.parse(data)
    except snap.SnapshotError:
        pass


@_HYP
@given(st.lists(st.tuples(st.integers(0, len(VALID_SNAPSHOT) - 1), st.integers(0, 255)), min_size=1, max_size=8),
       st.integers(0, len(VALID_SNAPSHOT)))
def test_snapshot_loader_survives_mutations(edits: list[tuple[int, int]], cut: int) -> None:
    data = bytearray(VALID_SNAPSHOT)
    for i, v in edits:
        data[i] = v
    try:
        s = snap.parse(bytes(data[:cut] if cut % 3 == 0 else data))
    except snap.SnapshotError:
        return
    ids = {u.id for u in s.units}
    assert all(1 <= i <= snap.MAX_UNIT_ID for i in ids)
    assert set(s.unit_ids.tolist()) <= ids and len(s.keys) == len(s.offsets) == len(s.lengths)


_JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
                        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4),
                        max_leaves=10)


@_HYP
@given(st.lists(st.one_of(st.binary(max_size=120),
                          _JSONISH.map(lambda v: json.dumps(v).encode()),
                          st.fixed_dictionaries({"segment": st.one_of(st.text(max_size=40), st.just(
                              "0000000000001-h-1-abc000001.seg")), "offset": _JSONISH}).map(
                              lambda v: json.dumps(v).encode())), max_size=20),
       st.booleans())
def test_quarantine_loader_never_raises_and_keeps_only_valid_entries(lines: list[bytes], trailing: bool) -> None:
    data = b"\n".join(lines) + (b"\n" if trailing else b"")
    entries, bad = qlist.parse(data)
    for name, off in entries:
        assert isinstance(name, str) and isinstance(off, int) and not isinstance(off, bool) and off >= 0
        assert name.endswith(".seg") and "/" not in name
    assert len(entries) + bad <= len([ln for ln in data.split(b"\n") if ln.strip()])
