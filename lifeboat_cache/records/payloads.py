"""Payload codecs: pure functions that encode a page into payload parts and decode a payload into a page.

The record format around them (header, checksums, identity) is codec.py's; these functions know only
bytes, an element width and a codec id. A payload that does not decode to exactly the destination's
bytes raises `RecordError` (defined here; the store turns it into a miss). zstd frames must declare
exactly the plane/page size they decode to, so a crafted frame cannot make a decoder allocate or spin.

Codecs (pure functions over buffers):
  RAW     the page bytes as they are (also used when compression does not pay).
  ZSTD    zstd over the whole page (1-byte dtypes).
  PLANES  byte planes (all high bytes, then ..., all low bytes), each plane zstd or raw; payload
          starts with one little-endian u32 stored length per plane. For bf16 this is the measured
          best lossless option (~1.47x on real KV); level 1 beats level 3 on ratio and speed.

Speed, per CPU-second of one core (768 KiB real bf16 KV pages, the 2-vCPU Sapphire Rapids dev VM,
`lifeboat bench --only ceilings`): PLANES encodes at ~0.9-1.0 GB/s and decodes at ~1.4-1.5 GB/s.
Decode is bound by zstd's Huffman decoding of the sign/exponent plane, which alone runs at ~2.6-2.9
GB of page per CPU-second (the bench's "zstd frames alone"); the rest is the plane merge (two SIMD
passes) and the xxh3 checksum (~20 GB/s). Measured and not kept, because none beat that floor: one
frame per 64-256 KiB block (the planes stay in L2 while merging: same speed, more per-call cost),
a streamed merge per decoded chunk, other zstd parameters (shorter matches or larger hash tables
decode slower), and python-blosc2 (SHUFFLE + ZSTD level 1: 1.456x, decode 1.4-1.7 GB/s; with LZ4
2.3-3.1 GB/s but 1.12-1.22x). A 3 GB/s compressed decode at this ratio needs a faster entropy
decoder than zstd's on this CPU, not a different layout.
"""

from __future__ import annotations

import struct
import threading
from typing import Callable, Sequence

import numpy as np
import zstandard

RAW, ZSTD, PLANES = 0, 1, 2
CODEC_NAMES = {RAW: "raw", ZSTD: "zstd", PLANES: "planes+zstd"}
KEEP_RATIO = 0.95  # store raw when compressed/raw is above this (ZipNN's rule)
# zstd level 1 with a shallow match search: a KV byte plane has few long matches, so searching less
# leaves more to the entropy coder. On real SmolLM2 bf16 KV pages: ratio 1.449x vs 1.434x for plain
# level 1, compress 1.82 vs 0.67 GB/s, decompress 4.7 vs 3.0 GB/s per core. Decoders need nothing new.
ZSTD_LEVEL = 1
ZSTD_TUNING = {"min_match": 7, "target_length": 0, "hash_log": 6}


class RecordError(ValueError):
    """A record failed verification; `reason` is a short counter name."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason



_local = threading.local()


def compressor() -> zstandard.ZstdCompressor:
    """This thread's zstd compressor, with the format's level and tuning (frames carry their content size)."""
    c = getattr(_local, "cctx", None)
    if c is None:
        params = zstandard.ZstdCompressionParameters.from_level(ZSTD_LEVEL, write_content_size=1, **ZSTD_TUNING)
        c = _local.cctx = zstandard.ZstdCompressor(compression_params=params)
    return c


def _dctx() -> zstandard.ZstdDecompressor:
    d = getattr(_local, "dctx", None)
    if d is None:
        d = _local.dctx = zstandard.ZstdDecompressor()
    return d


def split_planes(page: np.ndarray, itemsize: int) -> np.ndarray:
    """(n*k,) bytes -> (k, n) planes, highest byte first (little-endian input).

    Raises ValueError when itemsize does not divide the page's length.
    """
    planes = np.empty((itemsize, page.nbytes // itemsize), dtype=np.uint8)
    _split_into(page, itemsize, list(planes))
    return planes


def _split_into(page: np.ndarray, itemsize: int, planes: Sequence[np.ndarray]) -> None:
    """Write the byte planes of page into the given plane buffers (highest byte first).

    One shift-and-narrow pass per plane over the page viewed as k-byte words: SIMD loops instead of
    a strided byte transpose (per CPU-second, itemsize 2: ~15 GB/s; 4: 4.3 vs 2.9 for the transpose).
    """
    if itemsize in (2, 4, 8):
        words = page.view(f"<u{itemsize}")
        for j in range(itemsize - 1):
            np.right_shift(words, 8 * (itemsize - 1 - j), out=planes[j], casting="unsafe")
        np.copyto(planes[itemsize - 1], words, casting="unsafe")  # the low byte: a narrowing copy
        return
    view = page.reshape(-1, itemsize)
    for j, plane in enumerate(planes):
        plane[:] = view[:, itemsize - 1 - j]


def _join_u16(hi: np.ndarray, lo: np.ndarray, out: np.ndarray) -> None:
    """out (uint16) = hi * 256 + lo for two uint8 planes: two SIMD passes (multiply-widen, then
    add-widen). Measured per CPU-second on a 768 KiB page: 9.7 GB/s, against 6.0 for the
    equivalent left_shift/bitwise_or pair (numpy's uint16 shift loop is not vectorised) and 2.6
    for strided byte assignment."""
    np.multiply(hi, 256, out=out, dtype=np.uint16)
    np.add(out, lo, out=out, dtype=np.uint16)


def merge_planes_into(planes: Sequence[np.ndarray], dst: np.ndarray, itemsize: int) -> None:
    """Inverse of split_planes, written straight into dst, a flat uint8 buffer of
    len(planes[0]) * itemsize bytes. Raises ValueError when the sizes do not match."""
    if itemsize == 2 and len(planes) == 2:
        _join_u16(planes[0], planes[1], dst.view("<u2"))
        return
    if itemsize == 4 and len(planes) == 4:  # two u16 halves, then one u32 join (3.9 vs 2.9 GB/s strided)
        words, n = dst.view("<u4"), planes[0].size
        halves = _scratch(4 * n, "merge_scratch").view(np.uint16).reshape((2,) + planes[0].shape)
        _join_u16(planes[0], planes[1], halves[0])
        _join_u16(planes[2], planes[3], halves[1])
        np.multiply(halves[0], 1 << 16, out=words, dtype=np.uint32)
        np.add(words, halves[1], out=words, dtype=np.uint32)
        return
    view = dst.reshape(-1, itemsize)
    for j, plane in enumerate(planes):
        view[:, itemsize - 1 - j] = plane


PROBE_BYTES = 16384  # a plane whose first 16 KiB do not compress is stored raw without trying the rest


def _hopeless(cctx: zstandard.ZstdCompressor, plane: np.ndarray) -> bool:
    """True when a sample says the plane will not compress (mantissa bytes): saves ~15% of encode time."""
    if plane.nbytes <= 4 * PROBE_BYTES:
        return False
    return len(cctx.compress(plane[:PROBE_BYTES])) >= KEEP_RATIO * PROBE_BYTES


def encode(page: np.ndarray, itemsize: int, compress: bool,
           alloc: Callable[[int], np.ndarray] | None = None) -> tuple[int, list[object]]:
    """Encode a flat uint8 page -> (codec, payload parts). RAW returns the page itself (no copy).

    The parts stay valid after the call (none of them is a per-thread buffer). With `alloc` (the io
    task's arena) the parts that are new bytes are taken from it, so they live as long as that buffer
    does; without it they are fresh buffers. Raises ValueError when page is not a flat C-contiguous
    uint8 array; a zstd failure (out of memory) propagates as zstandard.ZstdError.
    """
    n = page.nbytes
    if not compress or n == 0:
        return RAW, [page]
    new = alloc or _fresh
    if itemsize in (2, 4, 8) and n % itemsize == 0:
        m = n // itemsize
        # The high planes (sign/exponent bytes) go to a per-thread buffer: they are compressed and
        # dropped, so reusing it saves a fresh allocation's page faults on every page (~10% of encode).
        # The low plane (mantissa bytes) is usually stored as it is, so it gets its own buffer.
        high = _scratch(m * (itemsize - 1), "enc_scratch")
        planes = [high[j * m: (j + 1) * m] for j in range(itemsize - 1)] + [new(m)]
        _split_into(page, itemsize, planes)
        cctx = compressor()
        parts: list[object] = []
        sizes = []
        for j, plane in enumerate(planes):
            z = None if _hopeless(cctx, plane) else _frame(cctx, plane, alloc)
            if z is not None:
                parts.append(z)
                sizes.append(len(z))
            else:
                parts.append(plane if j == itemsize - 1 else _copy(plane, new))  # never hand out the buffer
                sizes.append(plane.nbytes)
        if sum(sizes) + 4 * itemsize < KEEP_RATIO * n:
            return PLANES, [struct.pack(f"<{itemsize}I", *sizes), *parts]
        return RAW, [page]
    z = _frame(compressor(), page, alloc)
    return (ZSTD, [z]) if z is not None else (RAW, [page])


def _fresh(n: int) -> np.ndarray:
    return np.empty(n, dtype=np.uint8)


def _copy(src: np.ndarray, new: Callable[[int], np.ndarray]) -> np.ndarray:
    out = new(src.nbytes)
    out[:] = src
    return out


def _frame(cctx: zstandard.ZstdCompressor, data: np.ndarray,
           alloc: Callable[[int], np.ndarray] | None) -> bytes | np.ndarray | None:
    """data's zstd frame when it keeps KEEP_RATIO or better, else None.

    With `alloc` the frame is compressed into a per-thread buffer and copied into `alloc(len)`:
    zstd's own result would be a fresh allocation per page, and on a VM that hands freed memory
    back to its host every fresh page of it is a fault (issue 29: 25-40k minor faults and up to
    2 kernel CPU-s per GB written on an nfs tier). The copy is of the compressed bytes only.
    """
    limit = int(KEEP_RATIO * data.nbytes)  # a frame this long or longer is not kept
    if alloc is None:
        z = cctx.compress(data)
        return z if len(z) < limit else None
    room = _scratch(limit, "frame_scratch")
    view, n = memoryview(room), 0
    reader = cctx.stream_reader(data, size=data.nbytes)
    while n < limit:
        got = reader.readinto(view[n:])
        if not got:
            break
        n += got
    if n >= limit:
        return None
    return _copy(room[:n], alloc)


def _check_frame(frame: memoryview | bytes, n: int) -> None:
    """The frame's declared content size must be exactly n, checked before anything is decoded:
    zstd would otherwise allocate (and fill) whatever a crafted frame declares."""
    try:
        declared = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as e:
        raise RecordError("payload", f"zstd frame header: {e}") from None
    if declared != n:  # our encoder always writes the content size
        raise RecordError("payload", f"zstd frame declares {declared} bytes, the page needs {n}")


def _decompress_into(frame: memoryview | bytes, out: np.ndarray) -> None:
    """Decompress one zstd frame straight into out (a flat writable uint8 buffer of exactly the
    frame's content size): no result bytes object, so no fresh pages to fault in and no copy.

    The reader gets the whole frame at once, so zstd decodes it in one pass into out (its
    single-pass shortcut for a frame whose content size fits the output). Measured per CPU-second:
    ~10% faster page decode for 8 MiB bf16 pages, the same for 1 MiB ones (where malloc reuses the
    freed result and the copy stays in cache); whole-page zstd (1-byte dtypes) skips a page copy.
    """
    n = out.nbytes
    _check_frame(frame, n)
    reader = _dctx().stream_reader(frame, read_size=max(1, memoryview(frame).nbytes))
    view = memoryview(out).cast("B")
    got = 0
    while got < n:
        k = reader.readinto(view[got:])
        if k <= 0:
            raise RecordError("payload", f"decoded length mismatch: {got} of {n} bytes")
        got += k
    if reader.read(1):  # a frame longer than it declares (zstd checks this too)
        raise RecordError("payload", "decoded length mismatch: frame longer than declared")


def _scratch(n: int, name: str = "scratch") -> np.ndarray:
    """A per-thread uint8 buffer of n bytes, reused across calls: decode's plane buffer (consumed by
    the merge before decode_into returns), the 4-byte merge's u16 halves (`merge_scratch`) or
    encode's high planes (`enc_scratch`, compressed before encode returns). One name per use, so no
    caller overwrites a buffer another is still reading."""
    buf = getattr(_local, name, None)
    if buf is None or buf.nbytes < n:
        buf = np.empty(max(n, 1 << 16), dtype=np.uint8)
        setattr(_local, name, buf)
    return buf[:n]


def _pieces_at(dst: Sequence[np.ndarray]) -> list[tuple[int, np.ndarray]]:
    out, off = [], 0
    for piece in dst:
        out.append((off, piece))
        off += piece.nbytes
    return out


def _rows(pieces: list[tuple[int, np.ndarray]]) -> list[tuple[int, np.ndarray]]:
    """Runs of flat, equal-sized pieces that lie one address stride apart, each as one 2-D view whose
    rows are exactly those pieces' bytes (a layer_first page: one run per K and V, a row per layer).

    Why: a merge or copy per piece is a few numpy calls per 16 KiB row, each releasing and retaking
    the GIL, and eight io threads decoding layer_first pages spent more time queueing for it than
    decoding (a read of real KV pages ran at 0.3 GB/s with 4.8 CPU-s/GB). Every row's address is checked,
    so the view writes only where the pieces are."""
    def flat(a: np.ndarray, n: int) -> bool:
        return a.nbytes == n and a.ndim == 1 and a.strides == (1,)

    out: list[tuple[int, np.ndarray]] = []
    i = 0
    while i < len(pieces):
        off, first = pieces[i]
        n, j, step = first.nbytes, i + 1, 0
        prev = first.__array_interface__["data"][0]
        while n and flat(first, n) and j < len(pieces) and flat(pieces[j][1], n):
            addr = pieces[j][1].__array_interface__["data"][0]
            if j == i + 1 and abs(addr - prev) >= n:  # the stride of the run: rows never overlap
                step = addr - prev
            if step == 0 or addr - prev != step:
                break
            prev, j = addr, j + 1
        out.append((off, first if j == i + 1 else np.lib.stride_tricks.as_strided(
            first, shape=(j - i, n), strides=(step, 1), writeable=True)))
        i = j
    return out


def decode_into(codec: int, payload: memoryview, dst: np.ndarray | Sequence[np.ndarray], itemsize: int) -> None:
    """Decode a verified payload into dst: one flat uint8 buffer, or the pieces that make the page
    in order (written piece by piece, no gather buffer).

    Raises RecordError (reason 'payload', or 'header' for an unknown codec) when the payload does
    not decode to exactly the destination's bytes: a plane table that does not cover the payload,
    a frame that declares another size (checked before it is decompressed), a truncated or corrupt
    frame. Planes are decoded into a per-thread buffer before dst is touched; a whole-page zstd frame
    decodes straight into dst, so after a RecordError dst holds unspecified bytes and must not be
    used (the store counts a miss and drops the record).
    """
    pieces = _pieces_at([dst] if isinstance(dst, np.ndarray) else dst)
    n = sum(p.nbytes for _, p in pieces)
    try:
        if codec == ZSTD and len(pieces) == 1:
            _decompress_into(payload, pieces[0][1])
        elif codec in (RAW, ZSTD):
            if codec == RAW:
                if len(payload) != n:
                    raise RecordError("payload", "decoded length mismatch")
                src = np.frombuffer(payload, dtype=np.uint8)
            else:
                src = _scratch(n)
                _decompress_into(payload, src)
            for off, piece in _rows(pieces):
                piece[...] = src[off: off + piece.nbytes].reshape(piece.shape)
        elif codec == PLANES:
            if itemsize not in (2, 4, 8) or n % itemsize:
                raise RecordError("payload", f"planes codec with itemsize {itemsize}")
            sizes = struct.unpack_from(f"<{itemsize}I", payload, 0)
            pos = 4 * itemsize
            plane_len = n // itemsize
            if pos + sum(sizes) != len(payload) or max(sizes) > plane_len:
                raise RecordError("payload", "plane table does not cover the payload")
            n_packed = sum(1 for size in sizes if size != plane_len)
            scratch = _scratch(n_packed * plane_len) if n_packed else None
            planes, k = [], 0
            for size in sizes:
                chunk = payload[pos: pos + size]
                pos += size
                if size == plane_len:
                    planes.append(np.frombuffer(chunk, dtype=np.uint8))
                else:  # decoded into this thread's scratch, consumed by the merge below
                    plane = scratch[k * plane_len: (k + 1) * plane_len]  # type: ignore[index]
                    k += 1
                    _decompress_into(chunk, plane)
                    planes.append(plane)
            if all(off % itemsize == 0 and p.nbytes % itemsize == 0 for off, p in pieces):
                # 8-byte merges reshape dst, which a strided view cannot: those go piece by piece
                for off, piece in (_rows(pieces) if itemsize in (2, 4) else pieces):
                    e0, e1 = off // itemsize, (off + piece.nbytes) // itemsize
                    merge_planes_into([pl[e0:e1].reshape(piece.shape[:-1] + (-1,)) for pl in planes], piece,
                                      itemsize)
            else:  # pieces cut through elements: merge once, then copy out
                whole = np.empty(n, dtype=np.uint8)
                merge_planes_into(planes, whole, itemsize)
                for off, piece in _rows(pieces):
                    piece[...] = whole[off: off + piece.nbytes].reshape(piece.shape)
        else:
            raise RecordError("header", f"unknown codec {codec}")
    except zstandard.ZstdError as e:
        raise RecordError("payload", f"zstd: {e}") from None
    except struct.error as e:
        raise RecordError("payload", str(e)) from None

