"""What an operator sees: `lifeboat_*` metrics on a multiprocess Prometheus scrape, stats files,
`lifeboat stats` and `lifeboat ls`.

Serving processes are real child processes, each with its own real ChunkStore on a local directory and
a StatsReporter (what the SGLang and MLX shims start), under ``PROMETHEUS_MULTIPROC_DIR`` exactly as
SGLang's ``--enable-metrics`` sets it. The parent scrapes the way SGLang's ``/metrics`` handler does:
``CollectorRegistry`` + ``MultiProcessCollector`` + ``generate_latest``, and parses the text.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.multiprocess import MultiProcessCollector  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from lifeboat_cache.cli import main  # noqa: E402

CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    from lifeboat_cache import ChunkStore, namespace_fingerprint
    from lifeboat_cache.config import load_settings
    from lifeboat_cache.ops.stats_file import StatsReporter

    cfg, rank, corrupt = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    store = ChunkStore.open(load_settings(cfg), background=False)
    rep = StatsReporter(store, role="test", labels={"model": "tiny", "rank": rank}, interval_s=3600)
    ns = namespace_fingerprint(model="tiny", rank=rank)
    store.counters.name_namespace(ns, model="tiny", pool="kv", rank=rank)
    pages = [np.full(2048, 1000 * int(rank) + i, np.uint16) for i in range(8)]
    keys = [f"k{i}" for i in range(10)]
    assert all(store.put(ns, keys[:8], pages))
    store.flush()
    if corrupt:  # flip one byte of page 3's payload on disk: its read is a 'corrupt' miss
        needle = pages[3].tobytes()
        seg = next(p for d in store.tiers[0].dirs for p in d.path.glob("*.seg") if needle in p.read_bytes())
        data = seg.read_bytes()
        at = data.find(needle)
        with open(seg, "r+b") as f:
            f.seek(at + 10)
            f.write(bytes([data[at + 10] ^ 0xFF]))
    assert store.count_leading_hits(ns, keys) == 8
    out = [np.empty(2048, np.uint16) for _ in keys]
    ok = store.get_into(ns, keys, out)
    print("OK", sum(ok), flush=True)
    rep.close()
    store.close()
""")


def _config(tmp_path: Path, name: str) -> Path:
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(f"storage:\n  - type: local\n    path: {tmp_path / name}\n    capacity: 64MiB\n"
                   f"    segment_size: 4MiB\nengine:\n  compression: none\n")
    return cfg


def _serve(tmp_path: Path, cfg: Path, rank: str, corrupt: bool, prom_dir: Path) -> int:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(prom_dir))
    r = subprocess.run([sys.executable, str(script), str(cfg), rank, "1" if corrupt else "0"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return int(r.stdout.split("OK")[1].split()[0])


def _scrape(prom_dir: Path) -> dict[tuple[str, tuple], float]:
    """SGLang's /metrics handler in multiprocess mode, parsed into {(sample name, labels): value}."""
    registry = prometheus_client.CollectorRegistry()
    MultiProcessCollector(registry, path=str(prom_dir))
    text = prometheus_client.generate_latest(registry).decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _get(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("ops")
    prom = tmp / "prom"
    prom.mkdir()
    cfg0, cfg1 = _config(tmp, "store0"), _config(tmp, "store1")
    hits0 = _serve(tmp, cfg0, "0", corrupt=False, prom_dir=prom)
    hits1 = _serve(tmp, cfg1, "1", corrupt=True, prom_dir=prom)
    return {"tmp": tmp, "prom": prom, "cfg0": cfg0, "cfg1": cfg1, "hits": (hits0, hits1)}


def test_lifeboat_metrics_on_a_multiprocess_scrape(served: dict) -> None:
    assert served["hits"] == (8, 7)
    s = _scrape(served["prom"])
    tier0 = f"local:{served['tmp'] / 'store0'}"
    tier1 = f"local:{served['tmp'] / 'store1'}"
    base0, base1 = {"model": "tiny", "rank": "0"}, {"model": "tiny", "rank": "1"}
    assert _get(s, "lifeboat_hits_total", **base0) == 8
    assert _get(s, "lifeboat_hits_total", **base1) == 7
    assert _get(s, "lifeboat_pages_read_total", tier=tier0, **base0) == 8
    assert _get(s, "lifeboat_pages_written_total", tier=tier1, **base1) == 8
    assert _get(s, "lifeboat_bytes_written_total", tier=tier0, kind="raw", **base0) == 8 * 4096
    assert _get(s, "lifeboat_bytes_read_total", **base1) == 7 * 4096
    assert _get(s, "lifeboat_misses_total", reason="absent", **base0) == 2
    assert _get(s, "lifeboat_misses_total", reason="corrupt", **base0) == 0
    assert _get(s, "lifeboat_misses_total", reason="corrupt", **base1) == 1
    assert _get(s, "lifeboat_misses_total", reason="absent", **base1) == 2
    assert _get(s, "lifeboat_quarantined_records_total", **base1) == 1
    # latency histograms: one call each of exists / get / set per process
    for op in ("exists", "get", "set"):
        assert _get(s, "lifeboat_call_seconds_count", op=op, **base0) == 1
        assert _get(s, "lifeboat_call_seconds_bucket", op=op, le="+Inf", **base1) == 1
    # gauges of the process's last tick (the corrupt record left the index)
    assert _get(s, "lifeboat_index_pages", tier=tier0, **base0) == 8
    assert _get(s, "lifeboat_index_pages", tier=tier1, **base1) == 7
    assert _get(s, "lifeboat_tier_capacity_bytes", tier=tier0, **base0) == 64 << 20
    assert 0 < _get(s, "lifeboat_tier_capacity_used_ratio", tier=tier0, **base0) < 1
    assert _get(s, "lifeboat_tier_cooldown", tier=tier0, op="read", **base0) == 0
    assert _get(s, "lifeboat_compression_ratio", **base0) == pytest.approx(4096 / (4096 + 64))


def test_stats_files_are_owner_only_and_whole(served: dict) -> None:
    files = sorted((served["tmp"] / "store1" / "stats").glob("*.json"))
    assert len(files) == 1
    assert stat.S_IMODE(files[0].stat().st_mode) == 0o600
    assert not list((served["tmp"] / "store1" / "stats").glob(".*"))  # no temp file left behind
    data = json.loads(files[0].read_text())
    assert data["counters"]["pages_read"] == 7 and data["labels"] == {"model": "tiny", "rank": "1"}


def test_lifeboat_stats_json_sums_processes(served: dict, tmp_path: Path, capsys) -> None:
    # a second process's file in the same stats directory: counters add up
    d = served["tmp"] / "store1" / "stats"
    src = next(d.glob("*.json"))
    twin = tmp_path / "twin.json"
    twin.write_bytes(src.read_bytes())
    os.replace(twin, d / "otherhost-1-abc.json")
    try:
        assert main(["stats", "--config", str(served["cfg1"]), "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
    finally:
        (d / "otherhost-1-abc.json").unlink()
    a = out["activity"]
    assert out["processes"]["recent"] + out["processes"]["live"] == 2
    assert a["pages_read"] == 14 and a["lookup_keys"] == 20 and a["lookup_hits"] == 16
    assert a["hit_rate"] == 0.8
    assert a["misses_by_reason"]["corrupt"] == 2 and a["misses_by_reason"]["absent"] == 4
    assert a["bytes_out"] == 14 * 4096 and a["bytes_in"] == 16 * 4096
    assert a["latency"]["get"]["count"] == 2
    (ns,) = out["namespaces"].values()
    assert ns["labels"] == {"model": "tiny", "pool": "kv", "rank": "1"}
    assert ns["pages_written"] == 16 and ns["last_write"] > 0
    assert out["tiers"][0]["pages"] == 7
    assert out["last_error"] is not None and "bad record" in out["last_error"]["message"]


def test_lifeboat_stats_text_and_closed_pipe(served: dict) -> None:
    cmd = [sys.executable, "-m", "lifeboat_cache.cli", "stats", "--config", str(served["cfg0"])]
    full = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert full.returncode == 0, full.stderr
    assert "hit rate: 80.0%" in full.stdout and "misses by reason: stale 0" in full.stdout
    assert "tiny" in full.stdout and "last error: none" in full.stdout
    # `lifeboat stats | head -1`: the reader leaves after one line
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0 and first
    assert "Broken pipe" not in err and "BrokenPipeError" not in err and "Traceback" not in err, err


def test_lifeboat_ls_lists_models_without_touching_the_store(served: dict, capsys) -> None:
    store = served["tmp"] / "store0"
    before = {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in store.rglob("*")}
    assert main(["ls", "--config", str(served["cfg0"]), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (ns,) = out["namespaces"].values()
    assert ns["labels"]["model"] == "tiny" and ns["pages_written"] == 8 and ns["bytes_written"] > 8 * 4096
    assert main(["ls", "--config", str(served["cfg0"])]) == 0
    text = capsys.readouterr().out
    assert "tiny" in text and "kv" in text
    after = {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in store.rglob("*")}
    assert after == before
