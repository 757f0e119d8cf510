"""SIGKILL mid-write with encryption on: every acknowledged page comes back, sealed, byte-exact,
from fresh processes (recovery walks sealed records like any other: their checksums cover the
sealed bytes, so no key is needed to find them)."""

from __future__ import annotations

import os
import random
from pathlib import Path

from harness import FIGURES, age_segments, check, cli, config, run_writer, write_keys

from lifeboat_cache.records import codec

THREADS, PAGES = 6, 48


def _sealed_config(root: Path, store: Path, key: Path) -> Path:
    cfg = config(root, store, engine={"deadline_s": 600})
    cfg.write_text(cfg.read_text() + f"encryption:\n  keys: [{str(key)!r}]\n")
    return cfg


def test_sigkill_mid_write_with_encryption_loses_no_acknowledged_page(tmp_path: Path) -> None:
    rng = random.Random(2026)
    key = tmp_path / "seal.key"
    key.write_bytes(os.urandom(32))
    os.chmod(key, 0o600)
    for trial in range(2):
        root = tmp_path / f"t{trial}"
        root.mkdir()
        store = root / "store"
        cfg = _sealed_config(root, store, key)
        acked = run_writer(cfg, THREADS, PAGES, kill_after_acks=rng.randint(40, THREADS * PAGES // 2))
        assert len(acked) >= 40
        keys = write_keys(root / "keys", [f"t{t}-{i}" for t in range(THREADS) for i in range(PAGES)], set(acked))
        FIGURES.trials += 1
        for res in check(cfg, keys, copies=2):
            assert res["wrong"] == 0 and res["lost"] == 0, res
        data = b"".join(p.read_bytes() for p in store.glob("*.seg"))
        assert data.count(codec.MAGIC + bytes([codec.FORMAT_VERSION])) == 0  # no plaintext record written
        assert data.count(codec.MAGIC + bytes([codec.SEALED_VERSION])) >= len(acked)
        # A writer killed between reserving its offset and writing leaves a hole in its open segment:
        # verify reports it until the segment is adopted (sealed around the hole), as after any crash.
        age_segments(store)
        (res,) = check(cfg, keys)
        assert res["wrong"] == 0 and res["lost"] == 0, res
        r = cli(cfg, "verify", "--quiet")
        assert r.returncode == 0, r.stdout + r.stderr
