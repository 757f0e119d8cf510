"""The `lifeboat` CLI on a real store directory."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from lifeboat_cache import ChunkStore, namespace_fingerprint
from lifeboat_cache.cli import main
from lifeboat_cache.config import load_settings
from lifeboat_cache.records import HEADER_SIZE

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
    # the capacity counts the pages as stored (records less their headers); on disk, trailers too
    assert t["usage_bytes"] == t["stored_bytes"] - 20 * HEADER_SIZE
    assert t["disk_bytes"] == sum(p.stat().st_size for p in (tmp_path / "store").glob("*.seg"))
    assert t["disk_bytes"] > t["stored_bytes"]


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
    assert r.returncode == 3 and "configuration error" in r.stderr and "engine.io_workers" in r.stderr
    assert "Traceback" not in r.stderr


# ------------------------------------------------------------------ a tier that cannot be reached or read
COMMANDS = (["stats"], ["stats", "--json"], ["verify"], ["verify", "--json"], ["gc"], ["gc", "--json"], ["ls"],
            ["ls", "--json"], ["purge", "--older-than", "1d"], ["purge", "--older-than", "1d", "--json"])


def test_every_command_fails_naming_the_tier_when_its_path_does_not_exist(tmp_path, capsys):
    """`stats` on a store path that does not exist said `pages: 0`, rc 0; `gc` created the directory."""
    gone = tmp_path / "nope"
    cfg = tmp_path / "lifeboat.yaml"
    cfg.write_text(f"storage:\n  - type: local\n    path: {gone}\n")
    for argv in COMMANDS:
        assert main([argv[0], "--config", str(cfg), *argv[1:]]) == 4, argv
        out, err = capsys.readouterr()
        assert "storage error" in err and "storage[0]" in err and f"{gone} does not exist" in err, (argv, err)
        if argv == ["stats", "--json"]:  # the report is still printed, the tier marked unreachable
            t = json.loads(out)["tiers"][0]
            assert t["reachable"] is False and "does not exist" in t["last_error"]
        assert not gone.exists(), argv  # no command creates a store that was not there


def test_every_command_fails_naming_the_tier_when_s3_does_not_answer(tmp_path, capsys, monkeypatch):
    """An S3 endpoint that does not answer gave `pages: 0`, `verified 0 records: 0 bad` and rc 0."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test-key-id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test-secret")
    cfg = tmp_path / "lifeboat.yaml"
    cfg.write_text("storage:\n  - type: s3\n    bucket: kv\n    endpoint_url: http://127.0.0.1:1\n"
                   "    region: us-east-1\n    connect_timeout_s: 0.2\n    max_attempts: 1\n")
    for argv in COMMANDS:
        assert main([argv[0], "--config", str(cfg), *argv[1:]]) == 4, argv
        out, err = capsys.readouterr()
        assert "storage error" in err and "s3://kv/" in err and "127.0.0.1:1" in err, (argv, err)
        if argv == ["stats", "--json"]:
            t = json.loads(out)["tiers"][0]
            assert t["reachable"] is False and "EndpointConnectionError" in t["last_error"]


def test_s3_without_credentials_names_the_cause(tmp_path, capsys, monkeypatch):
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    cfg = tmp_path / "lifeboat.yaml"
    cfg.write_text("storage:\n  - type: s3\n    bucket: kv\n    endpoint_url: http://127.0.0.1:1\n    region: us-east-1\n")
    assert main(["verify", "--config", str(cfg)]) == 4
    assert "NoCredentialsError" in capsys.readouterr().err


def test_stats_reports_every_tier_reachable_and_the_documented_index_fields(tmp_path, capsys):
    cfg = _store(tmp_path)
    assert main(["stats", "--config", str(cfg), "--json"]) == 0
    t = json.loads(capsys.readouterr().out)["tiers"][0]
    assert t["reachable"] is True and t["last_error"] is None
    for k in ("snapshot_saves", "snapshot_save_failures", "snapshot_save_ms", "snapshot_pages", "snapshot_segments",
              "scanned_segments", "snapshot_mismatched_units", "snapshot_discarded", "rebuild_ms"):
        assert k in t, k  # docs/operating.md, "What to watch"
    assert t["snapshot_pages"] + t["scanned_segments"] > 0  # this open's rebuild found the 20 pages


# ------------------------------------------------------------------ conventions
def test_errors_have_a_kind_and_an_exit_code_each(tmp_path, capsys):
    cfg = _store(tmp_path)
    assert main(["purge", "--config", str(cfg), "--older-than", "-5d"]) == 2  # not argparse's "expected one argument"
    err = capsys.readouterr().err
    assert "usage error" in err and "--older-than" in err and "-5d" in err
    assert main(["stats", "--config", str(cfg), "--since", "-1h"]) == 2
    assert "usage error: --since" in capsys.readouterr().err
    assert main(["gc", "--config", str(cfg), "--compact-below", "2"]) == 2
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing yet\n")
    assert main(["stats", "--config", str(empty)]) == 3  # an empty file is not the default store
    err = capsys.readouterr().err
    assert "configuration error" in err and str(empty) in err and "empty" in err
    with pytest.raises(SystemExit) as e:
        main(["verify", "--no-quarantine"])  # removed: it never did anything
    assert e.value.code == 2


def test_version_and_a_description_and_example_per_subcommand(capsys):
    from lifeboat_cache import __version__

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"lifeboat {__version__}"
    for name in ("stats", "verify", "gc", "ls", "purge", "keygen", "bench"):
        with pytest.raises(SystemExit):
            main([name, "--help"])
        out = capsys.readouterr().out
        assert "example" in out and f"lifeboat {name}" in out.split("example")[1], name


def test_verify_and_gc_report_in_json(tmp_path, capsys):
    cfg = _store(tmp_path)
    assert main(["verify", "--config", str(cfg), "--json"]) == 0
    v = json.loads(capsys.readouterr().out)
    assert v["records"] == 20 and v["bad"] == 0 and v["problems"] == []
    assert main(["gc", "--config", str(cfg), "--json"]) == 0
    g = json.loads(capsys.readouterr().out)
    assert g["usage_bytes"] > 0 and g["freed_bytes"] >= 0


def test_progress_never_writes_frames_into_a_redirected_file(tmp_path):
    cfg = _store(tmp_path)
    with open(tmp_path / "err.txt", "w") as err:
        r = subprocess.run([sys.executable, "-m", "lifeboat_cache.cli", "verify", "--config", str(cfg)],
                           stdout=subprocess.PIPE, stderr=err, text=True)
    assert r.returncode == 0 and "verified 20 records" in r.stdout
    assert b"\r" not in (tmp_path / "err.txt").read_bytes()  # bytes: text mode would read \r as \n


def test_ctrl_c_ends_with_130_and_no_traceback(tmp_path, capsys, monkeypatch):
    cfg = _store(tmp_path)

    def pressed(*_a, **_k):  # the user's Ctrl-C arriving mid-verify
        raise KeyboardInterrupt

    monkeypatch.setattr(ChunkStore, "verify", pressed)
    assert main(["verify", "--config", str(cfg)]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "Traceback" not in err
