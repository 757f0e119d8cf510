"""metrics.Counters under concurrency, its histograms, namespace accounting and reason tables."""

from __future__ import annotations

import sys
import threading

import pytest

from lifeboat_cache import metrics
from lifeboat_cache.metrics import LATENCY_BUCKETS_S, Counters
from lifeboat_cache.tiers.segments import DirSettings, SegmentDir
from lifeboat_cache.tiers.segments.shared_dir import NfsSegmentDir


def test_counters_histograms_and_namespaces_are_exact_under_threads() -> None:
    c = Counters()
    seen = []
    c.add_listener(lambda name, s: seen.append(name))
    n_threads, n = 8, 5000
    barrier = threading.Barrier(n_threads)

    def work(t: int) -> None:
        barrier.wait()
        for i in range(n):
            c.add("x")
            c.add("bytes", 3)
            c.observe("get", 0.0003 if i % 2 else 0.02)
            c.add_namespace(b"ns%d" % (t % 2), 1, 10)
            c.add_many({"x": 1, "keys": 300}, observe=("exists", 0.00015))  # the exists path's one call
            c.add_many({"bytes": 0})

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    total = n_threads * n
    assert c.get("x") == 2 * total and c.get("bytes") == 3 * total and c.get("keys") == 300 * total
    e = c.histograms()["exists"]
    assert e["count"] == total and e["buckets"][LATENCY_BUCKETS_S.index(0.00025)] == total  # (0.1, 0.25] ms
    h = c.histograms()["get"]
    assert h["count"] == total and sum(h["buckets"]) == total
    assert h["buckets"][LATENCY_BUCKETS_S.index(0.0005)] == total // 2   # 0.3 ms lands in (0.25, 0.5]
    assert h["buckets"][LATENCY_BUCKETS_S.index(0.025)] == total // 2    # 20 ms lands in (10, 25]
    assert len(seen) == 2 * total and seen.count("exists") == total  # add_many's latency reaches listeners too
    ns = c.namespaces()
    assert {k: v["pages_written"] for k, v in ns.items()} == {b"ns0".hex(): total // 2, b"ns1".hex(): total // 2}
    assert all(v["bytes_written"] == 10 * total // 2 and v["last_write"] > 0 for v in ns.values())


def test_a_failing_listener_never_reaches_the_caller() -> None:
    c = Counters()

    def boom(name: str, s: float) -> None:
        raise RuntimeError("exporter down")

    c.add_listener(boom)
    c.observe("set", 0.001)  # no exception
    c.add_many({"lookup_keys": 3}, observe=("exists", 0.001))  # nor here, and the counts still land
    c.remove_listener(boom)
    assert c.histograms()["set"]["count"] == 1 and c.histograms()["exists"]["count"] == 1
    assert c.get("lookup_keys") == 3


def test_reason_tables() -> None:
    raw = {"read_misses": 10, "miss_stale": 1, "miss_checksum": 2, "miss_header": 1, "miss_foreign": 1,
           "miss_cooldown": 2, "writes_dropped_cooldown": 4, "copy_dropped": 5, "pages_read": 20,
           "hits_tier1": 6}
    assert metrics.misses_by_reason(raw) == {"stale": 1, "corrupt": 3, "foreign": 1, "cooldown": 2,
                                             "deadline": 0, "unsealed": 0, "key": 0, "auth": 0, "absent": 3}
    sealed = {"read_misses": 4, "miss_unsealed": 1, "miss_sealed_unknown_key": 1, "miss_sealed_no_key": 1,
              "miss_sealed_auth": 1}
    assert metrics.misses_by_reason(sealed) == {"stale": 0, "corrupt": 0, "foreign": 0, "cooldown": 0, "deadline": 0,
                                                "unsealed": 1, "key": 2, "auth": 1, "absent": 0}
    drops = metrics.drops_by_reason(raw)
    assert drops["cooldown"] == 4 and drops["copy_queue_full"] == 5 and drops["io_error"] == 0
    assert metrics.hits_by_tier(raw, 2) == [14, 6]


def test_namespace_labels_drop_empty_values() -> None:
    c = Counters()
    c.name_namespace(b"n", model="m", pool="kv", rank=None, empty="")
    assert c.namespaces()[b"n".hex()]["labels"] == {"model": "m", "pool": "kv"}


# ------------------------------------------------------------------ Counters
def test_counters_exact_totals_under_concurrent_increments() -> None:
    c = Counters()
    c.declare("hits", "bytes", "untouched")
    n_threads, n = 8, 20000
    start = threading.Barrier(n_threads)

    def run(i: int) -> None:
        start.wait()
        for _ in range(n):
            c.add("hits")
            c.add("bytes", 3)
            c.add(f"own{i}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n_threads)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: an unlocked read-modify-write loses counts here
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert c["hits"] == n_threads * n
    assert c["bytes"] == 3 * n_threads * n
    assert all(c[f"own{i}"] == n for i in range(n_threads))
    assert c["untouched"] == 0 and "untouched" in c and "never" not in c
    assert c.get("never") == 0
    with pytest.raises(KeyError):
        c["never"]


def test_counters_declare_keeps_values_set_overwrites_and_no_item_assignment() -> None:
    c = Counters()
    c.add("a", 5)
    c.declare("a", "b")
    assert c.snapshot() == {"a": 5, "b": 0}
    c.set("rebuild_ms", 12)
    c.set("rebuild_ms", 7)
    assert c["rebuild_ms"] == 7
    with pytest.raises(TypeError):
        c["a"] += 1  # type: ignore[index]  # a racy read-modify-write is refused: use add()


def test_segment_dir_and_nfs_counters_are_thread_safe_counters(tmp_path) -> None:
    d = SegmentDir(tmp_path / "local", DirSettings(capacity_bytes=1 << 30, segment_bytes=1 << 20))
    n = NfsSegmentDir(tmp_path / "nfs", DirSettings(capacity_bytes=1 << 30, segment_bytes=1 << 20))
    try:
        assert isinstance(d.counters, Counters) and isinstance(n.counters, Counters)
        assert d.counters["evicted_segments"] == 0 and d.counters["rebuild_ms"] == 0
        assert n.counters["stale_handles"] == 0 and n.counters["foreign_abandoned"] == 0
    finally:
        d.close()
        n.close()
