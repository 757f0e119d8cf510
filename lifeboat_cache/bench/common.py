"""What every benchmark section shares: timing, medians with spread, the machine label, and a page
cache that is really dropped and checked (mincore) before a cold read."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
import platform
import resource
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from ..index import trim_heap

log = logging.getLogger("lifeboat.bench")

_PAGE = os.sysconf("SC_PAGE_SIZE")
_libc: Any = None


def machine() -> dict[str, Any]:
    """The label every absolute number carries: CPU model, cores, memory, kernel, load at start."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem / 2**30, 1),
            "kernel": platform.release(), "python": platform.python_version(),
            "load_avg": [round(x, 2) for x in os.getloadavg()]}


def machine_label(m: dict[str, Any]) -> str:
    return f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB"


def cpu_seconds() -> float:
    """User + system CPU seconds of this process, all threads."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


@dataclass
class Phase:
    """Wall and process CPU seconds of one timed call."""
    wall_s: float
    cpu_s: float


def timed(fn: Callable[[], Any]) -> tuple[Phase, Any]:
    c, t = cpu_seconds(), time.perf_counter()
    out = fn()
    return Phase(time.perf_counter() - t, cpu_seconds() - c), out


@dataclass
class Series:
    """Per-rep values of one figure; medians with the spread (min, max) across reps."""
    values: list[float] = field(default_factory=list)

    def add(self, v: float) -> None:
        self.values.append(float(v))

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    def summary(self) -> dict[str, Any]:
        v = self.values
        return {"median": self.median, "min": min(v) if v else None, "max": max(v) if v else None,
                "reps": list(v)}


def pct(xs: Iterable[float]) -> dict[str, float]:
    """p50 / p90 / p99 / max of durations in seconds, as milliseconds."""
    import numpy as np

    a = np.asarray(list(xs), dtype=float) * 1e3
    if a.size == 0:
        return {}
    return {f"p{q}_ms": float(np.percentile(a, q)) for q in (50, 90, 99)} | {"max_ms": float(a.max())}


def available_bytes() -> int:
    """MemAvailable of /proc/meminfo (what SGLang's host-pool check reads), 0 when unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def rss_bytes() -> int:
    """This process's resident bytes now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def release_memory() -> int:
    """Hand what this process freed back to the system (a collection, then the index's trim_heap), and
    return its resident bytes after. Why: the server sections start SGLang processes whose host-pool check
    wants free memory, and heap the earlier sections freed stays with this process until trimmed."""
    gc.collect()
    trim_heap()
    return rss_bytes()


# ------------------------------------------------------------------------------ the page cache


def _c() -> Any:
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                             ctypes.c_long]
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
        _libc = lib
    return _libc


def resident_pages(path: Path) -> int:
    """Pages of the file now in the page cache (mincore on a shared read-only mapping)."""
    size = path.stat().st_size
    if size == 0:
        return 0
    libc = _c()
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap {path}")
        try:
            n = (size + _PAGE - 1) // _PAGE
            vec = (ctypes.c_ubyte * n)()
            if libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore {path}")
            return sum(b & 1 for b in vec)
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def _files(root: Path) -> list[Path]:
    return [p for p in Path(root).rglob("*") if p.is_file()]


def resident_under(root: Path) -> int:
    return sum(resident_pages(p) for p in _files(root))


def drop_page_cache(root: Path) -> int:
    """Write back and evict every file under root; returns the pages still resident (checked with
    mincore), which must be 0 for a cold read. Falls back to /proc/sys/vm/drop_caches as root."""
    os.sync()
    for path in _files(root):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    left = resident_under(root)
    if left and os.geteuid() == 0:
        try:
            Path("/proc/sys/vm/drop_caches").write_text("1\n")
        except OSError as e:
            log.warning("drop_caches: %s", e)
        left = resident_under(root)
    return left


def dir_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in _files(root))


def pin_torch_threads(n: int) -> int:
    """Same torch intra-op thread count for both contenders (SGLang's page copies use it)."""
    import torch

    torch.set_num_threads(n)
    return torch.get_num_threads()
