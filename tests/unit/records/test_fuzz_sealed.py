"""Property-based fuzzing of sealed records: damaged ones (bytes flipped, overwritten, cut, appended,
with the checksums made valid again or not) and forged ones (plaintext or sealed with another key,
any header fields) are refused with RecordError or open to the exact page; never a wrong page, never
another exception. Both read paths of the store are replayed: a private buffer (`Sealer.decode_into`)
and a raw page read straight into the destination and opened in place (`Sealer.open_in_place`).
Seeded (`derandomize`); LIFEBOAT_FUZZ_SCALE multiplies the example counts."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("hypothesis")
from hypothesis import given, strategies as st  # noqa: E402
from support.sealed import forge_checksums  # noqa: E402
from test_fuzz_codec import DIGEST, NS, _figure, _settings, damage, judge_read, page  # noqa: E402

from lifeboat_cache.records import codec  # noqa: E402
from lifeboat_cache.records.codec import HEADER_SIZE, SEAL_OVERHEAD
from lifeboat_cache.records.payloads import RecordError  # noqa: E402
from lifeboat_cache.records.keyring import Key, Keyring, key_id  # noqa: E402
from lifeboat_cache.records.sealing import Sealer  # noqa: E402


def _sealer(raw: bytes) -> Sealer:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    k = Key(key_id(raw), Path("fuzz"), AESGCM(raw), raw)
    return Sealer(Keyring(k, {k.id: k}, {k.id: k}))


SEALER, OTHER = _sealer(os.urandom(32)), _sealer(os.urandom(32))


def read_sealed(record: bytes, dst: np.ndarray, in_place: bool) -> None:
    """The store's read of a record for a page of dst's size (`ReadPath._verified`, store_read.py); raises RecordError."""
    n = dst.nbytes
    buf = memoryview(record)
    h = codec.unpack_header(buf)
    if h.raw_len != n:
        raise RecordError("size", "page size")
    if in_place and len(record) == HEADER_SIZE + n + SEAL_OVERHEAD and n:
        # as _read_bufs lays it out: header + nonce, the ciphertext in the page, the tag
        dst[:] = np.frombuffer(record, np.uint8, n, HEADER_SIZE + codec.NONCE_BYTES)
        parts = [buf[HEADER_SIZE: HEADER_SIZE + codec.NONCE_BYTES], memoryview(dst), buf[len(record) - 16:]]
        payload: Any = parts if h.sealed else [memoryview(dst)]
        codec.verify_record(h, payload, digest=DIGEST, namespace=NS, checksum=not h.sealed)
        SEALER.open_in_place(h, payload)
        return
    payload = buf[HEADER_SIZE:]
    codec.verify_record(h, payload, digest=DIGEST, namespace=NS, checksum=not h.sealed)
    SEALER.decode_into(h, payload, [dst])


@pytest.mark.parametrize("compress", [False, True], ids=["raw", "compressed"])
def test_fuzz_damaged_sealed_records_are_refused_or_exact(capsys: Any, compress: bool) -> None:
    tally: Counter = Counter()

    @_settings(500)
    @given(st.data())
    def run(data: Any) -> None:
        arr = data.draw(page())
        flat = arr.view(np.uint8).reshape(-1)
        header, parts, _ = SEALER.build(flat, itemsize=arr.dtype.itemsize, dtype=codec.dtype_code(arr),
                                        digest=DIGEST, namespace=NS, compress=compress)
        record = b"".join([header, *(bytes(memoryview(p).cast("B")) for p in parts)])
        bad = data.draw(damage(record))
        if data.draw(st.booleans()) and len(bad) >= HEADER_SIZE and bad[:4] == codec.MAGIC:
            bad = forge_checksums(bad)  # a forger who makes the checksums valid again
        dst = np.full(flat.nbytes, 0xAB, np.uint8)
        in_place = data.draw(st.booleans())
        judge_read(tally, lambda: read_sealed(bad, dst, in_place=in_place), dst, flat,
                   "a damaged sealed record opened into a wrong page")

    run()
    _figure(capsys, f"damaged sealed {'compressed' if compress else 'raw'} records", tally)
    assert tally["other"] == tally["wrong"] == 0 and tally["refused"] > 0


def test_fuzz_forged_records_never_open(capsys: Any) -> None:
    """Records a writer without the key can make, checksums valid: plaintext ones (any codec), ones
    sealed with another key under our key id or its own, and arbitrary sealed-looking payloads."""
    tally: Counter = Counter()
    reasons: Counter = Counter()

    @_settings(500)
    @given(st.data())
    def run(data: Any) -> None:
        arr = data.draw(page())
        flat = arr.view(np.uint8).reshape(-1)
        kind = data.draw(st.sampled_from(["plaintext", "other_key", "other_key_our_id", "junk"]))
        if kind == "plaintext":
            header, parts, _ = codec.build_record(flat, itemsize=arr.dtype.itemsize, dtype=codec.dtype_code(arr),
                                                  digest=DIGEST, namespace=NS, compress=data.draw(st.booleans()))
            record = b"".join([header, *(bytes(memoryview(p).cast("B")) for p in parts)])
        else:
            header, parts, _ = OTHER.build(flat, itemsize=arr.dtype.itemsize, dtype=codec.dtype_code(arr),
                                           digest=DIGEST, namespace=NS, compress=data.draw(st.booleans()))
            record = bytearray(b"".join([header, *(bytes(memoryview(p).cast("B")) for p in parts)]))
            if kind != "other_key":  # claim our key's id
                record[60:64] = SEALER.keyring.sealing.id.to_bytes(4, "little")  # type: ignore[union-attr]
            if kind == "junk":
                tail = data.draw(st.binary(min_size=len(record) - HEADER_SIZE, max_size=len(record) - HEADER_SIZE))
                record[HEADER_SIZE:] = tail
            record = bytearray(forge_checksums(record))
        dst = np.full(flat.nbytes, 0xAB, np.uint8)
        try:
            read_sealed(bytes(record), dst, in_place=data.draw(st.booleans()))
        except RecordError as e:
            tally["refused"] += 1
            reasons[e.reason] += 1
            return
        tally["wrong" if dst.tobytes() != flat.tobytes() or kind != "junk" else "other"] += 1
        raise AssertionError(f"a forged {kind} record was served")

    run()
    _figure(capsys, "forged records against a sealed store", tally, accepted="served")
    assert tally["refused"] == 500 * int(os.environ.get("LIFEBOAT_FUZZ_SCALE", "1"))
    assert set(reasons) <= {"unsealed", "sealed_unknown_key", "sealed_auth", "header"} and reasons["sealed_auth"] > 0


def test_fuzz_planted_twins_never_shadow_the_copy_that_opens(capsys: Any) -> None:
    """A page stored once by the store and up to four times by a writer without the key (plaintext,
    sealed with its own key, the store's record with a flipped bit and forged checksums, garbage), in
    any order, some already indexed and some met in one rebuild batch (tiers.settle_twins with the
    store's Sealer.rank over a real Index): the index ends on the copy that opens, every time."""
    from lifeboat_cache.index import Index
    from lifeboat_cache.tiers import settle_twins

    tally: Counter = Counter()

    @_settings(200)
    @given(st.data())
    def run(data: Any) -> None:
        arr = data.draw(page())
        flat = arr.view(np.uint8).reshape(-1)
        kw = {"itemsize": arr.dtype.itemsize, "dtype": codec.dtype_code(arr), "digest": DIGEST, "namespace": NS}
        h, parts, _ = SEALER.build(flat, compress=data.draw(st.booleans()), **kw)
        good = b"".join([h, *(bytes(memoryview(p).cast("B")) for p in parts)])
        copies = [good]
        for kind in data.draw(st.lists(st.sampled_from(["plaintext", "other_key", "bad_tag", "junk"]), max_size=4)):
            if kind == "plaintext":
                h, parts, _ = codec.build_record(flat, compress=False, **kw)
                copies.append(b"".join([h, *(bytes(memoryview(p).cast("B")) for p in parts)]))
            elif kind == "other_key":
                h, parts, _ = OTHER.build(flat, compress=False, **kw)
                copies.append(b"".join([h, *(bytes(memoryview(p).cast("B")) for p in parts)]))
            elif kind == "bad_tag":
                bad = bytearray(good)
                bad[data.draw(st.integers(HEADER_SIZE, len(bad) - 1))] ^= 1 << data.draw(st.integers(0, 7))
                copies.append(forge_checksums(bad))
            else:
                copies.append(data.draw(st.binary(min_size=1, max_size=200)))
        order = data.draw(st.permutations(range(len(copies))))
        placed = {(u, 0): copies[c] for u, c in enumerate(order)}  # unit u holds copy order[u] at offset 0
        index, key = Index(), 1234
        cut = data.draw(st.integers(0, len(order)))  # units before the cut: an earlier rebuild batch
        for batch in (range(cut), range(cut, len(order))):
            units = np.array(list(batch), np.uint32)
            cols = settle_twins(index, SEALER.rank, lambda u, o, n: placed[(u, o)][:n],
                                np.full(len(units), key, np.int64), units, np.zeros(len(units), np.uint64),
                                np.array([len(placed[(int(u), 0)]) for u in units], np.uint32))
            index.insert_arrays(*cols, if_absent=True)
        loc = index.get(key)
        assert loc is not None and placed[(loc.unit, 0)] == good, "a twin shadows the copy that opens"
        tally["kept"] += 1
        tally["twins"] += len(copies) - 1

    run()
    with capsys.disabled():
        print(f"\nplanted twins of a sealed page: {tally['kept']} pages, {tally['twins']} twins: the copy that "
              f"opens indexed {tally['kept']} times")
    assert tally["kept"] == 200 * int(os.environ.get("LIFEBOAT_FUZZ_SCALE", "1"))
