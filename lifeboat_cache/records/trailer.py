"""The trailer of a unit of records (a sealed segment file, an S3 object): one table, one footer.

A unit is a run of self-describing records (codec.py), then a trailer: a table of every record's
digest, offset, length and raw length, and a checksummed footer, so a reader lists a unit's records
with one read of its tail. Sealed segments and S3 objects share the layout, so one parser reads both.
Writer tags name the process that wrote a unit (host and pid, plus a random token per process).
"""

from __future__ import annotations

import os
import secrets
import socket
import struct
import zlib
from typing import Sequence

import numpy as np

from .codec import HEADER_SIZE

TABLE_MAGIC = b"LBTB"
FOOTER_MAGIC = b"LBTR"
FOOTER = struct.Struct("<4sIQI")  # magic, count, table offset, table crc; then footer crc (u32)
FOOTER_SIZE = FOOTER.size + 4
TABLE_ENTRY = np.dtype([("key", "<i8"), ("digest_tail", "S8"), ("offset", "<u8"), ("length", "<u4"),
                        ("raw_length", "<u4")])

Entry = tuple[bytes, int, int, int]  # (digest, offset, length, raw length) of one record


def trailer_size(count: int) -> int:
    """Bytes of the trailer (table + footer) of a unit holding `count` records."""
    return 4 + count * TABLE_ENTRY.itemsize + FOOTER_SIZE


def framing(count: int, *, sealed: bool = True) -> int:
    """Bytes of a unit holding `count` records that are not pages: their headers, and the trailer once
    sealed. `capacity:` counts the rest, the pages' bytes, as SGLang's `file` counts its `max_size`."""
    return count * HEADER_SIZE + (trailer_size(count) if sealed else 0)


def build_trailer(at: int, entries: Sequence[Entry]) -> bytes:
    """Trailer for records (digest, offset, length, raw length) ending at byte `at`.

    Sealed segments and S3 objects share this layout, so one parser reads both.
    """
    arr = np.zeros(len(entries), dtype=TABLE_ENTRY)
    if entries:
        digests = np.frombuffer(b"".join(e[0] for e in entries), dtype="S16")
        raw = digests.view(np.uint8).reshape(-1, 16)
        arr["key"] = raw[:, :8].copy().view("<i8").reshape(-1)
        arr["digest_tail"] = raw[:, 8:].copy().view("S8").reshape(-1)
        arr["offset"] = [e[1] for e in entries]
        arr["length"] = [e[2] for e in entries]
        arr["raw_length"] = [e[3] for e in entries]
    table = TABLE_MAGIC + arr.tobytes()
    footer = FOOTER.pack(FOOTER_MAGIC, len(entries), at, zlib.crc32(table))
    return table + footer + struct.pack("<I", zlib.crc32(footer))


def parse_footer(raw: bytes | memoryview, size: int) -> tuple[int, int, int] | None:
    """(count, table offset, table crc) from the last FOOTER_SIZE bytes of a unit of `size` bytes.

    None when the unit has no valid footer (unsealed, torn or not ours).
    """
    raw = bytes(raw)
    if len(raw) != FOOTER_SIZE or raw[:4] != FOOTER_MAGIC:
        return None
    body = raw[: FOOTER.size]
    if zlib.crc32(body) != struct.unpack_from("<I", raw, FOOTER.size)[0]:
        return None
    _, count, table_off, table_crc = FOOTER.unpack(body)
    if table_off + trailer_size(count) != size:
        return None
    return count, table_off, table_crc


def parse_trailer(tail: bytes | memoryview, size: int) -> np.ndarray | None:
    """The record table from the last `len(tail)` bytes of a unit of `size` bytes.

    `tail` must hold at least the whole trailer. None unless footer and table checksums are valid
    and every record lies before the table: a unit without a valid trailer is never half-trusted.
    """
    tail = memoryview(tail).cast("B")
    if len(tail) < FOOTER_SIZE or len(tail) > size:
        return None
    parsed = parse_footer(tail[len(tail) - FOOTER_SIZE:], size)
    if parsed is None:
        return None
    count, table_off, table_crc = parsed
    start = len(tail) - (size - table_off)
    if start < 0:
        return None
    table = bytes(tail[start: len(tail) - FOOTER_SIZE])
    if table[:4] != TABLE_MAGIC or zlib.crc32(table) != table_crc:
        return None
    arr = np.frombuffer(table, dtype=TABLE_ENTRY, offset=4)
    if len(arr) and int((arr["offset"] + arr["length"]).max()) > table_off:
        return None
    return arr


def writer_tag() -> str:
    host = socket.gethostname().replace("-", "_").replace("/", "_") or "host"
    return f"{host}-{os.getpid()}"


def process_token() -> str:
    """Random per-process part of segment names: containers may share a hostname and a pid."""
    return secrets.token_hex(3)
