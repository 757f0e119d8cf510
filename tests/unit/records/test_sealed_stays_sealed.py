"""Sealed stores that stay sealed (issue 27): one test per finding of the attacker / operator checks.

Small sealed compressed pages round-trip; an empty LIFEBOAT_KEY_FILE is an error, never plaintext; a
failed open leaves no decrypted (or planted) bytes in the caller's page; a sealed store marks its
tiers, and a process without the key refuses to write into it."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from support.sealed import encryption, forge_checksums, make_key, plant, raw_record, with_identity

from lifeboat_cache import ChunkStore, namespace_fingerprint
from lifeboat_cache.cli import main as cli_main
from lifeboat_cache.config import ConfigError, load_settings, settings_from_dict
from lifeboat_cache.records import codec
from lifeboat_cache.records.codec import SEAL_OVERHEAD
from lifeboat_cache.records.keyring import Key, key_id, read_key_file
from lifeboat_cache.records.seal_mark import mark_name, mark_verifies

NS = namespace_fingerprint(model="sealed-stays-sealed", dtype="bfloat16", page_size=64)


def settings(tmp: Path, enc: dict[str, object] | None, **tier: object):
    doc: dict[str, object] = {"storage": [{"type": "local", "path": str(tmp / "store"), "capacity": "64MiB",
                                           "segment_size": "1MiB", **tier}], "engine": {"io_workers": 2}}
    if enc is not None:
        doc["encryption"] = enc
    return settings_from_dict(doc)


def misses(st: ChunkStore) -> dict[str, int]:
    return {k: v for k, v in st.stats()["counters"].items() if k.startswith("miss_") or k == "quarantined"}


def page_compressing_to(n: int, inner: int) -> np.ndarray:
    """An n-byte bf16-like page whose compressed payload is exactly `inner` bytes (searched, seeded)."""
    for seed in range(3):
        noise = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
        for k in range(n):
            p = np.zeros(n, np.uint8)
            p[:k] = noise[:k]
            c, _, _, stored = codec.encode_page(p, 2, True)
            if c != codec.RAW and stored == inner:
                return p.view(np.uint16)
    raise AssertionError(f"no {n}-byte page compressing to {inner} bytes found")


# ------------------------------------------------------------------ 1: small sealed compressed pages
@pytest.mark.parametrize("size", [256, 512])  # compressed payloads are kept under 0.95x: < 560 B
def test_small_sealed_compressed_page_whose_record_looks_raw_round_trips(tmp_path: Path, size: int) -> None:
    """A page compressing to exactly its size minus the seal overhead makes a record as long as a
    plaintext raw one: the read path must not take it for one (it was a miss and quarantined)."""
    p = page_compressing_to(size, size - SEAL_OVERHEAD)
    key = make_key(tmp_path)
    with ChunkStore.open(settings(tmp_path, encryption(key), compression="zstd"), background=False) as st:
        assert st.put(NS, ["small"], [p]) == [True]
        rec = raw_record(st, NS, "small")
        assert len(rec) == codec.HEADER_SIZE + size and codec.unpack_header(rec).codec != codec.RAW
    with ChunkStore.open(settings(tmp_path, encryption(key), compression="zstd"), background=False) as st:
        out = np.empty_like(p)
        assert st.get_into(NS, ["small"], [out]) == [True]
        assert np.array_equal(out, p)
        out2 = [np.empty(size // 2, np.uint8), np.empty(size - size // 2, np.uint8)]  # scatter-gather page
        assert st.get_into(NS, ["small"], [out2]) == [True]
        assert np.array_equal(np.concatenate(out2), p.view(np.uint8))
        assert misses(st) == {}


# ------------------------------------------------------------------ 2: an empty key source is an error
@pytest.mark.parametrize("value", ["", "   "])
def test_empty_lifeboat_key_file_is_an_error_naming_the_variable(tmp_path: Path, value: str) -> None:
    cfg = tmp_path / "lifeboat.yaml"
    cfg.write_text(f"storage:\n  - type: local\n    path: {tmp_path / 's'}\n")
    with pytest.raises(ConfigError, match=r"^LIFEBOAT_KEY_FILE=.*is empty.*unset LIFEBOAT_KEY_FILE"):
        load_settings(cfg, env={"LIFEBOAT_KEY_FILE": value})
    assert not load_settings(cfg, env={}).encryption.enabled  # unset: off, as before


def test_empty_key_file_is_an_error_naming_the_file(tmp_path: Path) -> None:
    empty = make_key(tmp_path, "empty.key", key=b"")
    with pytest.raises(ConfigError, match=f"encryption key file {empty}: 0 bytes.*lifeboat keygen"):
        ChunkStore.open(settings(tmp_path, encryption(empty)), background=False)
    assert not (tmp_path / "store").exists()


# ------------------------------------------------------------------ 6: no decrypted bytes after a failed open
@pytest.mark.parametrize("pieces", [1, 3])
def test_a_failed_open_leaves_no_decrypted_bytes_in_the_page(tmp_path: Path, pieces: int) -> None:
    """A flipped ciphertext bit (checksums forged) read straight into the page: the tag refuses it,
    and the page holds none of the plaintext (it held the decrypted page with one bit flipped)."""
    key = make_key(tmp_path)
    p = np.arange(4096, dtype=np.uint16).view(np.uint8)  # no zero byte in a 64-byte window
    with ChunkStore.open(settings(tmp_path, encryption(key)), background=False) as st:
        assert st.put(NS, ["p"], [p]) == [True]
        bad = bytearray(raw_record(st, NS, "p"))
        bad[codec.HEADER_SIZE + 12 + 100] ^= 0x04
        plant(st, NS, "p", forge_checksums(bad))
        cut = np.linspace(0, p.nbytes, pieces + 1).astype(int)
        out = [np.full(b - a, 0xAB, np.uint8) for a, b in zip(cut[:-1], cut[1:])]
        assert st.get_into(NS, ["p"], [out]) == [False]
        got = np.concatenate(out)
        assert not (got == p).sum() > p.nbytes // 4, "decrypted bytes left in the caller's page"
        assert misses(st).get("miss_sealed_auth") == 1


def test_a_refused_plaintext_record_read_into_the_page_is_wiped(tmp_path: Path) -> None:
    """A planted plaintext raw record is read straight into the page, then refused (require_sealed):
    its bytes do not stay in the caller's page."""
    key = make_key(tmp_path)
    planted = np.full(8192, 0x5A, np.uint8)
    with ChunkStore.open(settings(tmp_path, encryption(key)), background=False) as st:
        header, parts, _ = codec.build_record(planted, itemsize=2, dtype=codec.DTYPE_CODES["u2"],
                                              digest=bytes(16), namespace=NS, compress=False)
        plant(st, NS, "x", with_identity(header + b"".join(bytes(memoryview(q)) for q in parts), NS, "x"))
        out = np.zeros(8192, np.uint8)
        assert st.get_into(NS, ["x"], [out]) == [False]
        assert not (out == 0x5A).any()
        assert misses(st) == {"miss_unsealed": 1}


def test_sealer_open_into_a_buffer_wipes_it_on_a_bad_tag(tmp_path: Path) -> None:
    from lifeboat_cache.records.sealing import sealer_for

    s = sealer_for(settings(tmp_path, encryption(make_key(tmp_path))).encryption)
    p = np.arange(2048, dtype=np.uint16).view(np.uint8)
    h, parts, _ = s.build(p, itemsize=2, dtype=codec.DTYPE_CODES["u2"], digest=bytes(16), namespace=NS,
                          compress=False)
    rec = bytearray(h + bytes(memoryview(parts[0])))
    rec[codec.HEADER_SIZE + 40] ^= 1
    out = np.full_like(p, 0xAB)
    with pytest.raises(Exception) as e:
        s.decode_into(codec.unpack_header(rec), memoryview(rec)[codec.HEADER_SIZE:], [out])
    assert getattr(e.value, "reason", None) == "sealed_auth"
    assert (out == p).sum() < p.nbytes // 4



# ------------------------------------------------------------------ 4: a sealed store says so
def _mark(tmp_path: Path, key: Path, name: str = "store") -> Path:
    kid = key_id(read_key_file(key))
    return tmp_path / name / mark_name(kid)


def test_a_sealed_store_marks_each_drive_with_a_mark_only_its_key_makes(tmp_path: Path) -> None:
    key = make_key(tmp_path / "keys")
    doc = {"storage": [{"type": "local", "paths": [str(tmp_path / "d0"), str(tmp_path / "d1")]}],
           "encryption": encryption(key)}
    with ChunkStore.open(settings_from_dict(doc), background=False):
        pass
    raw = read_key_file(key)
    for d in ("d0", "d1"):
        data = _mark(tmp_path, key, d).read_bytes()
        assert mark_verifies(Key(key_id(raw), key, None, raw), data)
        assert raw not in data and raw.hex().encode() not in data and b"sealed" in data
        assert (_mark(tmp_path, key, d).stat().st_mode & 0o777) == 0o600
    other = os.urandom(32)
    assert not mark_verifies(Key(key_id(other), key, None, other), data)


def test_a_process_without_a_key_refuses_to_write_into_a_sealed_store(tmp_path: Path) -> None:
    key = make_key(tmp_path / "keys")
    with ChunkStore.open(settings(tmp_path, encryption(key)), background=False) as st:
        assert st.put(NS, ["a"], [np.ones(4096, np.uint16)]) == [True]
    before = sorted(p.name for p in (tmp_path / "store").iterdir())
    with pytest.raises(ConfigError) as e:
        ChunkStore.open(settings(tmp_path, None), background=False)
    msg = str(e.value)
    assert "\n" not in msg and str(tmp_path / "store") in msg and "is a sealed store" in msg
    assert "LIFEBOAT_KEY_FILE" in msg and "encryption.keys" in msg
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == before  # nothing written
    # the same through lifeboat.yaml without `encryption:` and an unset LIFEBOAT_KEY_FILE
    cfg = tmp_path / "plain.yaml"
    cfg.write_text(f"storage:\n  - type: local\n    path: {tmp_path / 'store'}\n")
    with pytest.raises(ConfigError, match="is a sealed store"):
        ChunkStore.open(load_settings(cfg, env={}), background=False)


def test_without_a_key_a_marked_store_serves_no_plaintext(tmp_path: Path) -> None:
    """require_sealed is on once the mark exists, also for a process without a key that only looks:
    a plaintext record in a sealed store was planted by a writer without the key."""
    key = make_key(tmp_path / "keys")
    with ChunkStore.open(settings(tmp_path, encryption(key)), background=False):
        pass
    planted = np.full(4096, 7, np.uint16)
    with ChunkStore.open(settings(tmp_path, None), background=False, seal=False) as st:
        header, parts, _ = codec.build_record(planted.view(np.uint8), itemsize=2, dtype=codec.DTYPE_CODES["u2"],
                                              digest=bytes(16), namespace=NS, compress=False)
        plant(st, NS, "p", with_identity(header + b"".join(bytes(memoryview(q)) for q in parts), NS, "p"))
        assert st.get_into(NS, ["p"], [np.empty_like(planted)]) == [False]
        assert misses(st) == {"miss_unsealed": 1}
    # an unmarked plaintext store is still served without a key (encryption off)
    with ChunkStore.open(settings(tmp_path / "plain", None), background=False) as st:
        assert st.put(NS, ["p"], [planted]) == [True]
        out = np.empty_like(planted)
        assert st.get_into(NS, ["p"], [out]) == [True] and np.array_equal(out, planted)


def test_a_forged_mark_is_written_again_and_other_keys_marks_are_left_alone(tmp_path: Path,
                                                                             caplog: pytest.LogCaptureFixture) -> None:
    key, other = make_key(tmp_path / "keys", "a.key"), make_key(tmp_path / "keys", "b.key")
    (tmp_path / "store").mkdir()
    _mark(tmp_path, key).write_bytes(b"forged by a writer without the key\n")
    with ChunkStore.open(settings(tmp_path, encryption(other)), background=False):
        pass
    with caplog.at_level("WARNING"), ChunkStore.open(settings(tmp_path, encryption(key)), background=False):
        pass
    raw = read_key_file(key)
    assert mark_verifies(Key(key_id(raw), key, None, raw), _mark(tmp_path, key).read_bytes())
    assert "does not verify" in caplog.text
    assert _mark(tmp_path, other).exists()  # the other key's mark stays
    # a migration (require_sealed off) and the CLI's inspection write no mark
    with ChunkStore.open(settings(tmp_path / "m", encryption(key, require_sealed=False)), background=False):
        pass
    with ChunkStore.open(settings(tmp_path / "i", encryption(key)), background=False, seal=False):
        pass
    assert not list((tmp_path / "m").glob("**/sealed-*")) and not list((tmp_path / "i").glob("**/sealed-*"))


# ------------------------------------------------------------------ 3: a planted twin never shadows the page
TWINS = ("plaintext", "other_key", "bad_tag")


def plant_twins(tmp_path: Path, victim: Path, records: dict[str, bytes], ps: list[np.ndarray], kind: str,
                newer: bool) -> None:
    """What a writer without the key does: twins of the victim's pages (plaintext, sealed with a key of
    its own, or the victim's records with a flipped bit and forged checksums) in a segment file of its
    own, copied into the victim's directory named older or newer than the victim's, and the index
    snapshot removed (so the next open rescans every segment)."""
    other = make_key(tmp_path / "attacker", "own.key")
    with ChunkStore.open(settings(tmp_path / "attacker", encryption(other)), background=False) as a:
        for k, p in zip(records, ps):
            if kind == "other_key":
                assert a.put(NS, [k], [p]) == [True]
                continue
            if kind == "plaintext":
                header, parts, _ = codec.build_record(p.view(np.uint8), itemsize=2, dtype=codec.DTYPE_CODES["u2"],
                                                      digest=bytes(16), namespace=NS, compress=False)
                rec = with_identity(header + b"".join(bytes(memoryview(q)) for q in parts), NS, k)
            else:
                rec = bytearray(records[k])
                rec[codec.HEADER_SIZE + 20] ^= 0x10
                rec = forge_checksums(rec)
            plant(a, NS, k, rec)
    mine = sorted((tmp_path / "store").glob("*.seg"))
    ms = int(mine[-1 if newer else 0].name.split("-", 1)[0]) + (1000 if newer else -1000)
    for seg in (tmp_path / "attacker" / "store").glob("*.seg"):
        seg.rename(victim / f"{ms:013d}-{seg.name.split('-', 1)[1]}")
        ms += 1
    (victim / "index.snapshot").unlink(missing_ok=True)


@pytest.mark.parametrize("newer", [True, False], ids=["twin-newer", "twin-older"])
@pytest.mark.parametrize("kind", TWINS)
def test_a_planted_twin_never_shadows_the_page_that_opens_and_gc_keeps_it(
        tmp_path: Path, kind: str, newer: bool, capsys: pytest.CaptureFixture) -> None:
    key = make_key(tmp_path / "keys")
    ks, ps = [f"t{i}" for i in range(5)], [np.arange(4096, dtype=np.uint16) * (i + 1) for i in range(5)]
    with ChunkStore.open(settings(tmp_path, encryption(key)), background=False) as st:
        assert all(st.put(NS, ks, ps))
        records = {k: raw_record(st, NS, k) for k in ks}
    plant_twins(tmp_path, tmp_path / "store", records, ps, kind, newer)
    for _ in range(2):  # across restarts
        with ChunkStore.open(settings(tmp_path, encryption(key)), background=False) as st:
            out = [np.empty_like(p) for p in ps]
            assert st.get_into(NS, ks, out) == [True] * 5
            assert all(np.array_equal(o, p) for o, p in zip(out, ps)) and misses(st) == {}
            assert st.contains(NS, ks) == [True] * 5
    cfg = tmp_path / "victim.yaml"
    cfg.write_text(f"storage:\n  - type: local\n    path: {tmp_path / 'store'}\n"
                   f"encryption:\n  keys: [{str(key)!r}]\n")
    assert cli_main(["gc", "--config", str(cfg)]) == 0
    capsys.readouterr()
    with ChunkStore.open(load_settings(cfg, env={}), background=False) as st:
        out = [np.empty_like(p) for p in ps]
        assert st.get_into(NS, ks, out) == [True] * 5, misses(st)  # gc removed no page of the victim
        assert all(np.array_equal(o, p) for o, p in zip(out, ps))


# ------------------------------------------------------------------ 5: exists counts only pages this process opens
def test_exists_stops_counting_pages_sealed_with_a_key_this_process_does_not_hold(tmp_path: Path) -> None:
    """A page sealed with a key this process does not hold (rotated out, a wrong key): once a read
    finds so, contains / count_leading_hits no longer count it (SGLang was told 200 of 200 and every
    prefetch missed), and the next put writes it again under this process's key."""
    old, new = make_key(tmp_path / "keys", "old.key"), make_key(tmp_path / "keys", "new.key")
    ks, ps = [f"e{i}" for i in range(20)], [np.full(2048, i, np.uint16) for i in range(20)]
    with ChunkStore.open(settings(tmp_path, encryption(old)), background=False) as st:
        assert all(st.put(NS, ks[:10], ps[:10]))
    with ChunkStore.open(settings(tmp_path, encryption(new)), background=False) as st:
        assert all(st.put(NS, ks[10:], ps[10:]))
        out = [np.empty_like(p) for p in ps]
        assert st.get_into(NS, ks, out) == [False] * 10 + [True] * 10
        assert misses(st) == {"miss_sealed_unknown_key": 10}
        assert st.contains(NS, ks) == [False] * 10 + [True] * 10
        assert st.count_leading_hits(NS, ks) == 0 and st.count_leading_hits(NS, ks[10:]) == 10
        assert st.put(NS, ks[:10], ps[:10]) == [True] * 10  # written again, sealed with the new key
        assert st.stats()["counters"]["pages_written"] == 20
        assert st.count_leading_hits(NS, ks) == 20
        assert st.get_into(NS, ks, out) == [True] * 20
        assert all(np.array_equal(o, p) for o, p in zip(out, ps))
    # a fresh process with the new key only: its open reads the local tier's headers (in the
    # background), so the old key's pages are not counted even before their first read
    with ChunkStore.open(settings(tmp_path, encryption(new)), background=False) as st:
        assert st.put(NS, ["o"], [ps[0]]) == [True]
    with ChunkStore.open(settings(tmp_path, encryption(old)), background=False) as st:
        assert st.key_audit is not None
        st.key_audit.join(30)
        assert st.count_leading_hits(NS, ["o"]) == 0
        # e0-e9 have a copy of each key (twins: the index keeps the one this process opens), e10-e19 not
        assert st.contains(NS, ks) == [True] * 10 + [False] * 10
        assert misses(st) == {}  # not a single read was needed
        out = [np.empty_like(p) for p in ps]
        assert st.get_into(NS, ks, out) == [True] * 10 + [False] * 10


def test_a_page_of_many_blocks_of_any_shape_seals_and_opens(tmp_path: Path) -> None:
    """The streamed seal of a many-block page (SGLang layer_first) takes the store's flat uint8 blocks
    as they are and any other C-contiguous block through a flat view."""
    from lifeboat_cache.records.sealing import sealer_for

    s = sealer_for(settings(tmp_path, encryption(make_key(tmp_path))).encryption)
    blocks = [np.arange(1000, dtype=np.uint16).reshape(10, 100), np.arange(500, dtype=np.float32),
              np.arange(300, dtype=np.uint8)]
    h, parts, n = s.build(blocks, itemsize=1, dtype=0, digest=bytes(16), namespace=NS, compress=False)
    rec = h + bytes(memoryview(parts[0]))
    assert len(rec) == n
    out = np.empty(sum(b.nbytes for b in blocks), np.uint8)
    s.decode_into(s.check(rec), memoryview(rec)[codec.HEADER_SIZE:], [out])
    assert np.array_equal(out, np.concatenate([b.view(np.uint8).reshape(-1) for b in blocks]))


def test_during_a_migration_the_sealed_copy_of_a_page_is_the_one_indexed(tmp_path: Path) -> None:
    """require_sealed off (a plaintext store being sealed): a page stored both sealed and plaintext
    keeps its sealed copy in the index whichever is newer, so the migration converges."""
    key = make_key(tmp_path / "keys")
    p = np.arange(2048, dtype=np.uint16)
    with ChunkStore.open(settings(tmp_path, encryption(key, require_sealed=False)), background=False) as st:
        assert st.put(NS, ["m"], [p]) == [True]
    with ChunkStore.open(settings(tmp_path, None), background=False) as plain:  # a newer plaintext copy
        header, parts, _ = codec.build_record(p.view(np.uint8), itemsize=2, dtype=codec.DTYPE_CODES["u2"],
                                              digest=bytes(16), namespace=NS, compress=False)
        plant(plain, NS, "m", with_identity(header + b"".join(bytes(memoryview(q)) for q in parts), NS, "m"))
    (tmp_path / "store" / "index.snapshot").unlink()
    with ChunkStore.open(settings(tmp_path, encryption(key, require_sealed=False)), background=False) as st:
        assert codec.unpack_header(raw_record(st, NS, "m")).sealed
        out = np.empty_like(p)
        assert st.get_into(NS, ["m"], [out]) == [True] and np.array_equal(out, p)
