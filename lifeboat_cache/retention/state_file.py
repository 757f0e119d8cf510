"""The retention state file: one process's AccessTable (read counts, queue positions) on disk.

Written with a fresh-file-and-rename, so a crash leaves the previous file whole; read strictly, so a
torn, foreign or hostile file is refused as a whole (ValueError) and costs only what it would have told.
Layout (little endian): magic "LBRT", version u32, unit count u32; per unit: name length u16, record
count u32, position i64 (-1: none), the name (UTF-8), offsets u64[count], counts u8[count]; then the
CRC-32 of everything before it.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

MAGIC = b"LBRT"
VERSION = 1
MAX_BYTES = 256 << 20
_HEAD = struct.Struct("<4sII")
_UNIT = struct.Struct("<HIq")
_CRC = struct.Struct("<I")
_NO_POSITION = -1


def encode(hits: dict[str, dict[int, int]], order: dict[str, int]) -> bytes:
    """The file's bytes for these read counts and positions."""
    names = sorted(set(hits) | set(order))
    parts = [_HEAD.pack(MAGIC, VERSION, len(names))]
    for name in names:
        raw = name.encode()
        counts = hits.get(name, {})
        offs = np.fromiter(counts.keys(), dtype="<u8", count=len(counts))
        cnts = np.fromiter(counts.values(), dtype="u1", count=len(counts))
        parts += [_UNIT.pack(len(raw), len(counts), order.get(name, _NO_POSITION)), raw, offs.tobytes(),
                  cnts.tobytes()]
    body = b"".join(parts)
    return body + _CRC.pack(zlib.crc32(body))


def decode(data: bytes) -> tuple[dict[str, dict[int, int]], dict[str, int]]:
    """(hits, order) from a file's bytes; ValueError when the file is not a whole, valid state file."""
    if len(data) < _HEAD.size + _CRC.size or len(data) > MAX_BYTES:
        raise ValueError(f"{len(data)} bytes is not the size of a retention state file")
    body, (crc,) = data[:-_CRC.size], _CRC.unpack_from(data, len(data) - _CRC.size)
    if zlib.crc32(body) != crc:
        raise ValueError("checksum mismatch (torn or changed file)")
    magic, version, n = _HEAD.unpack_from(body, 0)
    if magic != MAGIC or version != VERSION:
        raise ValueError(f"not a retention state file of version {VERSION}")
    at = _HEAD.size
    hits: dict[str, dict[int, int]] = {}
    order: dict[str, int] = {}
    for _ in range(n):
        if at + _UNIT.size > len(body):
            raise ValueError("truncated unit header")
        name_len, count, position = _UNIT.unpack_from(body, at)
        at += _UNIT.size
        end = at + name_len + 9 * count
        if end > len(body):
            raise ValueError("truncated unit")
        name = body[at:at + name_len].decode("utf-8", errors="strict")
        at += name_len
        offs = np.frombuffer(body, dtype="<u8", count=count, offset=at)
        cnts = np.frombuffer(body, dtype="u1", count=count, offset=at + 8 * count)
        at = end
        if count:
            hits[name] = dict(zip(offs.tolist(), cnts.tolist()))
        if position != _NO_POSITION:
            order[name] = position
    if at != len(body):
        raise ValueError("trailing bytes")
    return hits, order
