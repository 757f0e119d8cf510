"""Segment files: their names, their age, and their trailer read and written through an fd.

A segment is a run of self-describing records (records/codec.py), then, once sealed, the unit
trailer of records/trailer.py (shared with S3 objects). Its name, `<ms>-<host>-<pid>-<token><n>.seg`,
says when and by whom it was created: one writer per file, names sort by age.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from ...fsio import pwritev_all
from ...records import FOOTER_SIZE, Entry, build_trailer, parse_footer, parse_trailer

SEGMENT_SUFFIX = ".seg"


def read_table(fd: int, size: int) -> np.ndarray | None:
    """The trailer table of a sealed segment open as fd, or None when there is no valid trailer."""
    if size < FOOTER_SIZE:
        return None
    parsed = parse_footer(os.pread(fd, FOOTER_SIZE, size - FOOTER_SIZE), size)
    if parsed is None:
        return None
    return parse_trailer(os.pread(fd, size - parsed[1], parsed[1]), size)


def write_trailer(fd: int, at: int, entries: Sequence[Entry]) -> int:
    """Write the trailer at byte `at`; returns the sealed file's size."""
    blob = build_trailer(at, entries)
    pwritev_all(fd, [blob], at)
    return at + len(blob)


def parse_name(name: str) -> tuple[str, int] | None:
    """'<ms>-<host>-<pid>-<token><n>.seg' -> (host, pid); None for anything else."""
    if not name.endswith(SEGMENT_SUFFIX) or "/" in name or name.startswith("."):
        return None
    parts = name[: -len(SEGMENT_SUFFIX)].split("-")
    if len(parts) != 4 or not parts[0].isdigit() or not parts[2].isdigit():
        return None
    return parts[1], int(parts[2])


def process_alive(pid: int) -> bool:
    """Whether a process of this host with `pid` exists (one we may not signal counts: it exists)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def unit_ms(name: str) -> int:
    """Creation time (ms) of a segment from its name; every record in it is at least that old."""
    head = name.split("-", 1)[0]
    return int(head) if head.isdigit() else 0
