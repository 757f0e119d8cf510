"""Rebuilding a directory's index at open: from the snapshot, by scans in capped batches, past torn tails."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from functools import partial
from pathlib import Path

from support import chunks
from support.chunks import keys, local_settings as settings, page

from lifeboat_cache import ChunkStore, namespace_fingerprint
from lifeboat_cache.records.keys import index_key, key_digest
from lifeboat_cache.tiers.segments.snapshot_file import SNAPSHOT_NAME

NS = namespace_fingerprint(model="test", dtype="bfloat16", page_size=64)


read_back = partial(chunks.read_back, ns=NS)


WRITER = textwrap.dedent("""
    import sys, numpy as np
    sys.path.insert(0, {root!r})
    from lifeboat_cache import ChunkStore, namespace_fingerprint
    from lifeboat_cache.config import settings_from_dict
    s = settings_from_dict({{"storage": [{{"type": "local", "path": {path!r}, "segment_size": "4MiB"}}],
                            "engine": {{"io_workers": 4}}}})
    st = ChunkStore.open(s, background=False)
    ns = namespace_fingerprint(model="test", dtype="bfloat16", page_size=64)
    i = 0
    while True:
        ks = [f"k{{j:06d}}" for j in range(i, i + 16)]
        ps = []
        for j in range(i, i + 16):
            rng = np.random.default_rng(j)
            x = rng.standard_normal(8192).astype(np.float32) * 0.05
            ps.append((x.view(np.uint32) >> 16).astype(np.uint16))
        st.put(ns, ks, ps)
        i += 16
        if i == 160:
            print("ready", flush=True)
""")


def test_reopen_after_clean_close_uses_snapshot(tmp_path):
    ks, pages = keys(200), [page(i) for i in range(200)]
    with ChunkStore.open(settings(tmp_path), background=False) as st:
        st.put(NS, ks, pages)
    assert (tmp_path / SNAPSHOT_NAME).exists()
    with ChunkStore.open(settings(tmp_path)) as st:  # returns at once: the snapshot loads in the background
        assert st.wait_rebuilt(10) and st.count_leading_hits(NS, ks) == 200
        assert st.stats()["tiers"][0]["snapshot_discarded"] == 0
        assert all(read_back(st, ks, pages))


def test_snapshot_mismatch_rescans(tmp_path):
    ks, pages = keys(50), [page(i) for i in range(50)]
    with ChunkStore.open(settings(tmp_path), background=False) as st:
        st.put(NS, ks, pages)
    (tmp_path / SNAPSHOT_NAME).write_bytes(b"garbage")
    with ChunkStore.open(settings(tmp_path)) as st:
        assert st.wait_rebuilt(10)
        assert st.count_leading_hits(NS, ks) == 50 and all(read_back(st, ks, pages))


def test_rebuild_without_snapshot_in_capped_batches_finds_every_page(tmp_path, monkeypatch):
    """A reopen with no snapshot indexes its segments in batches that stop growing at BATCH_MAX (the
    rebuild's memory above the index): every page is found, and no bulk insert is larger."""
    from lifeboat_cache.index import Index
    from lifeboat_cache.tiers.segments import rebuild

    ks, pages = keys(600), [page(i) for i in range(600)]
    with ChunkStore.open(settings(tmp_path), background=False) as st:
        assert all(st.put(NS, ks, pages))
    (tmp_path / SNAPSHOT_NAME).unlink()
    assert len(list(tmp_path.glob("*.seg"))) >= 3
    monkeypatch.setattr(rebuild, "BATCH_MIN", 16)
    monkeypatch.setattr(rebuild, "BATCH_MAX", 64)
    sizes: list[int] = []
    bulk = Index.insert_arrays

    def counted(self, keys, *a, **kw):
        sizes.append(len(keys))
        return bulk(self, keys, *a, **kw)

    monkeypatch.setattr(Index, "insert_arrays", counted)
    with ChunkStore.open(settings(tmp_path)) as st:
        assert st.wait_rebuilt(30)
        assert sum(sizes) == 600 and max(sizes) <= 64 and len(sizes) >= 600 // 64
        assert st.count_leading_hits(NS, ks) == 600
        assert all(read_back(st, ks, pages))


def test_kill_9_writer_torn_tail_is_ignored(tmp_path):
    root = str(Path(__file__).resolve().parents[4])
    proc = subprocess.Popen([sys.executable, "-c", WRITER.format(root=root, path=str(tmp_path))],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.3)  # let it write more, then kill it mid-stream
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with ChunkStore.open(settings(tmp_path)) as st:
        assert st.wait_rebuilt(30)
        ks = keys(5000)
        present = [k for k, hit in zip(ks, st.contains(NS, ks)) if hit]
        assert len(present) >= 160
        idx = [int(k[1:]) for k in present]
        assert all(read_back(st, present, [page(i) for i in idx])), "a page that exists reports was not exact"
        assert st.verify() == []


def test_torn_tail_is_ignored(tmp_path):
    ks, pages = keys(30), [page(i) for i in range(30)]
    st = ChunkStore.open(settings(tmp_path), background=False)
    st.put(NS, ks, pages)
    refs = [st.tiers[0].locate(index_key(key_digest(NS, k))) for k in ks]
    last = max(range(30), key=lambda i: refs[i].loc.offset)  # writes run in parallel: find a tail record
    seg = tmp_path / st.tiers[0].loc_name(refs[last]).split("@")[0]
    st.io.pool.shutdown()  # simulate a crash: no seal, no snapshot
    size = seg.stat().st_size
    with open(seg, "r+b") as f:
        f.truncate(size - 1000)  # the last record is torn
    with ChunkStore.open(settings(tmp_path)) as st2:
        assert st2.wait_rebuilt(10)
        hits = st2.contains(NS, ks)
        assert hits == [i != last for i in range(30)]
        keep = [i for i in range(30) if i != last]
        assert all(read_back(st2, [ks[i] for i in keep], [pages[i] for i in keep]))
