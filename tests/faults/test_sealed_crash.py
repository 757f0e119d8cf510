"""SIGKILL mid-write with encryption on: every acknowledged page comes back, sealed, byte-exact,
from fresh processes (recovery walks sealed records like any other: their checksums cover the
sealed bytes, so no key is needed to find them), also with planted twins of every page (a writer
without the key) that never shadow the copies that open, nor make gc remove them."""

from __future__ import annotations

import os
import random
from pathlib import Path

from lifeboat_cache import namespace_fingerprint

import numpy as np
from harness import FIGURES, age_segments, check, cli, config, record_map, run_writer, write_keys
from support.sealed import forge_checksums

from lifeboat_cache.records import build_trailer, codec, digests
from lifeboat_cache.tiers.segments import SNAPSHOT_NAME

NS = namespace_fingerprint(model="fault-suite")  # child.py's
PAGE_ELEMS = 8192

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


def _twin_segment(store: Path, acked: list[str]) -> Path:
    """What a writer without the key leaves after the crash: for every acknowledged page a twin in a
    segment of its own (a foreign host's, sealed with a valid trailer, newer than every segment of
    the victim): a plaintext page of other content, or the victim's own record with one ciphertext
    bit flipped and the checksums forged (a tag that no longer verifies)."""
    victim = {d: (seg, off, n) for seg in sorted(store.glob("*.seg")) for off, n, d in record_map(seg)}
    (digests_, _) = digests(NS, acked)
    out = bytearray()
    entries = []
    for i, (k, d) in enumerate(zip(acked, digests_)):
        if i % 2 and d in victim:
            seg, off, n = victim[d]
            rec = bytearray(seg.read_bytes()[off:off + n])
            rec[codec.HEADER_SIZE + 40] ^= 0x01
            rec = bytearray(forge_checksums(rec))
        else:
            header, parts, _ = codec.build_record(np.full(PAGE_ELEMS, i, np.uint16).view(np.uint8), itemsize=2,
                                                  dtype=codec.DTYPE_CODES["u2"], digest=d, namespace=NS,
                                                  compress=False)
            rec = bytearray(header + b"".join(bytes(memoryview(p)) for p in parts))
        h = codec.unpack_header(rec)
        entries.append((h.digest, len(out), len(rec), h.raw_len))
        out += rec
    ms = max(int(p.name.split("-", 1)[0]) for p in store.glob("*.seg")) + 1000
    twin = store / f"{ms:013d}-attacker-4242-deadbeef000001.seg"
    twin.write_bytes(bytes(out) + build_trailer(len(out), entries))
    os.chmod(twin, 0o600)
    (store / SNAPSHOT_NAME).unlink(missing_ok=True)
    return twin


def test_planted_twins_after_a_sigkill_never_shadow_an_acknowledged_page_and_gc_keeps_them(tmp_path: Path) -> None:
    """SIGKILL mid-write with encryption on, then twins of every acknowledged page planted by a writer
    without the key and the index snapshot removed: fresh processes serve every acknowledged page
    exactly (none wrong, none lost), and so they do after `lifeboat gc` with the victim's config, which
    removed the twins' segment and none of the victim's records."""
    key = tmp_path / "seal.key"
    key.write_bytes(os.urandom(32))
    os.chmod(key, 0o600)
    store = tmp_path / "store"
    cfg = _sealed_config(tmp_path, store, key)
    acked = run_writer(cfg, THREADS, PAGES, kill_after_acks=THREADS * PAGES // 3)
    keys = write_keys(tmp_path / "keys", [f"t{t}-{i}" for t in range(THREADS) for i in range(PAGES)], set(acked))
    age_segments(store)  # the dead writer's open segments are adopted (sealed) by the next open
    for res in check(cfg, keys):
        assert res["wrong"] == 0 and res["lost"] == 0, res
    twin = _twin_segment(store, acked)
    FIGURES.trials += 1
    for res in check(cfg, keys, copies=2):
        assert res["wrong"] == 0 and res["lost"] == 0, res
    r = cli(cfg, "gc")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not twin.exists()  # nothing of it was indexed: compaction removed it whole
    (res,) = check(cfg, keys)
    assert res["wrong"] == 0 and res["lost"] == 0, res
