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
from typing import Callable

from ...fsio import DEFAULT_FILE_MODE, ForeignFile, open_file, read_small_file
from ...metrics import Counters
from .format import parse_name

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


class Quarantine:
    """One directory's quarantined (segment, offset) pairs in memory, loaded from and appended to its list.

    `foreign(name, why)` reports a symlink or non-regular file in place of the list; `log_once(key,
    msg, *args)` logs a failure once per key; `counters` counts the list's bad lines.
    """

    def __init__(self, directory: Path, *, file_mode: int, read_only: bool, counters: Counters,
                 log_once: Callable[..., bool], foreign: Callable[[str, str], None]) -> None:
        self.path = directory
        self.file_mode, self.read_only = file_mode, read_only
        self.counters, self._log_once, self._foreign = counters, log_once, foreign
        self.entries: set[tuple[str, int]] = set()

    def __bool__(self) -> bool:
        return bool(self.entries)

    def __contains__(self, item: tuple[str, int]) -> bool:
        return item in self.entries

    def offsets_in(self, names: set[str] | frozenset[str]) -> set[int]:
        """The quarantined offsets of the segments named (any of them)."""
        return {o for n, o in self.entries if n in names}

    def load(self) -> None:
        try:
            entries, bad = load(self.path)
        except ForeignFile as e:
            self._foreign(QUARANTINE_NAME, str(e))
            return
        except OSError as e:
            if not (self.read_only and e.errno == errno.ENOENT):
                self._log_once("quarantine-read", "lifeboat: cannot read the quarantine list of %s: %s", self.path, e)
            return
        self.entries |= entries
        if bad:
            self.counters.add("quarantine_bad_lines", bad)
            self._log_once("quarantine-bad", "lifeboat: %s: ignored %d bad line(s) of %s", self.path, bad,
                           QUARANTINE_NAME)

    def record(self, name: str, offset: int, length: int, reason: str) -> None:
        """Remember a bad region in memory and (unless read-only) in the list."""
        self.entries.add((name, offset))
        if self.read_only:
            return
        try:
            append(self.path, name, offset, length, reason, self.file_mode)
        except ForeignFile as e:
            self._foreign(QUARANTINE_NAME, str(e))
        except OSError as e:
            self._log_once("quarantine-write", "lifeboat: cannot record quarantine in %s: %s", self.path, e)
