"""Capacity eviction of a segment directory: whole oldest sealed segments go first."""

from __future__ import annotations

from support.chunks import keys, local_settings as settings, page

from lifeboat_cache import ChunkStore, namespace_fingerprint

NS = namespace_fingerprint(model="test", dtype="bfloat16", page_size=64)


def test_capacity_evicts_oldest_segments(tmp_path):
    s = settings(tmp_path, capacity="3MiB", segment_size="1MiB")
    with ChunkStore.open(s, background=False) as st:
        ks = keys(1000)
        for i in range(0, 1000, 20):
            st.put(NS, ks[i:i + 20], [page(j) for j in range(i, i + 20)])
            # enforced on every seal: at most the open segments (one per write stripe) above the bound
            stripes = st.tiers[0].dirs[0].writers.stripes
            assert st.tiers[0].usage_bytes() <= (3 << 20) + stripes * (1 << 20)
        hits = st.contains(NS, ks)
        assert not any(hits[:100]) and all(hits[-20:])  # oldest gone, newest kept
