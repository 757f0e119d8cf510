"""Record codec: byte-exact round trips, strict parsing, raw fallback."""

from __future__ import annotations

import numpy as np
import pytest

from lifeboat_cache import codec
from lifeboat_cache.codec import HEADER_SIZE, RecordError


def _kv_like(dtype: str, n: int = 1 << 15, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32) * np.exp(rng.standard_normal(64)).repeat(n // 64)
    if dtype == "bf16":
        return (x.view(np.uint32) >> 16).astype(np.uint16)
    if dtype == "uint8":
        return (np.clip(x * 16, -127, 127).astype(np.int8)).view(np.uint8)
    return x.astype(dtype)


def test_header_size_is_pinned():
    assert HEADER_SIZE == 64


@pytest.mark.parametrize("dtype", ["bf16", "float16", "float32", "uint8"])
@pytest.mark.parametrize("compress", [True, False])
def test_round_trip_is_byte_exact(dtype, compress):
    page = _kv_like(dtype)
    flat = codec.as_bytes_view(page)
    ns, dg = b"n" * 16, b"d" * 16
    header, parts, length = codec.build_record(flat, itemsize=page.dtype.itemsize, dtype=codec.dtype_code(page),
                                               digest=dg, namespace=ns, compress=compress)
    blob = memoryview(header + b"".join(bytes(memoryview(p).cast("B")) for p in parts))
    assert len(blob) == length
    h = codec.unpack_header(blob)
    codec.check_record(h, blob[HEADER_SIZE:], dg, ns)
    out = np.empty_like(flat)
    codec.decode_into(h.codec, blob[HEADER_SIZE:], out, codec.DTYPE_ITEMSIZE[codec.DTYPE_NAMES[h.dtype]])
    assert out.tobytes() == flat.tobytes()
    if not compress:
        assert h.codec == codec.RAW
    if compress and dtype == "bf16":
        assert h.codec == codec.PLANES and page.nbytes / h.stored_len > 1.1


def test_incompressible_page_is_stored_raw():
    page = np.random.default_rng(1).integers(0, 256, 1 << 16, dtype=np.uint8)
    c, parts = codec.encode(page, 1, True)
    assert c == codec.RAW and parts[0] is page  # no copy


def _record() -> tuple[bytearray, bytes, bytes]:
    page = codec.as_bytes_view(_kv_like("bf16"))
    ns, dg = b"n" * 16, b"d" * 16
    header, parts, _ = codec.build_record(page, itemsize=2, dtype=5, digest=dg, namespace=ns, compress=True)
    return bytearray(header + b"".join(bytes(memoryview(p).cast("B")) for p in parts)), dg, ns


def test_flipped_header_bit_is_rejected():
    rec, dg, ns = _record()
    rec[10] ^= 1
    with pytest.raises(RecordError) as e:
        codec.unpack_header(rec)
    assert e.value.reason == "header"


def test_flipped_payload_bit_is_rejected():
    rec, dg, ns = _record()
    rec[HEADER_SIZE + 100] ^= 1
    h = codec.unpack_header(rec)
    with pytest.raises(RecordError) as e:
        codec.check_record(h, memoryview(rec)[HEADER_SIZE:], dg, ns)
    assert e.value.reason == "checksum"


def test_truncated_and_foreign_records_are_rejected():
    rec, dg, ns = _record()
    h = codec.unpack_header(rec)
    with pytest.raises(RecordError, match="truncated"):
        codec.check_record(h, memoryview(rec)[HEADER_SIZE:-1], dg, ns)
    with pytest.raises(RecordError, match="foreign"):
        codec.check_record(h, memoryview(rec)[HEADER_SIZE:], b"x" * 16, ns)
    with pytest.raises(RecordError, match="foreign"):
        codec.check_record(h, memoryview(rec)[HEADER_SIZE:], dg, b"x" * 16)
    with pytest.raises(RecordError):
        codec.unpack_header(rec[:40])
    with pytest.raises(RecordError, match="bad magic"):
        codec.unpack_header(b"PK\x03\x04" + bytes(60))


def test_corrupt_compressed_payload_never_decodes_silently():
    rec, dg, ns = _record()
    h = codec.unpack_header(rec)
    payload = bytearray(rec[HEADER_SIZE:])
    payload[8:40] = bytes(32)  # garbage in the first plane's zstd frame
    out = np.empty(h.raw_len, dtype=np.uint8)
    with pytest.raises(RecordError):
        codec.decode_into(h.codec, memoryview(payload), out, 2)


def test_incompressible_plane_is_stored_raw_after_a_probe():
    page = codec.as_bytes_view(_kv_like("bf16", n=1 << 17))
    c, parts = codec.encode(page, 2, True)
    assert c == codec.PLANES
    sizes = np.frombuffer(parts[0], dtype="<u4")
    plane_len = page.nbytes // 2
    assert sizes[0] < plane_len  # sign/exponent bytes compress
    assert sizes[1] == plane_len and parts[2] is not None and memoryview(parts[2]).nbytes == plane_len
    out = np.empty_like(page)
    codec.decode_into(c, memoryview(b"".join(bytes(memoryview(p).cast("B")) for p in parts)), out, 2)
    assert out.tobytes() == page.tobytes()


@pytest.mark.parametrize("cuts", [(4096, 8192), (4095, 9001)])  # element-aligned pieces, and pieces cutting elements
def test_decode_into_pieces(cuts):
    page = codec.as_bytes_view(_kv_like("bf16", n=1 << 13))
    c, parts = codec.encode(page, 2, True)
    payload = memoryview(b"".join(bytes(memoryview(p).cast("B")) for p in parts))
    out = np.zeros_like(page)
    pieces = [out[: cuts[0]], out[cuts[0]: cuts[1]], out[cuts[1]:]]
    codec.decode_into(c, payload, pieces, 2)
    assert out.tobytes() == page.tobytes()
