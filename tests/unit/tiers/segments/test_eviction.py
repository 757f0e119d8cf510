"""Capacity eviction of a segment directory: whole oldest sealed segments go first."""

from __future__ import annotations

from pathlib import Path

from support.chunks import keys, page

from lifeboat_cache import ChunkStore, namespace_fingerprint
from lifeboat_cache.config import settings_from_dict

NS = namespace_fingerprint(model="test", dtype="bfloat16", page_size=64)


def settings(path: Path, **tier):
    t = {"type": "local", "path": str(path), "capacity": "1GiB", "segment_size": "4MiB", **tier}
    return settings_from_dict({"storage": [t], "engine": {"io_workers": 4, "failure_cooldown_s": 0.2,
                                                          "failure_cooldown_max_s": 0.8}})


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
