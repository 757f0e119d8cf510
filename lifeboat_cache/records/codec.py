"""Record format: a 64-byte self-describing header, then the payload.

A record carries everything needed to check it without any index: magic, format version, codec,
dtype, raw and stored lengths, the 16-byte key digest, the namespace fingerprint, a checksum of the
stored payload and a checksum of the header itself. Parsing is strict: a truncated, foreign or
corrupted record raises `RecordError` (the store turns that into a miss) and is never half-used.

Format versions (all are read; plaintext records are written as version 2, sealed ones as 3):
  1  payload and header checksums are zlib CRC-32 (~2 GB/s per core: the raw path's main cost).
  2  payload checksum is xxh3-64 (~20 GB/s per core, `xxhash`), stored as a u64 where version 1 had
     the payload CRC and the 4 reserved bytes; header checksum is the low 32 bits of xxh3-64 of the
     first 56 bytes. The first 12 bytes (magic, version, codec, dtype, flags, raw length) are unchanged.
  3  a sealed record (records/sealing.py, `encryption:`): the version 2 header with the sealing key's id (u32)
     in the last 4 bytes (covered by the header checksum); the payload is nonce (12 bytes) + the
     AES-256-GCM ciphertext of the version 2 payload (same codecs) + tag (16 bytes), so stored length
     = inner stored length + SEAL_OVERHEAD. The payload checksum covers the sealed bytes, so tiers,
     scans and gc check and move sealed records without a key. `aad(h)` is what the tag binds.
Checksums catch accidents (torn writes, bit rot, a wrong file); they are not authentication: anyone
who can write the store's files can forge a record that verifies (see docs/storage.md). Sealing is.

Bounds: a record never stores more than its raw page (the encoder falls back to raw), so a reader
rejects a record whose stored length exceeds its raw length, and one whose raw length is not the
destination's size, before it reads or allocates anything.

The payload codecs (RAW, ZSTD, PLANES: pure functions over buffers, and their speed notes) live in
payloads.py.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import xxhash

from .payloads import CODEC_NAMES, RAW, RecordError, encode

__all__ = ["DTYPE_CODES", "DTYPE_ITEMSIZE", "DTYPE_NAMES", "FORMAT_VERSION", "HEADER_BODY_SIZE", "HEADER_FMT",
           "HEADER_FMT_V1", "HEADER_SIZE", "MAGIC", "NONCE_BYTES", "READ_VERSIONS", "SEALED_VERSION", "SEAL_OVERHEAD",
           "TAG_BYTES", "Header", "aad", "as_bytes_view", "build_record", "compressed_record", "dtype_code",
           "encode_page", "pack_header", "payload_crc", "raw_length", "unpack_header", "verify_record"]

MAGIC = b"LBKV"
FORMAT_VERSION = 2  # bump when the header layout or a codec's payload layout changes
SEALED_VERSION = 3  # a sealed record: version 2's header + key id, payload nonce + ciphertext + tag
READ_VERSIONS = (1, 2, 3)
NONCE_BYTES, TAG_BYTES = 12, 16
SEAL_OVERHEAD = NONCE_BYTES + TAG_BYTES  # a sealed payload is this much longer than its plaintext
HEADER_FMT = "<4sBBBBII16s16sQ"  # version 2: ... + payload xxh3-64; + header check (u32), 4 reserved
HEADER_FMT_V1 = "<4sBBBBII16s16sII"  # version 1: ... + payload crc32, 4 reserved; + header crc32
HEADER_SIZE = 64
NS_AT = 32  # the namespace fingerprint's offset in a record header (every format version)
_BODY = struct.Struct(HEADER_FMT)
_BODY_V1 = struct.Struct(HEADER_FMT_V1)
_CRC = struct.Struct("<I")
_AAD = struct.Struct("<4sBBBBII16s16sI")  # a sealed record's associated data: every field but checksums
assert _BODY.size + 8 == HEADER_SIZE and _BODY_V1.size + 8 == HEADER_SIZE
HEADER_BODY_SIZE = _BODY.size  # the header bytes its checksum covers (before the check and the tail)

# dtype codes: the header records the element type so `verify` can report it and planes know itemsize.
DTYPE_CODES = {"u1": 0, "i1": 1, "u2": 2, "i2": 3, "f2": 4, "bf16": 5, "u4": 6, "i4": 7, "f4": 8,
               "u8": 9, "i8": 10, "f8": 11, "b1": 12}
DTYPE_NAMES = {v: k for k, v in DTYPE_CODES.items()}
DTYPE_ITEMSIZE = {"u1": 1, "i1": 1, "b1": 1, "u2": 2, "i2": 2, "f2": 2, "bf16": 2, "u4": 4, "i4": 4,
                  "f4": 4, "u8": 8, "i8": 8, "f8": 8}


@dataclass(frozen=True, slots=True)
class Header:
    codec: int
    dtype: int
    raw_len: int
    stored_len: int
    digest: bytes
    namespace: bytes
    payload_crc: int  # the payload checksum: CRC-32 (version 1) or xxh3-64 (versions 2, 3)
    flags: int = 0
    version: int = FORMAT_VERSION
    key_id: int = 0  # sealed records (version 3): the id of the key that sealed it (keyring.key_id)

    @property
    def record_len(self) -> int:
        return HEADER_SIZE + self.stored_len

    @property
    def sealed(self) -> bool:
        return self.version == SEALED_VERSION


def aad(h: Header) -> bytes:
    """A sealed record's associated data: magic, version, codec, dtype, flags, lengths, key digest,
    namespace and key id. The tag binds them, so a record whose header was edited to claim another
    key, namespace, size or sealing key does not open. Raises struct.error for an out-of-range field."""
    return _AAD.pack(MAGIC, h.version, h.codec, h.dtype, h.flags, h.raw_len, h.stored_len, h.digest,
                     h.namespace, h.key_id)


def _header_check(body: bytes, version: int, tail: bytes = b"") -> int:
    """The header checksum: over the first 56 bytes, and for version 3 the key id after them too."""
    return zlib.crc32(body) if version == 1 else xxhash.xxh3_64_intdigest(body + tail) & 0xFFFFFFFF


def pack_header(h: Header) -> bytes:
    """The 64 header bytes of h, in h.version's layout (version 1 only for tests of old stores).

    Raises struct.error when a field does not fit its slot (a length over 4 GiB, a negative
    number): a caller's bug, never a property of stored data.
    """
    if h.version == 1:
        body = _BODY_V1.pack(MAGIC, 1, h.codec, h.dtype, h.flags, h.raw_len, h.stored_len,
                             h.digest, h.namespace, h.payload_crc, 0)
    else:
        body = _BODY.pack(MAGIC, SEALED_VERSION if h.sealed else FORMAT_VERSION, h.codec, h.dtype, h.flags,
                          h.raw_len, h.stored_len, h.digest, h.namespace, h.payload_crc)
    tail = _CRC.pack(h.key_id) if h.sealed else b"\0\0\0\0"
    return body + _CRC.pack(_header_check(body, h.version, tail if h.sealed else b"")) + tail


def unpack_header(buf: bytes | memoryview) -> Header:
    """Parse and check a header (magic, version, header checksum, codec/dtype codes, lengths).

    Raises RecordError with reason 'truncated' when buf is shorter than HEADER_SIZE, and 'header'
    for anything else that is not a valid header of a version this build reads.
    """
    if len(buf) < HEADER_SIZE:
        raise RecordError("truncated", f"{len(buf)} header bytes")
    body = bytes(buf[: _BODY.size])
    if body[:4] != MAGIC:
        raise RecordError("header", "bad magic")
    version = body[4]
    if version not in READ_VERSIONS:
        raise RecordError("header", f"format version {version}, this build reads {READ_VERSIONS}")
    (hcrc,) = _CRC.unpack_from(buf, _BODY.size)
    tail = bytes(buf[_BODY.size + 4: HEADER_SIZE]) if version == SEALED_VERSION else b""
    if _header_check(body, version, tail) != hcrc:
        raise RecordError("header", "header checksum mismatch")
    if version == 1:
        _, _, codec, dtype, flags, raw_len, stored_len, digest, ns, pcrc, _ = _BODY_V1.unpack(body)
    else:
        _, _, codec, dtype, flags, raw_len, stored_len, digest, ns, pcrc = _BODY.unpack(body)
    if codec not in CODEC_NAMES or dtype not in DTYPE_NAMES:
        raise RecordError("header", f"unknown codec {codec} or dtype {dtype}")
    if version == SEALED_VERSION:  # the bounds below hold for the plaintext inside
        if stored_len < SEAL_OVERHEAD:
            raise RecordError("header", f"sealed record of {stored_len} payload bytes")
        (key_id,) = _CRC.unpack(tail)
        inner = stored_len - SEAL_OVERHEAD
        if (codec == RAW and inner != raw_len) or inner > raw_len:
            raise RecordError("header", f"sealed payload of {inner} bytes for a {raw_len}-byte page")
        return Header(codec, dtype, raw_len, stored_len, digest, ns, pcrc, flags, version, key_id)
    if codec == RAW and stored_len != raw_len:
        raise RecordError("header", "raw record with stored != raw length")
    if stored_len > raw_len:  # the encoder stores raw when compression does not pay
        raise RecordError("header", f"stored length {stored_len} exceeds the raw length {raw_len}")
    return Header(codec, dtype, raw_len, stored_len, digest, ns, pcrc, flags, version)


def raw_length(header: bytes | memoryview) -> int:
    """The raw page length field of a packed header (no checks: for the writer's own headers).

    Raises nothing; on fewer than 12 bytes the number is meaningless, so never use it on read data.
    """
    return int.from_bytes(bytes(header[8:12]), "little")


def dtype_code(arr: np.ndarray) -> int:
    """The header's dtype code for arr's element type; one this format has no code for (complex,
    strings) is recorded as u1, so it is stored whole-page instead of as byte planes. Raises nothing."""
    name = f"{arr.dtype.kind}{arr.dtype.itemsize}"
    return DTYPE_CODES.get(name, DTYPE_CODES["u1"])


def as_bytes_view(buf: object) -> np.ndarray:
    """A flat uint8 view of a C-contiguous buffer, no copy. Raises TypeError/ValueError otherwise."""
    if isinstance(buf, np.ndarray):
        arr = buf
    else:
        arr = np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8)  # type: ignore[arg-type]
    if not arr.flags.c_contiguous:
        raise ValueError("page buffers must be C-contiguous")
    return arr.reshape(-1).view(np.uint8)


def payload_crc(parts: Sequence[object], version: int = FORMAT_VERSION) -> int:
    """The payload checksum of the parts, in order: xxh3-64 (version 2) or CRC-32 (version 1).

    Raises TypeError when a part is not a contiguous buffer.
    """
    if version == 1:
        crc = 0
        for p in parts:
            crc = zlib.crc32(p, crc)  # type: ignore[arg-type]
        return crc
    if len(parts) == 1:
        return xxhash.xxh3_64_intdigest(parts[0])  # type: ignore[arg-type]
    h = xxhash.xxh3_64()
    for p in parts:
        h.update(p)  # type: ignore[arg-type]
    return h.intdigest()


def build_record(page: np.ndarray | Sequence[np.ndarray], *, itemsize: int, dtype: int, digest: bytes,
                 namespace: bytes, compress: bool,
                 alloc: Callable[[int], np.ndarray] | None = None) -> tuple[bytes, list[object], int]:
    """Encode one page -> (header bytes, payload parts, record length).

    `page` is one flat uint8 buffer, or the flat uint8 pieces that make the page in order
    (scatter-gather). A raw record keeps the pieces as payload parts (no copy); the compressing
    codecs need one buffer, so compressed pieces are gathered first (one copy, on the io worker).
    With `alloc` (the io task's arena) new payload bytes are taken from it (payloads.encode).
    Raises ValueError when a piece is not a flat C-contiguous uint8 array or itemsize does not
    divide it, struct.error when a field does not fit the header (a page over 4 GiB).
    """
    codec, parts, raw_len, stored = encode_page(page, itemsize, compress, alloc)
    h = Header(codec, dtype, raw_len, stored, digest, namespace, payload_crc(parts))
    return pack_header(h), parts, HEADER_SIZE + stored


def encode_page(page: np.ndarray | Sequence[np.ndarray], itemsize: int, compress: bool,
                alloc: Callable[[int], np.ndarray] | None = None) -> tuple[int, list[object], int, int]:
    """build_record's encoding step without the header: (codec, payload parts, raw length, stored
    length). sealing.py seals these parts (no checksum of the plaintext is needed there)."""
    pieces = [page] if isinstance(page, np.ndarray) else list(page)
    if len(pieces) > 1 and compress:
        whole = np.empty(sum(p.nbytes for p in pieces), np.uint8) if alloc is None else alloc(
            sum(p.nbytes for p in pieces))
        np.concatenate(pieces, out=whole)
        pieces = [whole]
    raw_len = sum(p.nbytes for p in pieces)
    codec, parts = encode(pieces[0], itemsize, compress, alloc) if len(pieces) == 1 else (RAW, pieces)
    stored = raw_len if codec == RAW else sum(memoryview(p).nbytes for p in parts)  # type: ignore[arg-type]
    return codec, parts, raw_len, stored


def compressed_record(record: bytes | memoryview) -> bytes | memoryview:
    """A raw record of our own re-encoded compressed (the copy to a tier that compresses); a
    compressed record, or a page that does not compress, is returned unchanged.

    The caller verified the record already (the payload checksum is not checked again here).
    Raises RecordError from unpack_header for a bad header, and RecordError('truncated') when the
    record is shorter than its header's raw length.
    """
    h = unpack_header(record)
    if h.codec != RAW or h.raw_len == 0:
        return record
    if len(record) < HEADER_SIZE + h.raw_len:
        raise RecordError("truncated", f"{len(record) - HEADER_SIZE} of {h.raw_len} payload bytes")
    page = np.frombuffer(record, dtype=np.uint8, count=h.raw_len, offset=HEADER_SIZE)
    c, parts = encode(page, DTYPE_ITEMSIZE[DTYPE_NAMES[h.dtype]], True)
    if c == RAW:
        return record
    stored = sum(memoryview(p).nbytes for p in parts)  # type: ignore[arg-type]
    header = pack_header(Header(c, h.dtype, h.raw_len, stored, h.digest, h.namespace, payload_crc(parts)))
    return b"".join([header, *parts])  # type: ignore[list-item]


def verify_record(header: bytes | memoryview | Header, payload: memoryview | Sequence[memoryview], *,
                  digest: bytes | None = None, namespace: bytes | None = None, checksum: bool = True) -> Header:
    """The one record check (reads, recovery scans, `verify`): header, identity when given, payload.

    `header` is the record's header bytes (or a Header the caller already parsed from them); `payload`
    is the stored payload, or its parts in order (a raw record read into a scatter-gather page).
    Returns the parsed header; raises RecordError naming the failing part: the header's reasons (see
    unpack_header), 'foreign' (another key or namespace), 'truncated' (payload length is not the
    header's), 'checksum' (payload checksum mismatch). A scan passes no digest/namespace (it learns
    them from the record); a read passes the ones it asked for. `checksum=False` skips the payload
    checksum: only for a sealed record that is opened next (its tag covers every byte the checksum does).
    """
    h = header if isinstance(header, Header) else unpack_header(header)
    parts = list(payload) if isinstance(payload, (list, tuple)) else [payload]
    if digest is not None and h.digest != digest:
        raise RecordError("foreign", "key digest mismatch")
    if namespace is not None and h.namespace != namespace:
        raise RecordError("foreign", "namespace mismatch")
    if sum(memoryview(p).nbytes for p in parts) != h.stored_len:
        raise RecordError("truncated", "payload shorter than the header says")
    if checksum and payload_crc(parts, h.version) != h.payload_crc:
        raise RecordError("checksum", "payload checksum mismatch")
    return h


Record = tuple[int, bytes, Sequence[object], int]  # (index key, digest, header + payload parts, length)
