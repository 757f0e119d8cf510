"""Sealed records (sealing.py): key files, config, the sealed format, and one test per failure story
on a real local tier: tampering, moving, planting, a wrong / rotated-out / other namespace's key,
rotation with gc, crypto-shredding purge, verify's reports, nonces that never repeat."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.chunks import keys, page
from support.sealed import encryption, forge_checksums, make_key, plant, raw_record, with_identity

from lifeboat_cache import ChunkStore, namespace_fingerprint
from lifeboat_cache.cli import main as cli_main
from lifeboat_cache.config import ConfigError, load_settings, settings_from_dict
from lifeboat_cache.records import codec, payloads
from lifeboat_cache.records.keyring import key_id, key_id_text, load_keyring, read_key_file
from lifeboat_cache.records.sealing import AUTH, NO_KEY, UNKNOWN_KEY, UNSEALED, Nonces, Sealer, sealer_for

NS = namespace_fingerprint(model="sealing-test", dtype="bfloat16", page_size=64)
NS_B = namespace_fingerprint(model="sealing-test", dtype="bfloat16", page_size=64, key_namespace="b")


def local(tmp: Path, name: str = "store", **tier: object) -> dict[str, object]:
    return {"type": "local", "path": str(tmp / name), "capacity": "64MiB", "segment_size": "1MiB", **tier}


def settings(tmp: Path, enc: dict[str, object] | None, *, key_namespace: str = "", **tier: object):
    doc: dict[str, object] = {"storage": [local(tmp, **tier)], "engine": {"io_workers": 2}}
    if enc is not None:
        doc["encryption"] = enc
    if key_namespace:
        doc["key_namespace"] = key_namespace
    return settings_from_dict(doc)


def misses(st: ChunkStore) -> dict[str, int]:
    return {k: v for k, v in st.stats()["counters"].items() if k.startswith("miss_")}


def get(st: ChunkStore, ks: list[str], ref: list[np.ndarray], ns: bytes = NS) -> list[bool]:
    out = [np.empty_like(p) for p in ref]
    ok = st.get_into(ns, ks, out)
    return [bool(o and np.array_equal(a, b)) for o, a, b in zip(ok, out, ref)]


# ------------------------------------------------------------------ key files
def test_key_file_with_mode_0644_is_refused_at_open_naming_the_file_and_the_fix(tmp_path: Path) -> None:
    key = make_key(tmp_path, mode=0o644)
    s = settings(tmp_path, encryption(key))
    with pytest.raises(ConfigError) as e:
        ChunkStore.open(s, background=False)
    assert str(key) in str(e.value) and "0644" in str(e.value) and f"chmod 600 {key}" in str(e.value)
    assert not (tmp_path / "store").exists()  # refused before any tier was opened


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o602])
def test_key_file_usable_by_group_or_others_is_refused(tmp_path: Path, mode: int) -> None:
    with pytest.raises(ConfigError, match="lets group or others use the key"):
        read_key_file(make_key(tmp_path, mode=mode))


def test_missing_and_wrong_length_key_files_name_the_file_and_the_fix(tmp_path: Path) -> None:
    missing = tmp_path / "nope.key"
    with pytest.raises(ConfigError, match=f"{missing}: no such file; create one with `lifeboat keygen {missing}`"):
        read_key_file(missing)
    short = make_key(tmp_path, "short.key", key=b"x" * 31)
    with pytest.raises(ConfigError, match=f"{short}: 31 bytes, not a 256-bit key"):
        read_key_file(short)
    bad_hex = make_key(tmp_path, "hex.key", key=b"zz" * 32 + b"\n")
    with pytest.raises(ConfigError, match="not a 256-bit key"):
        read_key_file(bad_hex)
    raw = os.urandom(32)
    assert read_key_file(make_key(tmp_path, "raw.key", key=raw)) == raw
    assert read_key_file(make_key(tmp_path, "text.key", key=raw.hex().encode() + b"\n")) == raw


def test_keygen_writes_an_owner_only_key_and_never_overwrites(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    p = tmp_path / "k.key"
    assert cli_main(["keygen", str(p)]) == 0
    assert (p.stat().st_mode & 0o777) == 0o600
    assert key_id_text(key_id(read_key_file(p))) in capsys.readouterr().out
    before = p.read_bytes()
    assert cli_main(["keygen", str(p)]) == 2 and p.read_bytes() == before


def test_config_section_and_env_var(tmp_path: Path) -> None:
    k1, k2 = make_key(tmp_path, "1.key"), make_key(tmp_path, "2.key")
    s = settings(tmp_path, {"keys": str(k1), "namespace_keys": {"tenant-b": [str(k2)]}, "require_sealed": False})
    assert s.encryption.enabled and s.encryption.keys == (k1,) and not s.encryption.require_sealed
    assert dict(s.encryption.namespace_keys) == {"tenant-b": (k2,)}
    assert not settings(tmp_path, None).encryption.enabled
    assert not settings_from_dict({"encryption": False}).encryption.enabled
    with pytest.raises(ConfigError, match=r"encryption: unknown key\(s\) key"):
        settings(tmp_path, {"key": str(k1)})
    with pytest.raises(ConfigError, match="lifeboat keygen"):
        settings(tmp_path, {"require_sealed": True})
    cfg = tmp_path / "lifeboat.yaml"
    cfg.write_text(f"storage:\n  - type: local\n    path: {tmp_path / 's'}\n")
    env = {"LIFEBOAT_KEY_FILE": f"{k2}{os.pathsep}{k1}"}
    assert load_settings(cfg, env=env).encryption.keys == (k2, k1)
    with pytest.raises(ConfigError, match=r"^LIFEBOAT_KEY_FILE=.*does not exist"):
        load_settings(cfg, env={"LIFEBOAT_KEY_FILE": str(tmp_path / "missing.key")})


def test_the_same_key_twice_under_two_files_is_refused(tmp_path: Path) -> None:
    raw = os.urandom(32)
    s = settings(tmp_path, encryption(make_key(tmp_path, "a.key", key=raw), make_key(tmp_path, "b.key", key=raw)))
    with pytest.raises(ConfigError, match="same key id"):
        load_keyring(s.encryption)


def test_core_imports_without_cryptography_and_asks_for_it_only_when_sealing(tmp_path: Path) -> None:
    key = make_key(tmp_path)
    code = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'cryptography':
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
from lifeboat_cache import ChunkStore
from lifeboat_cache.config import settings_from_dict, ConfigError
import numpy as np
plain = settings_from_dict({{"storage": [{{"type": "local", "path": "{tmp_path / 'p'}"}}]}})
with ChunkStore.open(plain, background=False) as st:
    assert st.put(b"n" * 16, ["k"], [np.zeros(64, np.uint8)]) == [True]
sealed = settings_from_dict({{"storage": [{{"type": "local", "path": "{tmp_path / 's'}"}}],
                             "encryption": {{"keys": ["{key}"]}}}})
try:
    ChunkStore.open(sealed, background=False)
except ConfigError as e:
    print("refused:", e)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "needs the `cryptography` package" in r.stdout and "lifeboat-cache[seal]" in r.stdout


# ------------------------------------------------------------------ round trip and format
@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_round_trip_sealed_on_a_local_tier_and_no_plaintext_on_disk(tmp_path: Path, compression: str) -> None:
    key = make_key(tmp_path)
    ks, ps = keys(24), [page(i) for i in range(24)]
    with ChunkStore.open(settings(tmp_path, encryption(key), compression=compression), background=False) as st:
        assert all(st.put(NS, ks, ps))
        # scatter-gather pages too (SGLang's layer_first pages are many blocks)
        blocks = [[p[:1000].copy(), p[1000:].copy()] for p in ps[:4]]
        assert all(st.put(NS, ["sg" + k for k in ks[:4]], blocks))
        assert all(get(st, ks, ps))
        outs = [[np.empty(1000, np.uint16), np.empty(len(p) - 1000, np.uint16)] for p in ps[:4]]
        assert all(st.get_into(NS, ["sg" + k for k in ks[:4]], outs))
        assert all(np.array_equal(np.concatenate(o), p) for o, p in zip(outs, ps[:4]))
        rec = raw_record(st, NS, ks[0])
        h = codec.unpack_header(rec)
        assert h.sealed and h.key_id == key_id(read_key_file(key))
        assert h.codec == (codec.RAW if compression == "none" else payloads.PLANES)
        assert st.verify() == []
        st.flush()
    data = b"".join(p.read_bytes() for p in (tmp_path / "store").glob("*.seg"))
    for p in ps:  # no 64-byte run of any page is stored in the clear
        assert p.tobytes()[1000:1064] not in data
    with ChunkStore.open(settings(tmp_path, encryption(key), compression=compression), background=False) as st:
        assert all(get(st, ks, ps))  # and after a reopen (index rebuilt from the sealed segments)


def test_nonces_differ_per_record_and_a_forked_child_draws_its_own_writer_id() -> None:
    n = Nonces()
    a, b = n.next(), n.next()
    assert a[:8] == b[:8] and a != b
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(w, n.next())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(r, 12)
    assert child[:8] != a[:8]
    assert Nonces().next()[:8] != a[:8]  # two stores in one process: two writer ids


NONCE_CHILD = """
import sys, threading, numpy as np
from pathlib import Path
from lifeboat_cache.config import EncryptionSettings
from lifeboat_cache.records.sealing import sealer_for
from lifeboat_cache.records import codec
key, n, out = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
enc = EncryptionSettings(keys=(key,))
page = np.zeros(16, np.uint8)
res = {}
def run(i):
    s = sealer_for(enc)  # one store instance per thread: its own writer id
    got = bytearray()
    for _ in range(n):
        _, parts, _ = s.build(page, itemsize=1, dtype=0, digest=bytes(16), namespace=bytes(16), compress=False)
        got += memoryview(parts[0])[:12]
    res[i] = got
ts = [threading.Thread(target=run, args=(i,)) for i in range(2)]
[t.start() for t in ts]; [t.join() for t in ts]
open(out, "wb").write(res[0] + res[1])
"""


def test_no_nonce_repeats_across_two_processes_and_two_writers_in_1m_records(tmp_path: Path) -> None:
    """Two processes, each with two store instances (two writer ids) sealing concurrently under one
    key: 1,000,000 records, every nonce read back from the sealed payloads, none twice."""
    key = make_key(tmp_path)
    per = 250_000
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[3]))
    procs = [subprocess.Popen([sys.executable, "-c", NONCE_CHILD, str(key), str(per), str(tmp_path / f"n{i}")],
                              env=env) for i in range(2)]
    assert all(p.wait(timeout=600) == 0 for p in procs)
    blob = (tmp_path / "n0").read_bytes() + (tmp_path / "n1").read_bytes()
    nonces = np.frombuffer(blob, dtype="V12")
    assert len(nonces) == 4 * per == 1_000_000
    assert len(np.unique(nonces)) == len(nonces)
    writers = {bytes(x)[:8] for x in nonces[::per]}
    assert len(writers) == 4


# ------------------------------------------------------------------ failure stories: counted misses
def _sealed_store(tmp_path: Path, **kw: object) -> tuple[ChunkStore, list[str], list[np.ndarray]]:
    key = make_key(tmp_path)
    st = ChunkStore.open(settings(tmp_path, encryption(key, **kw)), background=False)
    ks, ps = keys(6), [page(i) for i in range(6)]
    assert all(st.put(NS, ks, ps))
    return st, ks, ps


def test_one_flipped_bit_anywhere_is_a_miss_even_with_valid_checksums(tmp_path: Path) -> None:
    """Every bit of the header and a spread of payload bits, flipped one at a time: as an accident
    and by a forger who makes the checksums valid again. The header checksum or the tag catches each
    (a read skips a sealed payload's checksum: the tag covers it; scans and verify still check it)."""
    st, ks, ps = _sealed_store(tmp_path, require_sealed=True)
    with st:
        rec = raw_record(st, NS, ks[0])
        n = len(rec)
        spots = [b for b in range(codec.HEADER_SIZE) if not 48 <= b < 60]  # all but the checksums themselves
        spots += list(range(codec.HEADER_SIZE, codec.HEADER_SIZE + 12))  # nonce
        spots += list(range(codec.HEADER_SIZE + 12, n - 16, 997)) + list(range(n - 16, n))  # ciphertext, tag
        served = 0
        for b in spots:
            for forge in (False, True):
                bad = bytearray(rec)
                bad[b] ^= 1 << (b % 8)
                plant(st, NS, ks[0], forge_checksums(bad) if forge else bytes(bad))
                served += get(st, ks[:1], ps[:1])[0]
        assert served == 0
        m = misses(st)
        assert sum(m.values()) == 2 * len(spots), m  # every one a counted miss, none an exception
        assert m.get(f"miss_{AUTH}", 0) >= 40 and m.get("miss_header", 0) > 0, m
        truncated = forge_checksums(rec[:-1])  # a tag one byte short
        plant(st, NS, ks[0], truncated)
        assert get(st, ks[:1], ps[:1]) == [False]
        assert all(get(st, ks[1:], ps[1:]))  # the other records still serve


def test_a_record_moved_to_another_namespace_key_or_place_is_a_miss(tmp_path: Path) -> None:
    st, ks, ps = _sealed_store(tmp_path)
    with st:
        rec_a = raw_record(st, NS, ks[0])
        assert all(st.put(NS_B, ["b0"], [ps[1]]))
        # byte for byte into namespace B's key: the header still says A's key: a foreign record
        plant(st, NS_B, "b0", rec_a)
        assert get(st, ["b0"], [ps[0]], ns=NS_B) == [False]
        # with its header edited to claim B's namespace and key (checksums valid): the tag refuses it
        plant(st, NS_B, "b0", with_identity(rec_a, NS_B, "b0"))
        assert get(st, ["b0"], [ps[0]], ns=NS_B) == [False]
        # another key's place in the same namespace, edited or not
        plant(st, NS, ks[1], rec_a)
        assert get(st, ks[1:2], [ps[0]]) == [False]
        plant(st, NS, ks[2], with_identity(rec_a, NS, ks[2]))
        assert get(st, ks[2:3], [ps[0]]) == [False]
        assert misses(st).get(f"miss_{AUTH}") == 2 and misses(st).get("miss_foreign") == 2, misses(st)
        # at another offset as what it is (same key): it opens only as the page it was sealed for
        plant(st, NS, ks[0], rec_a)
        assert get(st, ks[:1], ps[:1]) == [True]


def test_a_planted_plaintext_record_with_valid_checksums_is_a_miss(tmp_path: Path) -> None:
    st, ks, ps = _sealed_store(tmp_path)
    with st:
        header, parts, _ = codec.build_record(page(99).view(np.uint8), itemsize=2, dtype=codec.DTYPE_CODES["u2"],
                                              digest=bytes(16), namespace=NS, compress=False)
        plain = with_identity(header + b"".join(bytes(memoryview(p)) for p in parts), NS, "planted")
        plant(st, NS, "planted", plain)
        assert st.contains(NS, ["planted"]) == [True]
        assert get(st, ["planted"], [page(99)]) == [False]
        assert misses(st) == {f"miss_{UNSEALED}": 1}
        from lifeboat_cache.metrics import misses_by_reason

        assert misses_by_reason(st.stats()["counters"])["unsealed"] == 1  # lifeboat_misses_total{reason}
        assert st.get_into(NS, ["planted"], [np.empty(8192, np.uint16)]) == [False]  # the direct read path too
        bad = st.verify()
        assert len(bad) == 1 and UNSEALED in bad[0]
    # require_sealed: false (a migration from a plaintext store) serves it
    s = settings(tmp_path, encryption(*settings(tmp_path, encryption(tmp_path / "seal.key")).encryption.keys,
                                      require_sealed=False))
    with ChunkStore.open(s, background=False) as st:
        assert get(st, ["planted"], [page(99)]) == [True]
        assert all(get(st, ks, ps))


def test_sealed_records_without_a_key_are_misses_never_errors(tmp_path: Path) -> None:
    st, ks, ps = _sealed_store(tmp_path)
    st.close()
    # a store that writes pages refuses the sealed directory (test_sealed_stays_sealed); one that only
    # looks (the CLI's) opens it, and every page is a counted miss
    with ChunkStore.open(settings(tmp_path, None), background=False, seal=False) as plain:
        assert get(plain, ks, ps) == [False] * len(ks)
        assert misses(plain) == {f"miss_{NO_KEY}": len(ks)}
        assert all(NO_KEY in p for p in plain.verify())
    other = make_key(tmp_path / "other")
    with ChunkStore.open(settings(tmp_path, encryption(other)), background=False) as st:
        assert get(st, ks, ps) == [False] * len(ks)
        assert misses(st) == {f"miss_{UNKNOWN_KEY}": len(ks)}
        # and a record sealed under the wrong key but claiming ours: the tag does not verify
        rec = bytearray(raw_record(st, NS, ks[0]))
        rec[60:64] = key_id(read_key_file(other)).to_bytes(4, "little")
        plant(st, NS, ks[0], forge_checksums(rec))
        assert get(st, ks[:1], ps[:1]) == [False] and misses(st)[f"miss_{AUTH}"] == 1


def test_rotation_both_keys_open_then_the_old_one_dropped_gc_removes_its_records(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    old, new = make_key(tmp_path, "old.key"), make_key(tmp_path, "new.key")
    old_id, new_id = (key_id_text(key_id(read_key_file(k))) for k in (old, new))
    ks, ps = keys(40), [page(i) for i in range(40)]
    with ChunkStore.open(settings(tmp_path, encryption(old)), background=False) as st:
        assert all(st.put(NS, ks[:20], ps[:20]))
    with ChunkStore.open(settings(tmp_path, encryption(new, old)), background=False) as st:
        assert all(get(st, ks[:20], ps[:20]))  # old records open
        assert all(st.put(NS, ks[20:], ps[20:]))  # new ones are sealed with the first key
        assert st.pages_by_key_id() == [{new_id: 20, old_id: 20}]
    cfg = tmp_path / "new-only.yaml"
    cfg.write_text(json.dumps({"storage": [local(tmp_path)], "encryption": encryption(new)}))
    with ChunkStore.open(load_settings(cfg), background=False) as st:
        assert get(st, ks, ps) == [False] * 20 + [True] * 20
        assert misses(st) == {f"miss_{UNKNOWN_KEY}": 20}
        assert len(st.verify()) == 20
    capsys.readouterr()
    assert cli_main(["stats", "--config", str(cfg), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tiers"][0]["pages_by_key_id"] == {new_id: 20, old_id: 20}
    assert cli_main(["verify", "--config", str(cfg), "--quiet"]) == 1
    out = capsys.readouterr().out
    assert out.count(UNKNOWN_KEY) == 20 and "verified 40 records: 20 bad" in out
    assert cli_main(["gc", "--config", str(cfg)]) == 0
    assert "dropped 20 record(s)" in capsys.readouterr().out
    with ChunkStore.open(load_settings(cfg), background=False) as st:
        assert st.pages_by_key_id() == [{new_id: 20}]  # gone from the index, quarantined
        assert st.verify() == []
        assert all(get(st, ks[20:], ps[20:]))
        assert all(st.put(NS, ks[:20], ps[:20]))  # rewritten under the new key
        assert all(get(st, ks, ps))
    segs = list((tmp_path / "store").glob("*.seg"))
    data = b"".join(p.read_bytes() for p in segs)
    assert read_key_file(old) and (old_id not in str(segs))
    assert data.count(bytes.fromhex(old_id)[::-1]) <= 2  # the old records' bytes left with compaction


def test_namespace_keys_keep_tenants_apart_in_one_store(tmp_path: Path) -> None:
    ka, kb = make_key(tmp_path, "a.key"), make_key(tmp_path, "b.key")
    enc = {"namespace_keys": {"a": str(ka), "b": str(kb)}}
    ns_a = namespace_fingerprint(model="m", key_namespace="a")
    ns_b = namespace_fingerprint(model="m", key_namespace="b")
    with ChunkStore.open(settings(tmp_path, enc, key_namespace="a"), background=False) as a:
        assert all(a.put(ns_a, ["x"], [page(1)]))
        rec_a = raw_record(a, ns_a, "x")
    with ChunkStore.open(settings(tmp_path, enc, key_namespace="b"), background=False) as b:
        assert all(b.put(ns_b, ["y"], [page(2)]))
        # b holds the whole store and knows a's namespace: it can neither read a's page ...
        plant(b, ns_b, "stolen", with_identity(rec_a, ns_b, "stolen"))
        assert get(b, ["stolen"], [page(1)], ns=ns_b) == [False]
        # ... nor plant one that a would serve (sealed with b's key, a's identity)
        h, parts, _ = b.sealer.build(page(3).view(np.uint8), itemsize=2, dtype=codec.DTYPE_CODES["u2"],
                                     digest=bytes(16), namespace=ns_a, compress=False)
        forged = with_identity(h + b"".join(bytes(memoryview(p)) for p in parts), ns_a, "x")
        plant(b, ns_a, "x", forged)
    with ChunkStore.open(settings(tmp_path, enc, key_namespace="a"), background=False) as a:
        # a's index keeps a's own copy of x over b's forged twin (issue 27: a twin never shadows the
        # copy that opens), so a serves its page and never b's
        assert get(a, ["x"], [page(1)], ns=ns_a) == [True]
        assert misses(a) == {}
        plant(a, ns_a, "x", forged)  # indexed over it by hand: a counted miss, never b's page
        assert get(a, ["x"], [page(1)], ns=ns_a) == [False]
        assert misses(a) in ({f"miss_{UNKNOWN_KEY}": 1}, {f"miss_{AUTH}": 1})
    with pytest.raises(ConfigError, match="key_namespace 'c' has no key"):
        ChunkStore.open(settings(tmp_path, enc, key_namespace="c"), background=False)
    # an operator's config with every tenant's key and no key_namespace: stats / verify / gc still open
    cfg = tmp_path / "ops.yaml"
    cfg.write_text(json.dumps({"storage": [local(tmp_path)], "encryption": enc}))
    with ChunkStore.open(load_settings(cfg), background=False, seal=False) as ops:
        bad = ops.verify()  # the forgery "stolen" (header edited to claim another key), nothing else:
        assert len(bad) == 1 and all(AUTH in p for p in bad)  # x's forged twin lost to a's own copy
        assert sum(sum(t.values()) for t in ops.pages_by_key_id()) == 3  # x (forged over), y, stolen
        with pytest.raises(ValueError, match="without a sealing key"):
            ops.put(ns_a, ["new"], [page(4)])
    assert cli_main(["stats", "--config", str(cfg)]) == 0


def test_purge_by_key_id_shreds_a_key_s_pages(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    old, new = make_key(tmp_path, "old.key"), make_key(tmp_path, "new.key")
    ks, ps = keys(10), [page(i) for i in range(10)]
    with ChunkStore.open(settings(tmp_path, encryption(old)), background=False) as st:
        assert all(st.put(NS, ks[:5], ps[:5]))
    with ChunkStore.open(settings(tmp_path, encryption(new, old, gc_drops_unreadable=False)),
                         background=False) as st:
        assert all(st.put(NS, ks[5:], ps[5:]))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps({"storage": [local(tmp_path)], "encryption": encryption(new)}))
    old_id = key_id_text(key_id(read_key_file(old)))
    os.unlink(old)  # step 1 of crypto-shredding: the key is gone, every copy of its records is noise
    assert cli_main(["purge", "--config", str(cfg), "--key-id", old_id, "--gc"]) == 0
    assert "5 page(s) dropped" in capsys.readouterr().out
    with ChunkStore.open(load_settings(cfg), background=False) as st:
        assert st.pages_by_key_id() == [{key_id_text(key_id(read_key_file(new))): 5}]
        assert get(st, ks, ps) == [False] * 5 + [True] * 5
    assert cli_main(["purge", "--config", str(cfg), "--key-id", "xyz"]) == 2


def test_sealer_alone_round_trips_every_codec_and_refuses_plaintext() -> None:
    class K:  # a keyring without files
        pass

    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from lifeboat_cache.records.keyring import Key, Keyring

    raw = os.urandom(32)
    k = Key(key_id(raw), Path("mem"), AESGCM(raw), raw)
    s = Sealer(Keyring(k, {k.id: k}, {k.id: k}))
    for p, itemsize, dt in ((page(1).view(np.uint8), 2, codec.DTYPE_CODES["u2"]),
                            (np.zeros(5000, np.uint8), 1, codec.DTYPE_CODES["u1"]),
                            (np.zeros(0, np.uint8), 1, codec.DTYPE_CODES["u1"])):
        for compress in (False, True):
            h, parts, n = s.build(p, itemsize=itemsize, dtype=dt, digest=bytes(16), namespace=NS, compress=compress)
            rec = h + b"".join(bytes(memoryview(x)) for x in parts)
            assert len(rec) == n
            hdr = s.check(rec)
            out = np.empty_like(p)
            s.decode_into(hdr, memoryview(rec)[codec.HEADER_SIZE:], [out])
            assert np.array_equal(out, p)
            re = s.recode(rec, True)
            out2 = np.empty_like(p)
            s.decode_into(codec.unpack_header(re), memoryview(re)[codec.HEADER_SIZE:], [out2])
            assert np.array_equal(out2, p)
    assert not sealer_for(settings_from_dict({}).encryption).active
