"""Record codec: byte-exact round trips, strict parsing, raw fallback."""

from __future__ import annotations

import numpy as np
import pytest

from lifeboat_cache.records import codec, payloads
from lifeboat_cache.records.codec import HEADER_SIZE
from lifeboat_cache.records.payloads import RecordError


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
    codec.verify_record(h, blob[HEADER_SIZE:], digest=dg, namespace=ns)
    out = np.empty_like(flat)
    payloads.decode_into(h.codec, blob[HEADER_SIZE:], out, codec.DTYPE_ITEMSIZE[codec.DTYPE_NAMES[h.dtype]])
    assert out.tobytes() == flat.tobytes()
    if not compress:
        assert h.codec == codec.RAW
    if compress and dtype == "bf16":
        assert h.codec == payloads.PLANES and page.nbytes / h.stored_len > 1.1


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
        codec.verify_record(h, memoryview(rec)[HEADER_SIZE:], digest=dg, namespace=ns)
    assert e.value.reason == "checksum"


def test_truncated_and_foreign_records_are_rejected():
    rec, dg, ns = _record()
    h = codec.unpack_header(rec)
    with pytest.raises(RecordError, match="truncated"):
        codec.verify_record(h, memoryview(rec)[HEADER_SIZE:-1], digest=dg, namespace=ns)
    with pytest.raises(RecordError, match="foreign"):
        codec.verify_record(h, memoryview(rec)[HEADER_SIZE:], digest=b"x" * 16, namespace=ns)
    with pytest.raises(RecordError, match="foreign"):
        codec.verify_record(h, memoryview(rec)[HEADER_SIZE:], digest=dg, namespace=b"x" * 16)
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
        payloads.decode_into(h.codec, memoryview(payload), out, 2)


def test_incompressible_plane_is_stored_raw_after_a_probe():
    page = codec.as_bytes_view(_kv_like("bf16", n=1 << 17))
    c, parts = codec.encode(page, 2, True)
    assert c == payloads.PLANES
    sizes = np.frombuffer(parts[0], dtype="<u4")
    plane_len = page.nbytes // 2
    assert sizes[0] < plane_len  # sign/exponent bytes compress
    assert sizes[1] == plane_len and parts[2] is not None and memoryview(parts[2]).nbytes == plane_len
    out = np.empty_like(page)
    payloads.decode_into(c, memoryview(b"".join(bytes(memoryview(p).cast("B")) for p in parts)), out, 2)
    assert out.tobytes() == page.tobytes()


@pytest.mark.parametrize("cuts", [(4096, 8192), (4095, 9001)])  # element-aligned pieces, and pieces cutting elements
def test_decode_into_pieces(cuts):
    page = codec.as_bytes_view(_kv_like("bf16", n=1 << 13))
    c, parts = codec.encode(page, 2, True)
    payload = memoryview(b"".join(bytes(memoryview(p).cast("B")) for p in parts))
    out = np.zeros_like(page)
    pieces = [out[: cuts[0]], out[cuts[0]: cuts[1]], out[cuts[1]:]]
    payloads.decode_into(c, payload, pieces, 2)
    assert out.tobytes() == page.tobytes()


# ------------------------------------------------------------------ format version 2 (xxh3) and version 1
def test_new_records_are_version_2_with_an_xxh3_payload_checksum():
    import xxhash

    rec, dg, ns = _record()
    h = codec.unpack_header(rec)
    assert rec[4] == codec.FORMAT_VERSION == h.version == 2
    assert h.payload_crc == xxhash.xxh3_64_intdigest(bytes(rec[HEADER_SIZE:]))
    codec.verify_record(h, memoryview(rec)[HEADER_SIZE:], digest=dg, namespace=ns)


def _v1_record(page: np.ndarray, dg: bytes, ns: bytes, compress: bool) -> bytes:
    """A record exactly as format version 1 wrote it: zlib CRC-32 of the payload and of the header."""
    import struct
    import zlib

    c, parts = codec.encode(page, 2, compress)
    payload = b"".join(bytes(memoryview(p).cast("B")) for p in parts)
    body = struct.pack("<4sBBBBII16s16sII", b"LBKV", 1, c, 5, 0, page.nbytes, len(payload), dg, ns,
                       zlib.crc32(payload), 0)
    return body + struct.pack("<I", zlib.crc32(body)) + bytes(4) + payload


@pytest.mark.parametrize("compress", [True, False])
def test_version_1_records_are_still_read(compress):
    page = codec.as_bytes_view(_kv_like("bf16"))
    dg, ns = b"d" * 16, b"n" * 16
    rec = bytearray(_v1_record(page, dg, ns, compress))
    h = codec.unpack_header(rec)
    assert h.version == 1 and h.raw_len == page.nbytes
    codec.verify_record(h, memoryview(rec)[HEADER_SIZE:], digest=dg, namespace=ns)
    out = np.zeros_like(page)
    payloads.decode_into(h.codec, memoryview(rec)[HEADER_SIZE:], out, 2)
    assert out.tobytes() == page.tobytes()
    rec[HEADER_SIZE + 7] ^= 1  # a version-1 payload is still checked, with its own CRC-32
    with pytest.raises(RecordError) as e:
        codec.verify_record(codec.unpack_header(rec), memoryview(rec)[HEADER_SIZE:], digest=dg, namespace=ns)
    assert e.value.reason == "checksum"
    assert codec.pack_header(h) == bytes(rec[:HEADER_SIZE])  # version 1 headers re-pack byte for byte


def test_an_unknown_format_version_is_rejected_cleanly():
    rec, _, _ = _record()
    h = codec.unpack_header(rec)
    body = bytearray(rec[:56])
    body[4] = 4  # version 3 is a sealed record (sealing.py)
    import xxhash

    forged = bytes(body) + (xxhash.xxh3_64_intdigest(bytes(body)) & 0xFFFFFFFF).to_bytes(4, "little") + bytes(4)
    with pytest.raises(RecordError, match="format version 4") as e:
        codec.unpack_header(forged + bytes(rec[HEADER_SIZE:]))
    assert e.value.reason == "header" and h.version == 2


# ------------------------------------------------------------------ bounds: declared sizes are checked first
def _forge(h: codec.Header, payload: bytes) -> bytes:
    """A record with valid checksums for whatever the header declares (what a hostile writer can do)."""
    h = codec.Header(h.codec, h.dtype, h.raw_len, len(payload), h.digest, h.namespace, codec.payload_crc([payload]))
    return codec.pack_header(h) + payload


def _lying_frame(declared: int) -> bytes:
    """A valid zstd frame of zeros that declares (and really decodes to) `declared` bytes."""
    import zstandard

    c = zstandard.ZstdCompressor(level=1).compressobj(size=declared)
    chunk = bytes(1 << 20)
    out = [c.compress(chunk) for _ in range(declared >> 20)]
    return b"".join(out) + c.flush()


@pytest.mark.parametrize("declared", [1 << 30, 64 << 20])
def test_a_zstd_frame_declaring_more_than_the_page_is_a_miss_before_any_allocation(declared):
    import resource

    import zstandard

    page = codec.as_bytes_view(_kv_like("bf16", n=1 << 15))  # 64 KiB page, 32 KiB planes
    dg, ns = b"d" * 16, b"n" * 16
    plane_len = page.nbytes // 2
    frame = _lying_frame(declared)  # 1 GiB: ~40 KiB of frame (longer than a plane); 64 MiB: ~3 KiB
    honest = zstandard.ZstdCompressor().compress(bytes(plane_len))  # the other plane: honest
    payload = struct_pack_sizes(len(frame), len(honest)) + frame + honest
    rec = _forge(codec.Header(payloads.PLANES, 5, page.nbytes, 0, dg, ns, 0), payload)
    h = codec.unpack_header(rec)
    codec.verify_record(h, memoryview(rec)[HEADER_SIZE:], digest=dg, namespace=ns)  # its checksums are valid
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = np.zeros_like(page)
    with pytest.raises(RecordError) as e:
        payloads.decode_into(h.codec, memoryview(rec)[HEADER_SIZE:], out, 2)
    assert e.value.reason == "payload"
    assert ("plane table" if len(frame) > plane_len else f"declares {declared} bytes") in str(e.value)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 32 << 10  # KiB: no big allocation
    with pytest.raises(RecordError, match=f"declares {declared} bytes"):  # the same lie, whole-page zstd
        payloads.decode_into(payloads.ZSTD, memoryview(frame), np.zeros(len(frame) + 1, np.uint8), 1)


def struct_pack_sizes(*sizes: int) -> bytes:
    import struct

    return struct.pack(f"<{len(sizes)}I", *sizes)


def test_plane_tables_that_do_not_add_up_are_rejected_before_decoding():
    page = codec.as_bytes_view(_kv_like("bf16", n=1 << 13))
    c, parts = codec.encode(page, 2, True)
    assert c == payloads.PLANES
    payload = b"".join(bytes(memoryview(p).cast("B")) for p in parts)
    out = np.zeros_like(page)
    for sizes in ((1 << 30, 0), (page.nbytes, 8), (len(payload), len(payload))):
        bad = struct_pack_sizes(*sizes) + payload[8:]
        with pytest.raises(RecordError, match="plane table"):
            payloads.decode_into(c, memoryview(bad), out, 2)


def test_a_header_storing_more_than_its_raw_length_is_rejected():
    h = codec.Header(payloads.PLANES, 5, 1024, 4096, b"d" * 16, b"n" * 16, 0)
    with pytest.raises(RecordError, match="exceeds the raw length") as e:
        codec.unpack_header(codec.pack_header(h))
    assert e.value.reason == "header"


def test_compressed_record_recodes_raw_records_only():
    page = codec.as_bytes_view(_kv_like("bf16"))
    dg, ns = b"d" * 16, b"n" * 16
    header, parts, _ = codec.build_record(page, itemsize=2, dtype=5, digest=dg, namespace=ns, compress=False)
    raw = header + b"".join(bytes(memoryview(p).cast("B")) for p in parts)
    packed = codec.compressed_record(raw)
    h = codec.unpack_header(packed)
    assert h.codec == payloads.PLANES and len(packed) < 0.95 * len(raw)
    codec.verify_record(h, memoryview(packed)[HEADER_SIZE:], digest=dg, namespace=ns)
    out = np.zeros_like(page)
    payloads.decode_into(h.codec, memoryview(packed)[HEADER_SIZE:], out, 2)
    assert out.tobytes() == page.tobytes()
    assert codec.compressed_record(packed) is packed  # already compressed: unchanged
    noise = codec.as_bytes_view(np.random.default_rng(1).integers(0, 2**16, 1 << 14, dtype=np.uint16))
    header, parts, _ = codec.build_record(noise, itemsize=2, dtype=5, digest=dg, namespace=ns, compress=False)
    raw = header + b"".join(bytes(memoryview(p).cast("B")) for p in parts)
    assert codec.compressed_record(raw) is raw  # does not compress: stays raw


# ------------------------------------------------------------------ decode straight into the destination
def _payload(page: np.ndarray, itemsize: int) -> tuple[int, memoryview]:
    c, parts = codec.encode(codec.as_bytes_view(page), itemsize, True)
    return c, memoryview(b"".join(bytes(memoryview(p).cast("B")) for p in parts))


@pytest.mark.parametrize("cuts", [(), (4096,), (1, 4097, 30000)])
def test_a_zstd_page_decodes_straight_into_one_buffer_or_its_pieces(cuts):
    page = codec.as_bytes_view(_kv_like("uint8"))
    c, payload = _payload(page, 1)
    assert c == payloads.ZSTD
    out = np.zeros_like(page)
    bounds = [0, *cuts, page.nbytes]
    pieces = [out[a:b] for a, b in zip(bounds, bounds[1:])]
    payloads.decode_into(c, payload, pieces[0] if len(pieces) == 1 else pieces, 1)
    assert out.tobytes() == page.tobytes()


def test_pages_of_changing_sizes_decode_exactly_on_one_thread():
    """The per-thread plane buffer grows and is sliced per page: every page must still be exact,
    including float32 pages whose two high planes both compress (two planes in the buffer)."""
    for dtype, n in (("bf16", 1 << 16), ("bf16", 1 << 12), ("float32", 1 << 15), ("bf16", 1 << 17),
                     ("float16", 1 << 14)):
        page = _kv_like(dtype, n=n, seed=n)
        flat = codec.as_bytes_view(page)
        c, payload = _payload(page, page.dtype.itemsize)
        assert c == payloads.PLANES
        out = np.zeros_like(flat)
        payloads.decode_into(c, payload, out, page.dtype.itemsize)
        assert out.tobytes() == flat.tobytes(), (dtype, n)


def test_plane_payloads_decode_the_same_as_zstds_one_shot_decompress():
    """Records written before the decode-into change are the same bytes: decoding them plane by plane
    with zstd's plain decompress (the old decoder) and merging gives the page decode_into gives."""
    import struct

    import zstandard

    page = codec.as_bytes_view(_kv_like("bf16", n=1 << 16))
    c, payload = _payload(page, 2)
    sizes = struct.unpack_from("<2I", payload, 0)
    planes, pos = [], 8
    for size in sizes:
        chunk = bytes(payload[pos: pos + size])
        pos += size
        planes.append(np.frombuffer(chunk if size == page.nbytes // 2 else
                                    zstandard.ZstdDecompressor().decompress(chunk), np.uint8))
    old = np.empty_like(page)
    payloads.merge_planes_into(planes, old, 2)
    new = np.empty_like(page)
    payloads.decode_into(c, payload, new, 2)
    assert old.tobytes() == new.tobytes() == page.tobytes()


def test_a_truncated_zstd_frame_is_a_payload_error_not_a_short_page():
    page = codec.as_bytes_view(_kv_like("uint8"))
    c, payload = _payload(page, 1)
    out = np.zeros_like(page)
    for cut in (1, 16, len(payload) // 2):
        with pytest.raises(RecordError) as e:
            payloads.decode_into(c, payload[: len(payload) - cut], out, 1)
        assert e.value.reason == "payload"
