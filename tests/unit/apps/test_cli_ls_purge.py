"""`lifeboat ls` and `purge` on a real store written through the Python API and by a labelled writer:
every namespace is seen, counts are pages present now, purge counts are exact and idempotent."""

from __future__ import annotations

import json

import numpy as np

from lifeboat_cache import ChunkStore, namespace_fingerprint
from lifeboat_cache.cli import main
from lifeboat_cache.config import load_settings
from lifeboat_cache.ops import StatsReporter, stats_dir

API = namespace_fingerprint(model="api-only", dtype="uint16", page_size=1)
LLAMA = namespace_fingerprint(model="meta/llama", dtype="uint16", page_size=1)
OTHER = namespace_fingerprint(model="other/llama", dtype="uint16", page_size=1)


def _pages(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 1 << 16, 2048, dtype=np.uint16) for _ in range(n)]


def _store(tmp_path):
    cfg = tmp_path / "lifeboat.yaml"
    cfg.write_text(f"storage:\n  - type: local\n    path: {tmp_path / 'store'}\n    capacity: 64MiB\n"
                   "    segment_size: 1MiB\nengine:\n  compression: none\n")
    settings = load_settings(cfg)
    with ChunkStore.open(settings, background=False) as st:
        assert all(st.put(API, [f"a{i}" for i in range(30)], _pages(30, 1)))  # the documented Python API only
        assert all(st.put(API, [f"a{i}" for i in range(30)], _pages(30, 1)))  # again: still 30 pages
        rep = StatsReporter(st, role="test", interval_s=3600, directory=stats_dir(settings), prometheus=False)
        for ns, model, seed in ((LLAMA, "meta/llama", 2), (OTHER, "other/llama", 3)):
            st.counters.name_namespace(ns, model=model, pool="kv", rank="0")
            assert all(st.put(ns, [f"{model}{i}" for i in range(10)], _pages(10, seed)))
        rep.close()
    return cfg


def _ls(cfg, capsys) -> dict:
    assert main(["ls", "--config", str(cfg), "--json"]) == 0
    return json.loads(capsys.readouterr().out)["namespaces"]


def test_ls_sees_pages_written_through_the_python_api_and_counts_pages_present(tmp_path, capsys):
    cfg = _store(tmp_path)
    ns = _ls(cfg, capsys)
    assert ns[API.hex()]["pages"] == 30 and ns[API.hex()]["labels"]["model"] == "api-only"  # left in the store
    assert ns[LLAMA.hex()]["pages"] == 10 and ns[LLAMA.hex()]["labels"]["model"] == "meta/llama"
    assert main(["ls", "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "meta/llama" in out and "other/llama" in out  # the MODEL column is never cut
    assert main(["purge", "--config", str(cfg), "--namespace", API.hex()[:16]]) == 0  # a prefix ls printed
    assert main(["gc", "--config", str(cfg)]) == 0
    capsys.readouterr()
    ns = _ls(cfg, capsys)
    assert API.hex() not in ns and set(ns) == {LLAMA.hex(), OTHER.hex()}  # purged + gc: no longer listed


def test_purge_counts_are_exact_idempotent_and_dry_run_changes_nothing(tmp_path, capsys):
    cfg = _store(tmp_path)
    assert main(["purge", "--config", str(cfg), "--namespace", API.hex(), "--dry-run", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["dry_run"] is True and rep["tiers"][0]["would_purge_pages"] == 30
    assert not (tmp_path / "store" / "purge.list").exists() and _ls(cfg, capsys)[API.hex()]["pages"] == 30
    for expected in (30, 0):  # 30 pages written twice are 30 pages; a second run purges none
        assert main(["purge", "--config", str(cfg), "--namespace", API.hex(), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["tiers"][0]["purged_pages"] == expected


def test_model_matches_exactly_or_by_glob(tmp_path, capsys):
    cfg = _store(tmp_path)
    assert main(["purge", "--config", str(cfg), "--model", "llama"]) == 2  # not every org's */llama
    assert "match exactly" in capsys.readouterr().err
    assert main(["purge", "--config", str(cfg), "--model", "meta/*", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert list(rep["namespaces"]) == [LLAMA.hex()] and rep["tiers"][0]["purged_pages"] == 10
    ns = _ls(cfg, capsys)
    assert LLAMA.hex() not in ns and ns[OTHER.hex()]["pages"] == 10
