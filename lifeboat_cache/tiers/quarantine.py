"""The quarantine list: records that failed verification, so no later scan brings them back.

One JSON object per line (`{"segment": name, "offset": n, ...}`), appended by any process sharing
the directory. The file is untrusted input: a line that is not valid UTF-8 JSON naming a segment
and an integer offset is dropped and counted, never an error that stops the store from opening.
"""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

from .segfile import DEFAULT_FILE_MODE, open_file, parse_name, read_small_file

QUARANTINE_NAME = "quarantine.jsonl"
MAX_QUARANTINE_BYTES = 64 << 20
MAX_OFFSET = (1 << 63) - 1


def parse_line(line: bytes) -> tuple[str, int] | None:
    """(segment, offset) of one line, or None when the line is not a valid entry."""
    try:
        rec = json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError):  # bad UTF-8, bad JSON, an int too long to convert
        return None
    if not isinstance(rec, dict):
        return None
    seg, off = rec.get("segment"), rec.get("offset")
    if not isinstance(seg, str) or parse_name(seg) is None:
        return None
    if isinstance(off, bool) or not isinstance(off, int) or not 0 <= off <= MAX_OFFSET:
        return None
    return seg, off


def parse(data: bytes) -> tuple[set[tuple[str, int]], int]:
    """(entries, number of bad lines) of a whole quarantine file; never raises."""
    entries: set[tuple[str, int]] = set()
    bad = 0
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for line in lines:  # a truncated last line fails to parse as JSON and is counted bad
        if not line.strip():
            continue
        got = parse_line(line)
        if got is None:
            bad += 1
        else:
            entries.add(got)
    return entries, bad


def load(directory: Path) -> tuple[set[tuple[str, int]], int]:
    """Entries and bad-line count of the directory's quarantine list; OSError/ForeignFile raise."""
    data = read_small_file(directory / QUARANTINE_NAME, MAX_QUARANTINE_BYTES)
    return parse(data) if data is not None else (set(), 0)


def append(directory: Path, segment: str, offset: int, length: int, reason: str,
           mode: int = DEFAULT_FILE_MODE) -> None:
    """Append one entry (one O_APPEND write, never through a symlink); raises OSError."""
    line = (json.dumps({"segment": segment, "offset": offset, "length": length, "reason": reason,
                        "time": time.time()}) + "\n").encode()
    path = directory / QUARANTINE_NAME
    try:
        fd = open_file(path, os.O_WRONLY | os.O_APPEND)
    except FileNotFoundError:
        try:
            fd = open_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode)
        except FileExistsError:  # another process created it first
            fd = open_file(path, os.O_WRONLY | os.O_APPEND)
    try:
        n = os.write(fd, line)
        if n != len(line):
            raise OSError(errno.EIO, "short write to the quarantine list")
    finally:
        os.close(fd)
