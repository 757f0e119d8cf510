"""`type: local`: segment directories on local NVMe, one per drive.

All pages of one dialog go to one drive, chosen from the dialog's affinity value (the store derives
it from the first `affinity_chunks` pages), so a returning prompt is read from one place.
"""

from __future__ import annotations

import os
from typing import Any, Iterator, Sequence

import numpy as np

from ..config import TierSettings
from ..fsio import open_file, replacing_file
from ..records import Record
from .base import Auditing, Describing, Marking, Rank, RecordRuns, Ref, SegmentDirs, Tier
from .segments import DirSettings, SegmentDir


class LocalTier(Tier, Auditing, Describing, SegmentDirs, RecordRuns, Marking):
    kind = "local"
    fsync = False  # a killed process loses nothing the kernel already has; seal-time fsync is for NFS
    segment_dir_cls: type[SegmentDir] = SegmentDir  # nfs swaps in its NFS-aware subclass

    def __init__(self, settings: TierSettings, name: str | None = None, stripes: int = 4, *,
                 read_only: bool = False, evict: bool = True, rank: Rank | None = None) -> None:
        self.settings = settings
        self.name = name or f"{self.kind}:{','.join(str(p) for p in settings.paths)}"
        per_dir = None if settings.capacity_bytes is None else settings.capacity_bytes // len(settings.paths)
        dir_settings = DirSettings(
            capacity_bytes=per_dir, segment_bytes=settings.segment_bytes,
            refresh_interval_s=settings.refresh_interval_s, seal_after_s=settings.seal_after_s, fsync=self.fsync,
            stripes=stripes, file_mode=settings.file_mode, dir_mode=settings.dir_mode, max_age_s=settings.max_age_s,
            write_call_bytes=settings.write_call_bytes)
        self.dirs = [
            self.segment_dir_cls(p, dir_settings, name=f"{self.kind}{i}", read_only=read_only, evict=evict,
                                 rank=rank)
            for i, p in enumerate(settings.paths)
        ]

    def open(self, background: bool = True) -> "LocalTier":
        for d in self.dirs:
            d.open(background=background)
        return self

    def contains(self, ikeys: np.ndarray) -> np.ndarray:
        hit = self.dirs[0].index.contains(ikeys)
        for d in self.dirs[1:]:
            miss = ~hit
            if miss.any():
                hit[miss] = d.index.contains(ikeys[miss])
        return hit

    def touch(self, ikeys: np.ndarray) -> None:
        for d in self.dirs:
            d.touch(ikeys)

    def locate(self, ikey: int) -> Ref | None:
        for i, d in enumerate(self.dirs):
            loc = d.index.get(ikey)
            if loc is not None:
                return Ref(i, loc)
        return None

    def write(self, ikey: int, digest: bytes, bufs: Sequence[object], length: int, affinity: int = 0) -> Ref:
        part = affinity % len(self.dirs)
        return Ref(part, self.dirs[part].append(ikey, digest, bufs, length))

    def write_some(self, records: Sequence[Record], affinity: int = 0) -> tuple[list[Ref], OSError | None]:
        """The run goes to the drive `affinity` picks, as one append (see SegmentDir.append_many)."""
        part = affinity % len(self.dirs)
        locs, err = self.dirs[part].append_many(records)
        return [Ref(part, loc) for loc in locs], err

    def write_many(self, records: Sequence[Record], affinity: int = 0) -> list[Ref]:
        refs, err = self.write_some(records, affinity)
        if err is not None:
            raise err
        return refs

    def locate_many(self, ikeys: np.ndarray) -> list[Ref | None]:
        out: list[Ref | None] = [None] * len(ikeys)
        todo = np.arange(len(ikeys))
        for i, d in enumerate(self.dirs):
            if not len(todo):
                break
            locs = d.index.get_many(np.asarray(ikeys, np.int64)[todo])
            for k, loc in zip(todo.tolist(), locs):
                if loc is not None:
                    out[k] = Ref(i, loc)
            todo = np.array([k for k in todo.tolist() if out[k] is None], np.int64)
        return out

    def read_into(self, ref: Ref, bufs: Sequence[memoryview]) -> bool:
        return self.dirs[ref.part].read_into(ref.loc, bufs)

    def read_run(self, refs: Sequence[Ref], bufs: Sequence[Sequence[memoryview]]) -> list[bool]:
        """Adjacent records of one segment in one preadv; each drive's records in the order given."""
        if all(r.part == refs[0].part for r in refs):
            return self.dirs[refs[0].part].read_run([r.loc for r in refs], bufs) if refs else []
        out = [False] * len(refs)
        for part in sorted({r.part for r in refs}):
            idx = [k for k, r in enumerate(refs) if r.part == part]
            for k, ok in zip(idx, self.dirs[part].read_run([refs[k].loc for k in idx], [bufs[k] for k in idx])):
                out[k] = ok
        return out

    def forget(self, ikey: int, ref: Ref, reason: str) -> None:
        self.dirs[ref.part].quarantine(ikey, ref.loc, reason)

    def records(self) -> Iterator[tuple[int, Ref]]:
        for i, d in enumerate(self.dirs):
            for k, loc in d.records():
                yield k, Ref(i, loc)

    def audit(self, fix: bool = False) -> list[str]:
        """File -> index check of every drive (the other half of `ChunkStore.verify`)."""
        return [f"{self.name}: {p}" for d in self.dirs for p in d.audit(fix)]

    def wait_rebuilt(self, timeout: float | None = None) -> bool:
        return all(d.wait_rebuilt(timeout) for d in self.dirs)

    def flush(self) -> None:
        for d in self.dirs:
            d.flush()

    def gc(self) -> int:
        return sum(d.gc() for d in self.dirs)

    def usage_bytes(self) -> int:
        return sum(d.usage_bytes() for d in self.dirs)

    def capacity_bytes(self) -> int | None:
        return sum(d.capacity_bytes for d in self.dirs)

    def close(self) -> None:
        for d in self.dirs:
            d.close()

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out["pages"] = sum(len(d.index) for d in self.dirs)
        out["segments"] = sum(len(d.units()) for d in self.dirs)
        out["rebuilt"] = all(d.rebuilt for d in self.dirs)
        counters: dict[str, int] = {}
        for d in self.dirs:
            for k, v in d.counters.snapshot().items():
                counters[k] = counters.get(k, 0) + v
        out.update(counters)
        out["retention_read_records"] = sum(d.access.read_records() for d in self.dirs)
        return out

    def describe(self) -> list[dict[str, int | str | bool]]:
        """Per segment of every drive: records, stored and raw bytes (for `lifeboat stats`)."""
        return [dict(seg, path=str(d.path)) for d in self.dirs for seg in d.describe()]

    def read_marks(self, prefix: str, limit_bytes: int) -> dict[str, bytes]:
        """Marks (files `prefix*` in a drive's directory; temp files start with a dot) of every drive."""
        out: dict[str, bytes] = {}
        for d in self.dirs:
            try:
                names = [n for n in os.listdir(d.path) if n.startswith(prefix)]
            except FileNotFoundError:
                continue
            for n in names:
                try:  # never through a link, never more than limit_bytes
                    fd = open_file(d.path / n, os.O_RDONLY)
                    try:
                        out.setdefault(n, os.pread(fd, limit_bytes, 0))
                    finally:
                        os.close(fd)
                except OSError:
                    out.setdefault(n, b"")  # there, unreadable: still a mark
        return out

    def write_mark(self, name: str, data: bytes) -> None:
        """Write (temp file, rename; fsync'd where the tier fsyncs) into every drive's directory."""
        for d in self.dirs:
            with replacing_file(d.path / name, self.settings.file_mode, fsync=self.fsync) as fd:
                os.write(fd, data)

    def loc_name(self, ref: Ref) -> str:
        return f"{self.dirs[ref.part].unit_name(ref.loc.unit)}@{ref.loc.offset}"


