"""`lifeboat_*` metrics of the HiCache backend, as SGLang's `/metrics` would serve them.

A child process plays an SGLang scheduler rank with ``--enable-metrics``: ``PROMETHEUS_MULTIPROC_DIR``
set, SGLang's ``HybridCacheController`` with the ``dynamic`` backend built by SGLang's own factory
(``sglang_pools.CpuHiCache``), 40 pages backed up and prefetched through SGLang's threads, then closed.
The parent scrapes like SGLang's metrics handler (``MultiProcessCollector`` + ``generate_latest``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

prometheus_client = pytest.importorskip("prometheus_client")
pytest.importorskip("sglang_pools", reason="SGLang 0.5.23 is not installed")
from prometheus_client.multiprocess import MultiProcessCollector  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

HERE = Path(__file__).parent
CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[2])
    from sglang_pools import CpuHiCache, fill_random, lifeboat_extra, mha_pools
    from pathlib import Path

    dev, host = mha_pools("page_first")
    cache = CpuHiCache(dev, host, lifeboat_extra(Path(sys.argv[1])), model="demo-model")
    tokens = list(range(40 * 4))
    slots = host.alloc(len(tokens))
    fill_random(host, slots, seed=3)
    assert cache.backup(tokens, slots, prefix_keys=[]) == len(tokens)
    assert cache.prefetch(tokens, prefix_keys=[])["loaded_tokens"] == len(tokens)
    cache.close()
    print("DONE", flush=True)
""")


def test_hicache_backend_metrics_on_a_multiprocess_scrape(tmp_path: Path) -> None:
    prom = tmp_path / "prom"
    prom.mkdir()
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(prom))
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "store"), str(HERE)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "DONE" in r.stdout, r.stderr[-4000:]

    registry = prometheus_client.CollectorRegistry()
    MultiProcessCollector(registry, path=str(prom))
    s = {}
    for fam in text_string_to_metric_families(prometheus_client.generate_latest(registry).decode()):
        for sample in fam.samples:
            s[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    base = (("model", "demo-model"), ("rank", "0"))
    tier = ("tier", f"local:{tmp_path / 'store'}")
    assert s[("lifeboat_pages_written_total", tuple(sorted(base + (tier,))))] == 40
    assert s[("lifeboat_hits_total", base)] == 40
    assert s[("lifeboat_pages_read_total", tuple(sorted(base + (tier,))))] == 40
    assert s[("lifeboat_call_seconds_count", tuple(sorted(base + (("op", "set"),))))] >= 1
    assert s[("lifeboat_call_seconds_count", tuple(sorted(base + (("op", "get"),))))] >= 1
    assert s[("lifeboat_index_pages", tuple(sorted(base + (tier,))))] == 40
    raw = s[("lifeboat_bytes_written_total", tuple(sorted(base + (tier, ("kind", "raw")))))]
    stored = s[("lifeboat_bytes_written_total", tuple(sorted(base + (tier, ("kind", "stored")))))]
    assert raw == 40 * 4 * 2 * 4 * 2 * 16 * 2  # pages x tokens x (K, V) x layers x heads x head_dim x bf16 bytes
    assert s[("lifeboat_compression_ratio", base)] == pytest.approx(raw / stored)

    # the backend's stats file names the namespace: SGLang's model name, the pool, the rank
    (f,) = (tmp_path / "store" / "stats").glob("*.json")
    data = json.loads(f.read_text())
    assert data["role"] == "sglang-hicache" and data["labels"] == {"model": "demo-model", "rank": "0"}
    (ns,) = data["namespaces"].values()
    assert ns["labels"] == {"model": "demo-model", "pool": "kv", "rank": "0"} and ns["pages_written"] == 40
