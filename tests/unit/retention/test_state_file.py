"""The retention state file: round trip, and every damaged or hostile file refused whole (ValueError),
never a partial table or another exception."""

from __future__ import annotations

import random
import struct
import zlib

import pytest

from lifeboat_cache.retention import decode, encode


def _sample() -> tuple[dict[str, dict[int, int]], dict[str, int]]:
    hits = {f"{1700000000000 + i:013d}-host-{i}-tok{i:06d}.seg": {o * 4096: 1 + o % 3 for o in range(i)}
            for i in range(1, 30)}
    hits["únicode.seg"] = {2**40: 2}
    return hits, {"únicode.seg": 123, "only-ordered.seg": 2**50}


def test_round_trip() -> None:
    hits, order = _sample()
    got_hits, got_order = decode(encode(hits, order))
    assert got_hits == hits and got_order == order
    assert decode(encode({}, {})) == ({}, {})


def test_every_truncation_and_every_flipped_byte_is_refused() -> None:
    data = encode(*_sample())
    for n in range(len(data)):
        with pytest.raises(ValueError):
            decode(data[:n])
    rng = random.Random(5)
    for at in rng.sample(range(len(data)), 300):
        bad = bytearray(data)
        bad[at] ^= 1 << rng.randrange(8)
        with pytest.raises(ValueError):
            decode(bytes(bad))


def test_forged_files_with_valid_checksums_are_refused() -> None:
    def sealed(body: bytes) -> bytes:
        return body + struct.pack("<I", zlib.crc32(body))

    head = struct.Struct("<4sII")
    cases = [
        sealed(head.pack(b"XXXX", 1, 0)),  # not ours
        sealed(head.pack(b"LBRT", 99, 0)),  # a future version
        sealed(head.pack(b"LBRT", 1, 5)),  # five units announced, none there
        sealed(head.pack(b"LBRT", 1, 1) + struct.pack("<HIq", 3, 2**31, -1) + b"abc"),  # counts past the end
        sealed(head.pack(b"LBRT", 1, 1) + struct.pack("<HIq", 2, 0, -1) + b"\xff\xfe"),  # not UTF-8
        sealed(head.pack(b"LBRT", 1, 0) + b"trailing"),
    ]
    for data in cases:
        with pytest.raises(ValueError):
            decode(data)
