"""Byte planes: the vectorised split/merge against the plain transpose, odd sizes, every itemsize,
payloads written by the earlier encoder, forged plane frames, and the encoder's per-thread buffer."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import zstandard

from lifeboat_cache.records import codec, payloads
from lifeboat_cache.records.codec import HEADER_SIZE
from lifeboat_cache.records.payloads import RecordError

DTYPES = {1: "uint8", 2: "bf16", 4: "float32", 8: "float64"}


def _kv_like(itemsize: int, n: int, seed: int = 0) -> np.ndarray:
    """KV-shaped values (per-channel scales, normal values) as a flat uint8 page of n elements."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32) * np.float32(np.exp(rng.standard_normal()))
    if itemsize == 1:
        arr = np.clip(x * 16, -127, 127).astype(np.int8)
    elif itemsize == 2:
        arr = (x.view(np.uint32) >> 16).astype(np.uint16)  # bf16 bits
    else:
        arr = x.astype(np.float32 if itemsize == 4 else np.float64)
    return codec.as_bytes_view(arr)


def _transpose(page: np.ndarray, itemsize: int) -> np.ndarray:
    """The plain definition of the planes (what the encoder wrote before the vectorised split)."""
    return np.ascontiguousarray(page.reshape(-1, itemsize)[:, ::-1].T)


def _joined(parts: list[object]) -> memoryview:
    return memoryview(b"".join(bytes(memoryview(p).cast("B")) for p in parts))  # type: ignore[arg-type]


@pytest.mark.parametrize("itemsize", [2, 4, 8, 3])
@pytest.mark.parametrize("n", [1, 3, 4097, 65537])
def test_split_and_merge_match_the_plain_transpose_at_odd_sizes(itemsize, n):
    page = np.random.default_rng(n).integers(0, 256, n * itemsize, dtype=np.uint8)
    planes = payloads.split_planes(page, itemsize)
    assert planes.shape == (itemsize, n)
    assert planes.tobytes() == _transpose(page, itemsize).tobytes()
    out = np.zeros_like(page)
    payloads.merge_planes_into(list(planes), out, itemsize)
    assert out.tobytes() == page.tobytes()


def test_merging_planes_into_a_buffer_of_another_size_raises():
    planes = payloads.split_planes(np.arange(64, dtype=np.uint8), 2)
    with pytest.raises(ValueError):
        payloads.merge_planes_into(list(planes), np.zeros(66, np.uint8), 2)


@pytest.mark.parametrize("itemsize", [1, 2, 4, 8])
@pytest.mark.parametrize("n", [1, 7, 12345, 100003])
def test_records_of_odd_sizes_round_trip_for_every_itemsize(itemsize, n):
    page = _kv_like(itemsize, n, seed=n)
    dg, ns = b"d" * 16, b"n" * 16
    header, parts, length = codec.build_record(page, itemsize=itemsize, dtype=codec.DTYPE_CODES[
        {1: "u1", 2: "bf16", 4: "f4", 8: "f8"}[itemsize]], digest=dg, namespace=ns, compress=True)
    payload = _joined(parts)
    assert HEADER_SIZE + len(payload) == length
    h = codec.verify_record(header, payload, digest=dg, namespace=ns)
    if n >= 12345:  # big enough for the codec to pay: planes for multi-byte items, zstd for bytes
        assert h.codec == (payloads.ZSTD if itemsize == 1 else payloads.PLANES), (itemsize, n, h.codec)
    out = np.zeros_like(page)
    payloads.decode_into(h.codec, payload, out, itemsize)
    assert out.tobytes() == page.tobytes()
    cut = (n // 2) * itemsize + (1 if n > 2 else 0)  # pieces that cut an element in two
    pieces = [np.zeros(cut, np.uint8), np.zeros(page.nbytes - cut, np.uint8)]
    payloads.decode_into(h.codec, payload, pieces, itemsize)
    assert b"".join(p.tobytes() for p in pieces) == page.tobytes()


@pytest.mark.parametrize("itemsize", [2, 4])
def test_payloads_of_the_earlier_encoder_still_decode(itemsize):
    """The payload layout did not change: planes from the plain transpose, each a zstd frame (here
    zstd's default level 3, as any writer may choose) or raw, behind the u32 size table."""
    page = _kv_like(itemsize, 1 << 15)
    n = page.nbytes // itemsize
    frames = []
    for plane in _transpose(page, itemsize):
        z = zstandard.ZstdCompressor(level=3).compress(plane.tobytes())
        frames.append(z if len(z) < 0.95 * n else plane.tobytes())
    payload = struct.pack(f"<{itemsize}I", *map(len, frames)) + b"".join(frames)
    dg, ns = b"d" * 16, b"n" * 16
    dtype = codec.DTYPE_CODES["bf16" if itemsize == 2 else "f4"]
    for version in (1, codec.FORMAT_VERSION):  # an old store's CRC-32 records and today's
        h = codec.Header(payloads.PLANES, dtype, page.nbytes, len(payload), dg, ns,
                         codec.payload_crc([payload], version), version=version)
        got = codec.verify_record(codec.pack_header(h), memoryview(payload), digest=dg, namespace=ns)
        out = np.zeros_like(page)
        payloads.decode_into(got.codec, memoryview(payload), out, itemsize)
        assert out.tobytes() == page.tobytes()


def test_encoded_parts_survive_the_next_encode_on_the_same_thread():
    """High planes are split into a per-thread buffer; a high plane stored raw must be a copy, or the
    next page encoded on the thread would rewrite a payload that is still waiting to be written."""
    a, b = _kv_like(4, 1 << 15, seed=1), _kv_like(4, 1 << 15, seed=2)
    c, parts = codec.encode(a, 4, True)
    sizes = struct.unpack("<4I", bytes(parts[0]))  # type: ignore[arg-type]
    assert c == payloads.PLANES and any(s == a.nbytes // 4 for s in sizes[:3]), "no raw high plane: test is moot"
    codec.encode(b, 4, True)
    out = np.zeros_like(a)
    payloads.decode_into(c, _joined(parts), out, 4)
    assert out.tobytes() == a.tobytes()


def test_a_forged_or_truncated_plane_frame_is_a_payload_error_and_the_page_is_untouched():
    big, small = _kv_like(2, 1 << 15, seed=3), _kv_like(2, 1 << 14, seed=4)
    _, big_parts = codec.encode(big, 2, True)
    c, parts = codec.encode(small, 2, True)
    sizes = struct.unpack("<2I", bytes(parts[0]))  # type: ignore[arg-type]
    hi, lo = bytes(parts[1]), bytes(memoryview(parts[2]).cast("B"))  # type: ignore[arg-type]
    assert c == payloads.PLANES and sizes[0] < small.nbytes // 2, "high plane must be a zstd frame"
    big_hi = bytes(big_parts[1])  # type: ignore[arg-type]
    cases = {
        "truncated frame": struct.pack("<2I", len(hi) - 9, len(lo)) + hi[:-9] + lo,
        "frame of a bigger page": struct.pack("<2I", len(big_hi), len(lo)) + big_hi + lo
        if len(big_hi) < small.nbytes // 2 else None,
        "flipped frame byte": struct.pack("<2I", len(hi), len(lo)) + hi[:40] + bytes([hi[40] ^ 0xFF]) + hi[41:] + lo,
        "table shorter than the payload": struct.pack("<2I", len(hi), len(lo) - 1) + hi + lo,
    }
    for name, payload in cases.items():
        if payload is None:
            continue
        out = np.zeros_like(small)
        try:
            payloads.decode_into(c, memoryview(payload), out, 2)
        except RecordError as e:
            assert e.reason == "payload", name
            assert not out.any(), f"{name}: the page was written before the error"
        else:  # a flipped literal can still decode (the checksum, checked first, is what catches it)
            assert name == "flipped frame byte" and out.tobytes() != small.tobytes()


class _Arena:
    """An alloc that hands out slices of one buffer and records them (what the io task's arena does)."""

    def __init__(self, size: int) -> None:
        self.buf, self.pos, self.taken = np.zeros(size, np.uint8), 0, []

    def __call__(self, n: int) -> np.ndarray:
        out = self.buf[self.pos: self.pos + n]
        self.pos += n
        self.taken.append(n)
        return out


@pytest.mark.parametrize("itemsize", [1, 2, 4])
def test_records_built_into_an_arena_are_the_same_pages_and_own_no_other_memory(itemsize):
    """With the io task's arena, a compressed record's new bytes (frames, the raw low plane, a gathered
    page of pieces) live in the arena, and the record decodes to the page as one built without it."""
    page = (_kv_like(itemsize, 1 << 16, seed=itemsize) if itemsize > 1
            else np.random.default_rng(1).integers(0, 16, 1 << 16, dtype=np.uint8))  # 4 bits a byte: zstd
    dtype = codec.DTYPE_CODES[{1: "u1", 2: "bf16", 4: "f4"}[itemsize]]
    dg, ns = b"d" * 16, b"n" * 16
    half = page.nbytes // 2
    for src in (page, [page[:half].copy(), page[half:].copy()]):  # one buffer, and SGLang-style pieces
        arena = _Arena(4 * page.nbytes)
        header, parts, length = codec.build_record(src, itemsize=itemsize, dtype=dtype, digest=dg, namespace=ns,
                                                   compress=True, alloc=arena)
        h = codec.verify_record(header, _joined(parts), digest=dg, namespace=ns)
        assert h.codec == (payloads.ZSTD if itemsize == 1 else payloads.PLANES)
        for p in parts[1 if itemsize > 1 else 0:]:  # every payload part but the plane size table
            assert isinstance(p, np.ndarray) and np.shares_memory(p, arena.buf), type(p)
        out = np.zeros_like(page)
        payloads.decode_into(h.codec, _joined(parts), out, itemsize)
        assert out.tobytes() == page.tobytes()
        plain = codec.build_record(page, itemsize=itemsize, dtype=dtype, digest=dg, namespace=ns, compress=True)
        assert length == plain[2]  # the same frames: zstd's stream reader and its one-shot call agree


def test_a_page_that_does_not_compress_is_stored_raw_with_or_without_an_arena():
    page = np.random.default_rng(3).integers(0, 256, 1 << 16, dtype=np.uint8)
    for alloc in (None, _Arena(4 * page.nbytes)):
        c, parts = payloads.encode(page, 1, True, alloc)
        assert c == payloads.RAW and parts[0] is page


@pytest.mark.parametrize("codec_id", [payloads.RAW, payloads.PLANES])
@pytest.mark.parametrize("itemsize", [2, 4, 8])
def test_a_page_decodes_into_pieces_spread_over_a_pool_and_nowhere_else(codec_id, itemsize):
    """A layer_first page is pieces one stride apart in the host pool (merged as rows of one view):
    every arrangement decodes the same bytes into the pieces and leaves every other byte of the pool
    as it was: equal strides, a reversed order, uneven gaps, pieces of another size between them."""
    rows, row_bytes = 12, 512 * itemsize
    page = _kv_like(itemsize, rows * row_bytes // itemsize, seed=itemsize)
    _, parts = payloads.encode(page, itemsize, compress=codec_id != payloads.RAW)
    if codec_id == payloads.PLANES:
        assert payloads.encode(page, itemsize, compress=True)[0] == payloads.PLANES
    payload = _joined(parts)
    stride = 3 * row_bytes  # room between the rows, as other pages' tokens lie between a page's layers
    layouts = {
        "strided": [i * stride for i in range(rows)],
        "reversed": [(rows - 1 - i) * stride for i in range(rows)],
        "uneven": [i * stride + (row_bytes if i % 5 == 4 else 0) for i in range(rows)],
        "two runs": [i * stride for i in range(rows // 2)] + [i * stride + row_bytes for i in range(rows // 2)],
    }
    for name, starts in layouts.items():
        pool = np.full(rows * stride + 2 * row_bytes, 0xA5, np.uint8)
        pieces = [pool[s: s + row_bytes] for s in starts]
        payloads.decode_into(codec_id, payload, pieces, itemsize)
        assert b"".join(p.tobytes() for p in pieces) == page.tobytes(), name
        mask = np.ones(pool.nbytes, bool)
        for s in starts:
            mask[s: s + row_bytes] = False
        assert (pool[mask] == 0xA5).all(), f"{name}: bytes outside the pieces were written"
    sizes = [row_bytes] * 3 + [row_bytes // 2, row_bytes // 2] + [row_bytes] * (rows - 4)  # a row in two halves
    pool = np.full(rows * stride + 2 * row_bytes, 0xA5, np.uint8)
    pieces, at = [], 0
    for k, size in enumerate(sizes):
        pieces.append(pool[at: at + size])
        at += size if k == 3 else stride
    payloads.decode_into(codec_id, payload, pieces, itemsize)
    assert b"".join(p.tobytes() for p in pieces) == page.tobytes()
