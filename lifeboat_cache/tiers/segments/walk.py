"""The walk of an unsealed segment, record by record, that resynchronises past damage.

Several writer threads share a segment (each reserves its offset, then writes), so a crash can leave
a hole (zeros) where a reserved record was never written, followed by intact records that were
written and acknowledged; bits can also flip. Records are self-describing (magic, header checksum,
lengths, payload checksum), so a walk that meets a bad or missing record searches the following
bytes for the next valid header and carries on: one bad record costs one record, never everything
after it. Only `verify_record` decides whether a record is intact.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ...records import HEADER_SIZE, MAGIC, TABLE_MAGIC, Entry, RecordError, unpack_header, verify_record

SEARCH_CHUNK_BYTES = 1 << 20


@dataclass
class Walk:
    """What a walk found between `start` and the end of the file."""

    entries: list[Entry] = field(default_factory=list)  # intact records, in file order
    resume_at: int = 0  # end of the leading run of intact records: the next walk starts here
    end: int = 0  # end of the last intact record: nothing intact lies beyond it
    damaged: list[tuple[int, int]] = field(default_factory=list)  # (offset, bytes) skipped
    tail_bytes: int = 0  # bytes after `end` (torn tail, a record being written, a trailer being written)


def next_header(fd: int, pos: int, size: int) -> int | None:
    """Offset of the first valid record header at or after pos, or None."""
    while pos + HEADER_SIZE <= size:
        buf = os.pread(fd, min(SEARCH_CHUNK_BYTES, size - pos), pos)
        if not buf:
            return None
        i = buf.find(MAGIC)
        while i != -1:
            q = pos + i
            if q + HEADER_SIZE > size:
                return None
            hdr = buf[i:i + HEADER_SIZE] if i + HEADER_SIZE <= len(buf) else os.pread(fd, HEADER_SIZE, q)
            try:
                unpack_header(hdr)
                return q
            except RecordError:
                i = buf.find(MAGIC, i + 1)
        if len(buf) <= len(MAGIC):
            return None
        pos += len(buf) - (len(MAGIC) - 1)  # a magic may straddle two chunks
    return None


def walk(fd: int, start: int, size: int, *, check_payload: bool = True) -> Walk:
    """Index the intact records of bytes [start, size) of a segment open as fd.

    A bad header, a payload that fails its checksum or a hole is skipped (recorded in `damaged`)
    and the walk resumes at the next valid header. A record that runs past the end of the file is
    the tail (still being written, or torn by a crash); nothing can be intact after it.
    """
    out = Walk(resume_at=start, end=start)
    pos, leading = start, True
    while pos + HEADER_SIZE <= size:
        hdr = os.pread(fd, HEADER_SIZE, pos)
        if hdr[:4] == TABLE_MAGIC and len(hdr) == HEADER_SIZE:
            break  # a trailer is being written; the next refresh reads it whole
        bad = False
        try:
            h = unpack_header(hdr)
            if pos + h.record_len > size:
                break
            if check_payload:
                payload = os.pread(fd, h.stored_len, pos + HEADER_SIZE)
                verify_record(hdr, memoryview(payload))
        except RecordError:
            bad = True
        if not bad:
            out.entries.append((h.digest, pos, h.record_len, h.raw_len))
            pos += h.record_len
            out.end = pos
            if leading:
                out.resume_at = pos
            continue
        leading = False
        nxt = next_header(fd, pos + 1, size)
        if nxt is None:
            out.damaged.append((pos, size - pos))
            pos = size
            break
        out.damaged.append((pos, nxt - pos))
        pos = nxt
    out.tail_bytes = size - out.end
    return out
