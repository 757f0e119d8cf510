"""The purge list (`purge.list`): what `lifeboat purge` removed, so every process stops serving it.

One JSON object per line, appended (one O_APPEND write, never through a symlink, owner-only) by
`lifeboat purge`; every process sharing the directory re-reads it when it changes:
  {"namespace": "<32 hex>", "before_ms": T}   records of that namespace in segments created before T
  {"age_before_ms": T}                        every record in segments created before T
The file is untrusted input like the quarantine list: a bad line is dropped and counted.
It names namespace fingerprints and times only, never a key or a byte of a page.
"""

from __future__ import annotations

import errno
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..fsio import DEFAULT_FILE_MODE, open_file, read_small_file

PURGE_NAME = "purge.list"
MAX_PURGE_BYTES = 16 << 20
MAX_MS = 1 << 53


@dataclass
class PurgeRules:
    namespaces: dict[bytes, int] = field(default_factory=dict)  # namespace -> purge segments created before (ms)
    age_before_ms: int = 0  # purge every segment created before this (ms)

    def add_line(self, rec: object) -> bool:
        if not isinstance(rec, dict):
            return False
        if "namespace" in rec:
            ns, t = rec.get("namespace"), rec.get("before_ms")
            if not isinstance(ns, str) or len(ns) != 32 or isinstance(t, bool) or not isinstance(t, int):
                return False
            try:
                raw = bytes.fromhex(ns)
            except ValueError:
                return False
            if not 0 < t < MAX_MS:
                return False
            self.namespaces[raw] = max(t, self.namespaces.get(raw, 0))
            return True
        t = rec.get("age_before_ms")
        if isinstance(t, bool) or not isinstance(t, int) or not 0 < t < MAX_MS:
            return False
        self.age_before_ms = max(self.age_before_ms, t)
        return True


def parse(data: bytes) -> tuple[PurgeRules, int]:
    """(rules, number of bad lines); never raises."""
    rules, bad = PurgeRules(), 0
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            ok = rules.add_line(json.loads(line.decode("utf-8")))
        except (ValueError, RecursionError):
            ok = False
        bad += not ok
    return rules, bad


def load_rules(directory: Path | str) -> tuple[PurgeRules, int]:
    """Rules and bad-line count of the directory's purge list (none when absent); OSError raises."""
    data = read_small_file(Path(directory) / PURGE_NAME, MAX_PURGE_BYTES)
    return parse(data) if data is not None else (PurgeRules(), 0)


def append_rules(directory: Path, lines: list[dict[str, object]], mode: int = DEFAULT_FILE_MODE) -> None:
    """Append rules (one write); raises OSError (EROFS / EACCES on a read-only store)."""
    blob = b"".join((json.dumps({**ln, "time": time.time()}) + "\n").encode() for ln in lines)
    path = Path(directory) / PURGE_NAME
    try:
        fd = open_file(path, os.O_WRONLY | os.O_APPEND)
    except FileNotFoundError:
        try:
            fd = open_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode)
        except FileExistsError:
            fd = open_file(path, os.O_WRONLY | os.O_APPEND)
    try:
        n = os.write(fd, blob)
        if n != len(blob):
            raise OSError(errno.EIO, "short write to the purge list")
        os.fsync(fd)
    finally:
        os.close(fd)
