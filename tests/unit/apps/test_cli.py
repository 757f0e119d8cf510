"""The `lifeboat` CLI on a real store directory."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from lifeboat_cache import ChunkStore, namespace_fingerprint
from lifeboat_cache.cli import main
from lifeboat_cache.config import load_settings

NS = namespace_fingerprint(model="cli")


def _store(tmp_path):
    cfg = tmp_path / "lifeboat.yaml"
    cfg.write_text(f"storage:\n  - type: local\n    path: {tmp_path / 'store'}\n    capacity: 2MiB\n"
                   f"    segment_size: 1MiB\n    compression: zstd\n")  # a ratio to report (auto: raw on local)
    rng = np.random.default_rng(0)
    pages = [(rng.standard_normal(4096).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
             for _ in range(20)]
    with ChunkStore.open(load_settings(cfg), background=False) as st:
        st.put(NS, [f"k{i}" for i in range(20)], pages)
    return cfg


def test_stats_reports_pages_ratio_and_capacity(tmp_path, capsys):
    cfg = _store(tmp_path)
    assert main(["stats", "--config", str(cfg), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    t = out["tiers"][0]
    assert t["pages"] == 20 and t["segments"] >= 1
    assert t["raw_bytes"] == 20 * 8192 and t["compression_ratio"] > 1.0
    assert 0 < t["capacity_used"] < 1


def test_verify_quarantines_and_exits_nonzero(tmp_path, capsys):
    cfg = _store(tmp_path)
    seg = next((tmp_path / "store").glob("*.seg"))
    with open(seg, "r+b") as f:
        f.seek(100)
        f.write(b"\x00\x01\x02")
    assert main(["verify", "--config", str(cfg), "--quiet"]) == 1
    assert "1 bad (reported" in capsys.readouterr().out
    assert main(["verify", "--config", str(cfg), "--quiet"]) == 1  # without --fix nothing changed
    assert main(["verify", "--config", str(cfg), "--quiet", "--fix"]) == 1
    out = capsys.readouterr().out
    assert "1 bad (fixed" in out
    assert main(["verify", "--config", str(cfg), "--quiet"]) == 0


def test_gc_and_bad_config_via_console_script(tmp_path):
    cfg = _store(tmp_path)
    r = subprocess.run([sys.executable, "-m", "lifeboat_cache.cli", "gc", "--config", str(cfg)],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "gc: freed" in r.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine:\n  io_workers: many\n")
    r = subprocess.run([sys.executable, "-m", "lifeboat_cache.cli", "stats", "--config", str(bad)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "engine.io_workers" in r.stderr and "Traceback" not in r.stderr
