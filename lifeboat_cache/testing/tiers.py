"""TierTests: the behaviour every storage tier must have, as one pytest suite.

Each tier's test class subclasses `TierTests` and provides:
  * `make_tier(where, capacity_bytes=None)`: a new, opened tier (index rebuilt) over `where`;
    called again with the same `where`, it must see what the earlier instance stored (a restart);
  * a `where` fixture (default: pytest's `tmp_path`), e.g. a unique S3 prefix;
  * raw helpers that bypass the tier, so the tier is checked against ground truth:
    `raw_bytes(tier, ref)`, `raw_corrupt(tier, ref, at)`, `raw_truncate(tier, ref)` and
    `raw_add_torn_unit(tier, where, records)` (a unit left by a writer that died mid-record).
A missing ability is a class flag; the tests that need it call `pytest.skip`.

Only pytest is imported here, at use: the package does not depend on it.
"""

from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from ..config import EngineSettings, Settings, TierSettings
from ..records import DTYPE_CODES, HEADER_SIZE, build_record, index_key, key_digest, namespace_fingerprint
from ..store import ChunkStore
from ..tiers import Auditing, Describing, Marking, ObjectPurging, Probing, RecordRuns, Ref, SegmentDirs, Tier

# capability mixin -> the attribute a tier must have exactly when it declares the mixin
CAPABILITIES: dict[type, str] = {Probing: "probe", Auditing: "audit", Describing: "describe",
                                 SegmentDirs: "dirs", ObjectPurging: "purge_objects", RecordRuns: "read_run",
                                 Marking: "write_mark"}

NS = namespace_fingerprint(model="tier-conformance", dtype="uint8")


@dataclass(frozen=True)
class Rec:
    """One record built the way the store builds it (raw codec, so payload == page bytes)."""

    key: str
    ikey: int
    digest: bytes
    header: bytes
    page: np.ndarray

    @property
    def length(self) -> int:
        return HEADER_SIZE + self.page.nbytes

    @property
    def bufs(self) -> list[object]:
        return [self.header, self.page]

    @property
    def blob(self) -> bytes:
        return self.header + self.page.tobytes()


def make_records(n: int, *, size: int = 4096, seed: int = 0, prefix: str = "k", ns: bytes = NS) -> list[Rec]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        key = f"{prefix}{seed}-{i:05d}"
        digest = key_digest(ns, key)
        page = rng.integers(0, 256, size, dtype=np.uint8)
        header, _, _ = build_record(page, itemsize=1, dtype=DTYPE_CODES["u1"], digest=digest,
                                          namespace=ns, compress=False)
        out.append(Rec(key, index_key(digest), digest, header, page))
    return out


def write_all(tier: Tier, recs: list[Rec]) -> list[Ref]:
    return [tier.write(r.ikey, r.digest, r.bufs, r.length) for r in recs]


def read_blob(tier: Tier, ref: Ref) -> bytes | None:
    buf = bytearray(ref.length)
    return bytes(buf) if tier.read_into(ref, [memoryview(buf)]) else None


def store_over(tier: Tier, io_workers: int = 4) -> ChunkStore:
    """A ChunkStore on just this tier, for checks that need record verification."""
    eng = EngineSettings(io_workers=io_workers, failure_cooldown_s=0.05, failure_cooldown_max_s=0.1)
    return ChunkStore(Settings(storage=(TierSettings(type="local"),), engine=eng), [tier])


class TierTests:
    """Subclass as `class TestMyTier(TierTests)`; see the module docstring."""

    torn_unit_keeps_prefix = True  # records before the tear of a dead writer's unit are served
    forget_survives_reopen = True
    supports_capacity = True
    durable = True  # a new instance over the same `where` sees the old records

    # ---------------------------------------------------------------- subclass API
    def make_tier(self, where: Any, capacity_bytes: int | None = None) -> Tier:
        raise NotImplementedError

    def raw_bytes(self, tier: Tier, ref: Ref) -> bytes:
        raise NotImplementedError

    def raw_corrupt(self, tier: Tier, ref: Ref, at: int) -> None:
        """Flip the byte `at` bytes into the record at ref."""
        raise NotImplementedError

    def raw_truncate(self, tier: Tier, ref: Ref) -> None:
        """Cut the unit holding ref in the middle of that record."""
        raise NotImplementedError

    def raw_add_torn_unit(self, tier: Tier, where: Any, recs: list[Rec]) -> None:
        """Leave a unit holding recs, then half of one more record, as a crashed writer would."""
        raise NotImplementedError

    # ---------------------------------------------------------------- fixtures
    @pytest.fixture
    def where(self, tmp_path: Path) -> Any:
        return tmp_path

    @pytest.fixture
    def opened(self) -> Iterator[list[Tier]]:
        tiers: list[Tier] = []
        yield tiers
        for t in tiers:
            try:
                t.close()
            except Exception:  # noqa: BLE001 - a second close must not mask the test's result
                pass

    @pytest.fixture
    def tier(self, where: Any, opened: list[Tier]) -> Tier:
        return self._open(where, opened)

    def _open(self, where: Any, opened: list[Tier], capacity_bytes: int | None = None) -> Tier:
        t = self.make_tier(where, capacity_bytes=capacity_bytes)
        assert t.wait_rebuilt(30), "index rebuild did not finish"
        opened.append(t)
        return t

    # ---------------------------------------------------------------- behaviour
    def test_empty_tier_contains_nothing(self, tier: Tier) -> None:
        recs = make_records(3)
        assert not tier.contains(np.array([r.ikey for r in recs], dtype=np.int64)).any()
        assert all(tier.locate(r.ikey) is None for r in recs)
        assert list(tier.records()) == []

    @pytest.mark.parametrize("size", [1, 4096, 300_000])
    def test_write_then_read_round_trip(self, tier: Tier, size: int) -> None:
        recs = make_records(5, size=size)
        refs = write_all(tier, recs)
        assert tier.contains(np.array([r.ikey for r in recs], dtype=np.int64)).all()
        for r, ref in zip(recs, refs):
            assert tier.locate(r.ikey) == ref
            assert read_blob(tier, ref) == r.blob
            assert self.raw_bytes(tier, ref) == r.blob  # ground truth, not the tier's own view

    def test_read_into_scatters_over_several_buffers(self, tier: Tier) -> None:
        (r,) = make_records(1, size=10_000)
        ref = tier.write(r.ikey, r.digest, r.bufs, r.length)
        hdr, a, b = bytearray(HEADER_SIZE), np.empty(3000, np.uint8), np.empty(7000, np.uint8)
        assert tier.read_into(ref, [memoryview(hdr), memoryview(a), memoryview(b)])
        assert bytes(hdr) == r.header and (np.concatenate([a, b]) == r.page).all()

    def test_write_many_round_trip(self, tier: Tier) -> None:
        recs = make_records(20, size=2048)
        refs = tier.write_many([(r.ikey, r.digest, r.bufs, r.length) for r in recs])
        assert len(refs) == 20
        assert [read_blob(tier, ref) for ref in refs] == [r.blob for r in recs]

    def test_rewrite_points_at_the_new_record(self, tier: Tier) -> None:
        (r,) = make_records(1)
        first = tier.write(r.ikey, r.digest, r.bufs, r.length)
        second = tier.write(r.ikey, r.digest, r.bufs, r.length)
        assert first != second and tier.locate(r.ikey) == second
        assert read_blob(tier, second) == r.blob

    def test_records_lists_every_record(self, tier: Tier) -> None:
        recs = make_records(30)
        write_all(tier, recs)
        assert sorted(k for k, _ in tier.records()) == sorted(r.ikey for r in recs)

    def test_concurrent_writers_and_readers(self, tier: Tier) -> None:
        recs = make_records(160, size=1024)
        errors: list[BaseException] = []

        def work(part: list[Rec]) -> None:
            try:
                for r in part:
                    ref = tier.write(r.ikey, r.digest, r.bufs, r.length)
                    assert read_blob(tier, ref) == r.blob
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                errors.append(e)

        threads = [threading.Thread(target=work, args=(recs[i::8],)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[0]
        for r in recs:
            ref = tier.locate(r.ikey)
            assert ref is not None and read_blob(tier, ref) == r.blob

    def test_reopen_rebuilds_the_index(self, tier: Tier, where: Any, opened: list[Tier]) -> None:
        if not self.durable:
            pytest.skip("tier is not durable")
        recs = make_records(50, size=3000)
        write_all(tier, recs[:25])
        tier.flush()
        write_all(tier, recs[25:])
        tier.close()
        again = self._open(where, opened)
        assert again.contains(np.array([r.ikey for r in recs], dtype=np.int64)).all()
        for r in recs:
            assert read_blob(again, again.locate(r.ikey)) == r.blob  # type: ignore[arg-type]

    def test_forget_drops_the_record(self, tier: Tier, where: Any, opened: list[Tier]) -> None:
        recs = make_records(4)
        refs = write_all(tier, recs)
        tier.forget(recs[1].ikey, refs[1], "test")
        assert tier.locate(recs[1].ikey) is None
        assert tier.locate(recs[2].ikey) == refs[2]
        if not (self.durable and self.forget_survives_reopen):
            return
        tier.close()
        again = self._open(where, opened)
        assert again.locate(recs[1].ikey) is None, "a forgotten record came back after a rescan"
        assert again.locate(recs[2].ikey) is not None

    def test_forget_keeps_a_newer_record(self, tier: Tier) -> None:
        (r,) = make_records(1)
        old = tier.write(r.ikey, r.digest, r.bufs, r.length)
        new = tier.write(r.ikey, r.digest, r.bufs, r.length)
        tier.forget(r.ikey, old, "test")  # remove-if-match: the newer location survives
        assert tier.locate(r.ikey) == new

    def test_corrupt_payload_is_miss_and_dropped(self, tier: Tier) -> None:
        st = store_over(tier)
        pages = [r.page for r in make_records(6)]
        keys = [f"c{i}" for i in range(6)]
        assert all(st.put(NS, keys, pages))
        ref = tier.locate(index_key(key_digest(NS, keys[2])))
        assert ref is not None
        self.raw_corrupt(tier, ref, HEADER_SIZE + 100)
        out = [np.empty_like(p) for p in pages]
        ok = st.get_into(NS, keys, out)
        assert ok == [True, True, False, True, True, True]
        assert st.counters.get("miss_checksum") == 1
        assert st.contains(NS, keys) == [True, True, False, True, True, True]
        assert all((o == p).all() for o, p, good in zip(out, pages, ok) if good)

    def test_corrupt_header_is_miss(self, tier: Tier) -> None:
        st = store_over(tier)
        pages = [r.page for r in make_records(2)]
        assert all(st.put(NS, ["h0", "h1"], pages))
        ref = tier.locate(index_key(key_digest(NS, "h1")))
        self.raw_corrupt(tier, ref, 20)  # type: ignore[arg-type]
        out = [np.empty_like(p) for p in pages]
        assert st.get_into(NS, ["h0", "h1"], out) == [True, False]
        assert st.counters.get("miss_header") == 1

    def test_truncated_unit_is_miss_not_error(self, tier: Tier) -> None:
        st = store_over(tier)
        pages = [r.page for r in make_records(4, size=8192)]
        keys = [f"t{i}" for i in range(4)]
        assert all(st.put(NS, keys, pages))
        tier.flush()
        ref = tier.locate(index_key(key_digest(NS, keys[3])))
        self.raw_truncate(tier, ref)  # type: ignore[arg-type]
        out = [np.empty_like(p) for p in pages]
        ok = st.get_into(NS, keys, out)  # must not raise
        assert ok[3] is False
        assert st.counters.get("read_errors") == 0, "a truncated unit is a miss, not a tier failure"

    def test_torn_tail_is_ignored(self, tier: Tier, where: Any, opened: list[Tier]) -> None:
        if not self.durable:
            pytest.skip("tier is not durable")
        good = make_records(3, seed=7)
        write_all(tier, good)
        tier.close()
        torn = make_records(3, seed=8)
        self.raw_add_torn_unit(tier, where, torn)
        again = self._open(where, opened)
        for r in good:
            assert read_blob(again, again.locate(r.ikey)) == r.blob  # type: ignore[arg-type]
        for r in torn:
            ref = again.locate(r.ikey)
            if self.torn_unit_keeps_prefix:
                assert ref is not None and read_blob(again, ref) == r.blob
            else:
                assert ref is None
        st = store_over(again)
        assert st.verify() == []

    def test_capacity_evicts_whole_oldest_units(self, where: Any, opened: list[Tier]) -> None:
        if not self.supports_capacity:
            pytest.skip("tier has no capacity bound")
        cap = 2 << 20
        tier = self._open(where, opened, capacity_bytes=cap)
        old = make_records(40, size=32 << 10, seed=1)
        old_refs = write_all(tier, old)
        tier.flush()
        new = make_records(40, size=32 << 10, seed=2)
        write_all(tier, new)
        tier.flush()
        for _ in range(100):
            tier.gc()
            if tier.usage_bytes() <= cap:
                break
            threading.Event().wait(0.05)
        assert tier.usage_bytes() <= cap
        assert tier.locate(new[-1].ikey) is not None, "the newest record was evicted"
        gone = [r for r in old if tier.locate(r.ikey) is None]
        assert gone, "nothing was evicted"
        stale = old_refs[old.index(gone[0])]
        assert read_blob(tier, stale) is None, "an evicted location must read as stale, not raise"

    def test_capabilities_are_declared(self, tier: Tier) -> None:
        """A tier lists a capability mixin exactly when it has the capability's attribute (callers
        check `isinstance`, so an undeclared `probe` would silently never be used)."""
        for cap, attr in CAPABILITIES.items():
            assert isinstance(tier, cap) == hasattr(tier, attr), \
                f"{type(tier).__name__}: has {attr}={hasattr(tier, attr)} but declares {cap.__name__}=" \
                f"{isinstance(tier, cap)}"
        background = "background" in inspect.signature(tier.write_many).parameters
        assert background == tier.batch_writes, \
            f"{type(tier).__name__}: batch_writes={tier.batch_writes} needs write_many(..., background=) iff set"

    def test_declared_capabilities_work(self, tier: Tier) -> None:
        recs = make_records(3)
        write_all(tier, recs)
        tier.flush()
        if isinstance(tier, Probing):
            assert tier.probe() is None
        if isinstance(tier, Auditing):
            assert tier.audit(False) == []
        if isinstance(tier, Describing):
            units = tier.describe()
            assert units and all("raw_bytes" in u and "stored_bytes" in u for u in units)
            assert sum(int(u["stored_bytes"]) for u in units) > 0
        if isinstance(tier, SegmentDirs):
            assert tier.dirs and sum(len(d.index) for d in tier.dirs) == len(recs)
        if isinstance(tier, RecordRuns):
            run = make_records(4, size=3000, seed=7)
            refs, err = tier.write_some([(r.ikey, r.digest, r.bufs, r.length) for r in run])
            assert err is None and tier.locate_many(np.array([r.ikey for r in run], np.int64)) == refs
            bufs = [bytearray(r.length) for r in run]
            assert tier.read_run(refs, [[memoryview(b)] for b in bufs]) == [True] * 4
            assert [bytes(b) for b in bufs] == [r.blob for r in run]
        if isinstance(tier, Marking):
            assert tier.read_marks("conformance-", 64) == {}
            tier.write_mark("conformance-a", b"one")
            tier.write_mark("conformance-a", b"two")  # replaced, never appended
            tier.write_mark("other-b", b"x")
            assert tier.read_marks("conformance-", 64) == {"conformance-a": b"two"}
            assert tier.read_marks("conformance-", 2) == {"conformance-a": b"tw"}
        ref = tier.locate(recs[0].ikey)
        assert ref is not None and isinstance(tier.loc_name(ref), str) and tier.loc_name(ref)

    def test_stats_names_the_tier(self, tier: Tier) -> None:
        write_all(tier, make_records(2))
        s = tier.stats()
        assert s["kind"] == tier.kind and s["name"] == tier.name and s["usage_bytes"] > 0

    def test_store_round_trip_and_verify(self, tier: Tier) -> None:
        st = store_over(tier)
        pages = [r.page for r in make_records(20, size=5000)]
        keys = [f"s{i}" for i in range(20)]
        assert all(st.put(NS, keys, pages))
        assert st.count_leading_hits(NS, keys) == 20
        out = [np.empty_like(p) for p in pages]
        assert all(st.get_into(NS, keys, out))
        assert all((o == p).all() for o, p in zip(out, pages))
        assert st.verify() == []
