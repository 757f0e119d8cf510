"""Property-based fuzzing of the record parser: only RecordError escapes, and no wrong page is ever
decoded.

The read path is replayed exactly as `ReadPath._read_group` (store_read.py) runs it (unpack_header, the raw
length against the destination page, verify_record, decode_into), over:
* arbitrary bytes as a header;
* real records (raw, zstd, byte planes; one buffer or scatter-gather pieces) with bytes flipped,
  overwritten, cut or appended: the page decoded is byte-exact or the record is refused;
* forged records whose checksums are valid (records are checksummed, not authenticated): any
  codec, dtype, lengths and payload; decoding must refuse them with RecordError only.

Each test prints a figure. Seeded (`derandomize`); LIFEBOAT_FUZZ_SCALE multiplies the example counts.
"""

from __future__ import annotations

import os
import struct
from collections import Counter
from typing import Any

import numpy as np
import pytest

pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from lifeboat_cache.records import codec, payloads  # noqa: E402
from lifeboat_cache.records.codec import HEADER_SIZE  # noqa: E402
from lifeboat_cache.records.payloads import RecordError  # noqa: E402

SCALE = int(os.environ.get("LIFEBOAT_FUZZ_SCALE", "1"))
DIGEST, NS = b"d" * 16, b"n" * 16


def _settings(n: int) -> settings:
    return settings(max_examples=n * SCALE, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


def read_path(record: bytes, dst: np.ndarray | list[np.ndarray], digest: bytes = DIGEST, ns: bytes = NS) -> None:
    """What the store does with a record read for a page of `dst`'s size; raises RecordError."""
    pieces = [dst] if isinstance(dst, np.ndarray) else dst
    n = sum(p.nbytes for p in pieces)
    buf = memoryview(record)
    h = codec.unpack_header(buf)
    if h.raw_len != n:
        raise RecordError("size", "page size")
    payload = buf[HEADER_SIZE:]
    codec.verify_record(h, payload, digest=digest, namespace=ns)
    itemsize = codec.DTYPE_ITEMSIZE[codec.DTYPE_NAMES[h.dtype]]
    payloads.decode_into(h.codec, payload, dst, itemsize)


def judge_read(tally: Counter, read: Any, dst: np.ndarray, expected: np.ndarray, wrong: str) -> None:
    """Run `read` (which fills `dst`) and count it: refused (RecordError), exact, or (raising) wrong / other."""
    try:
        read()
    except RecordError:
        tally["refused"] += 1
        return
    except Exception:
        tally["other"] += 1
        raise
    if dst.tobytes() == expected.tobytes():
        tally["exact"] += 1
    else:
        tally["wrong"] += 1
        raise AssertionError(wrong)


def _figure(capsys: Any, what: str, tally: Counter, accepted: str = "decoded byte-exact") -> None:
    with capsys.disabled():
        print(f"\n{what}: {sum(tally.values())} inputs: {tally['refused']} refused (RecordError), "
              f"{tally['exact']} {accepted}, {tally['wrong']} wrong pages, {tally['other']} other exceptions")


# ------------------------------------------------------------------ arbitrary bytes
def test_fuzz_header_over_arbitrary_bytes(capsys):
    tally: Counter = Counter()
    valid = codec.pack_header(codec.Header(codec.RAW, 0, 8, 8, DIGEST, NS, 0))

    @_settings(1000)
    @given(st.one_of(st.binary(max_size=128),
                     st.binary(min_size=1, max_size=8).map(lambda b: valid[:60] + b),  # a good prefix
                     st.integers(0, HEADER_SIZE - 1).map(lambda i: valid[:i])))
    def run(data: bytes) -> None:
        try:
            h = codec.unpack_header(data)
        except RecordError:
            tally["refused"] += 1
            return
        except Exception:
            tally["other"] += 1
            raise
        tally["exact"] += 1  # parsed: it must be a header this build wrote (the last 4 bytes are reserved)
        assert codec.pack_header(h)[:HEADER_SIZE - 4] == bytes(data[:HEADER_SIZE - 4])

    run()
    _figure(capsys, "headers over arbitrary bytes", tally, "parsed (and equal to the header packed back)")
    assert tally["other"] == 0


# ------------------------------------------------------------------ damaged real records
_DTYPES = {"u1": np.uint8, "u2": np.uint16, "u4": np.uint32, "u8": np.uint64}


@st.composite
def page(draw: Any) -> np.ndarray:
    kind = draw(st.sampled_from(list(_DTYPES)))
    n = draw(st.integers(1, 96))
    style = draw(st.sampled_from(["random", "low-entropy", "zeros"]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    if style == "zeros":
        arr = np.zeros(n, _DTYPES[kind])
    elif style == "low-entropy":  # compresses: exercises the zstd and planes codecs
        arr = rng.integers(0, 4, n).astype(_DTYPES[kind])
    else:
        arr = rng.integers(0, np.iinfo(_DTYPES[kind]).max, n, dtype=_DTYPES[kind], endpoint=True)
    return arr


@st.composite
def damage(draw: Any, record: bytes) -> bytes:
    kind = draw(st.sampled_from(["flip", "flip", "overwrite", "cut", "append", "splice"]))
    b = bytearray(record)
    if kind == "flip":
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(b) - 1))
            b[i] ^= 1 << draw(st.integers(0, 7))
    elif kind == "overwrite":
        i = draw(st.integers(0, len(b) - 1))
        junk = draw(st.binary(min_size=1, max_size=16))
        b[i:i + len(junk)] = junk
    elif kind == "cut":
        del b[draw(st.integers(0, len(b) - 1)):]
    elif kind == "append":
        b += draw(st.binary(min_size=1, max_size=16))
    else:  # a region moved: a torn write that shifted bytes
        i, j = sorted(draw(st.lists(st.integers(0, len(b)), min_size=2, max_size=2)))
        b = b[:i] + b[j:] + b[i:j]
    return bytes(b)


@pytest.mark.parametrize("compress", [False, True], ids=["raw", "compressed"])
def test_fuzz_damaged_records_are_refused_or_exact(capsys, compress):
    tally: Counter = Counter()

    @_settings(600)
    @given(st.data())
    def run(data: Any) -> None:
        arr = data.draw(page())
        flat = arr.view(np.uint8).reshape(-1)
        pieces_n = data.draw(st.integers(1, 3))
        header, parts, _ = codec.build_record(flat, itemsize=arr.dtype.itemsize, dtype=codec.dtype_code(arr),
                                              digest=DIGEST, namespace=NS, compress=compress)
        record = b"".join([header, *(bytes(memoryview(p).cast("B")) for p in parts)])
        bad = data.draw(damage(record))
        dst = np.full(flat.nbytes, 0xAB, np.uint8)
        cuts = sorted(data.draw(st.lists(st.integers(0, flat.nbytes), min_size=pieces_n - 1,
                                         max_size=pieces_n - 1)))
        target: np.ndarray | list[np.ndarray] = dst if pieces_n == 1 else np.split(dst, cuts)
        judge_read(tally, lambda: read_path(bad, target), dst, flat, "a damaged record decoded into a wrong page")

    run()
    _figure(capsys, f"damaged {'compressed' if compress else 'raw'} records", tally)
    assert tally["other"] == tally["wrong"] == 0 and tally["refused"] > 0


# ------------------------------------------------------------------ forged records (valid checksums)
@st.composite
def forged_record(draw: Any) -> tuple[bytes, int]:
    """A record with valid header and payload checksums but arbitrary fields and payload."""
    codec_id = draw(st.sampled_from([codec.RAW, payloads.ZSTD, payloads.PLANES, 3, 255]))
    dtype = draw(st.sampled_from(sorted(codec.DTYPE_NAMES)))
    page_bytes = draw(st.integers(1, 256))
    shape = draw(st.sampled_from(["junk", "plane-table", "zstd"]))
    if shape == "junk":
        payload = draw(st.binary(max_size=300))
    elif shape == "zstd":  # a real zstd frame of some other length
        payload = payloads.compressor().compress(draw(st.binary(max_size=300)))
    else:  # a plane-size table followed by junk planes
        k = draw(st.sampled_from([1, 2, 4, 8]))
        sizes = draw(st.lists(st.integers(0, 300), min_size=k, max_size=k))
        payload = struct.pack(f"<{k}I", *sizes) + draw(st.binary(max_size=300))
    raw_len = page_bytes if draw(st.booleans()) else draw(st.integers(0, 2**32 - 1))
    stored_len = len(payload) if codec_id != codec.RAW or draw(st.booleans()) else raw_len
    if codec_id == codec.RAW:
        raw_len = stored_len
    version = draw(st.sampled_from([1, codec.FORMAT_VERSION]))  # the old format is still read
    header = codec.pack_header(codec.Header(codec_id, dtype, raw_len, stored_len, DIGEST, NS,
                                            codec.payload_crc([payload], version), version=version))
    return header + payload, page_bytes


def test_fuzz_forged_records_raise_only_record_error(capsys):
    """Checksums are not authentication: a record written by someone else can pass them. Decoding
    it must still end in a verified page of the right size or a RecordError (a miss)."""
    tally: Counter = Counter()
    failures: list[str] = []

    @_settings(1000)
    @given(forged_record())
    def run(case: tuple[bytes, int]) -> None:
        record, page_bytes = case
        dst = np.zeros(page_bytes, np.uint8)
        try:
            read_path(record, dst)
        except RecordError:
            tally["refused"] += 1
            return
        except Exception as e:  # noqa: BLE001 - counted and reported below
            tally["other"] += 1
            if len(failures) < 5:
                failures.append(f"{type(e).__name__}: {e}")
            return
        tally["exact"] += 1  # accepted: the page was filled from a payload that checks out

    run()
    _figure(capsys, "forged records with valid checksums", tally, "decoded into a page of the right size")
    assert tally["other"] == 0, failures
