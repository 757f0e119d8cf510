"""Items 3 and 4: owner-only files whatever the umask, configurable modes, and nothing planted in the
store directory (symlinks, FIFOs, directories named like store files) makes the store write outside it.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import FIGURES, check, cli, config, record_map, run_writer, write_keys

from lifeboat_cache.config import ConfigError, settings_from_dict


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.lstat().st_mode)


@pytest.mark.parametrize("umask", [0o000, 0o077])
def test_store_files_are_owner_only_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    store = tmp_path / "a" / "b" / "store"
    cfg = config(tmp_path, store)
    old = os.umask(umask)
    try:
        acked = run_writer(cfg, 2, 8, close=True)
    finally:
        os.umask(old)
    assert acked
    for d in (tmp_path / "a", tmp_path / "a" / "b", store):
        assert _mode(d) == 0o700, d
    files = list(store.iterdir())
    assert any(f.name.endswith(".seg") for f in files) and any(f.name == "index.snapshot" for f in files)
    assert all(_mode(f) == 0o600 for f in files), {f.name: oct(_mode(f)) for f in files}


def test_configured_modes_for_a_shared_service_group(tmp_path: Path) -> None:
    store = tmp_path / "store"
    cfg = config(tmp_path, store, file_mode="0640", dir_mode="0750")
    old = os.umask(0o077)
    try:
        run_writer(cfg, 1, 8, close=True)
    finally:
        os.umask(old)
    seg = next(store.glob("*.seg"))
    with open(seg, "r+b") as f:  # one bad record, so verify --fix writes the quarantine list
        f.seek(200)
        f.write(b"\x00\x01")
    assert cli(cfg, "verify", "--quiet", "--fix").returncode == 1
    assert _mode(store) == 0o750
    assert {f.name: _mode(f) for f in store.iterdir()} == {f.name: 0o640 for f in store.iterdir()}
    assert (store / "quarantine.jsonl").exists()


@pytest.mark.parametrize("bad", ["0777x", "0o200", "0100", 9999, "rw-r-----", True])
def test_bad_modes_are_config_errors_naming_the_key(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"storage\[0\]\.file_mode"):
        settings_from_dict({"storage": [{"type": "local", "path": "/tmp/x", "file_mode": bad}]})


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_planted_symlinks_fifos_and_dirs_are_foreign_and_never_written_through(tmp_path: Path) -> None:
    store = tmp_path / "store"
    cfg = config(tmp_path, store)
    acked = run_writer(cfg, 2, 16, close=True)
    host = socket.gethostname().replace("-", "_").replace("/", "_") or "host"
    victims = {}
    for name in ("segment", "quarantine", "snapshot", "fifo-target"):
        v = tmp_path / f"victim-{name}"
        v.write_bytes(b"precious " * 100)
        victims[name] = v
    old_ms = int((time.time() - 3600) * 1000)
    orphan = store / f"{old_ms:013d}-{host}-{_dead_pid()}-abcdef000001.seg"  # named like a dead local writer's
    orphan.symlink_to(victims["segment"])
    os.utime(orphan, (time.time() - 3600,) * 2, follow_symlinks=False)
    (store / "quarantine.jsonl").symlink_to(victims["quarantine"])
    (store / "index.snapshot").unlink()
    (store / "index.snapshot").symlink_to(victims["snapshot"])
    os.mkfifo(store / f"{old_ms:013d}-{host}-{_dead_pid()}-abcdef000002.seg")
    (store / f"{old_ms:013d}-{host}-{_dead_pid()}-abcdef000003.seg").mkdir()
    seg = next(p for p in store.glob("*.seg") if p.is_file() and not p.is_symlink())
    off, length, _ = record_map(seg)[0]
    with open(seg, "r+b") as f:  # a bad record: verify --fix tries to append to the quarantine list
        f.seek(off + length - 10)
        f.write(b"\xff" * 4)
    FIGURES.trials += 1
    FIGURES.faults += 6
    FIGURES.expected_lost += 1
    keys = write_keys(tmp_path / "keys", acked, set(acked))
    (res,) = check(cfg, keys)
    assert res["wrong"] == 0 and res["lost"] == 1, res
    r = cli(cfg, "verify", "--quiet", "--fix")
    assert "Traceback" not in r.stderr and r.returncode == 1, r.stdout + r.stderr
    run_writer(cfg, 2, 4, close=True)  # a serving process writes and saves its snapshot
    for v in victims.values():
        assert v.read_bytes() == b"precious " * 100, f"{v} was written through a planted link"
    assert orphan.is_symlink() and (store / "quarantine.jsonl").is_symlink()
    assert not (store / "index.snapshot").is_symlink()  # replaced by rename, never written through
