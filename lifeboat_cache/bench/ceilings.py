"""Ceilings: what this machine can do at all, measured in the same run as the contenders.

* memory copy (numpy copyto, one core);
* plain files: write into the page cache only (two threads: what a write costs when nothing waits
  for the disk, as in sglang_vs_file), write + fsync, then a cold read of the same bytes (page cache
  dropped and checked), in the same directory the contenders write to;
* write calls: the same bytes written into one file in single calls of 256 KiB to 8 MiB, each run
  after a pause (`write_pause_ms`): GB/s and the kernel's CPU seconds per GB, by call size. The store
  bounds its write calls by what this shows (fsio.WRITE_CALL_BYTES, WriteCallBound; a tier's `write_call_size`);
* write runway: several GiB of new bytes written back to back in calls of 256 KiB and of 1 MiB, GB/s
  per file: on a VM that reports free memory to its host, how far each call size gets before its
  folios come from reported blocks (fsio.WriteCallBound), with the free memory by order before each;
* the record codec, one core: encode (build_record: planes + zstd or raw, plus the checksum) and decode
  (check + decode_into), raw and compressed, on random bf16 pages and real KV. Besides wall-clock GB/s it reports
  GB per CPU-second of the timing thread (`*_cpu_gb_s`): on a shared, loaded machine the wall clock
  counts time the thread spent waiting for a core, the thread's CPU time is the per-core cost.
  Compressed runs also time zstd alone on the same frames (`zstd_only_cpu_gb_s`): the floor under
  decode, so a decode target can be judged against what the entropy decoder allows on this CPU.
"""

from __future__ import annotations

import os
import resource
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..fsio import CALL_SIZES, WriteCallBound, free_bytes_by_order, reporting_order
from .common import Series, drop_page_cache, log
from .sizes import Sizes

PAGE_BYTES = 768 << 10  # one 64-token page of the small shape (24 layers x 2 heads x 64 dims, K and V, bf16)


def random_bf16(nbytes: int, seed: int = 0) -> np.ndarray:
    """N(0, 1) values as bf16 bytes: sign/exponent bytes compress like KV, mantissas do not."""
    f = np.random.default_rng(seed).standard_normal(nbytes // 2, dtype=np.float32)
    return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)


def memcpy(buf: np.ndarray, reps: int) -> dict[str, Any]:
    dst = np.empty_like(buf)
    s, cpu = Series(), Series()
    for _ in range(reps + 1):
        t, c = time.perf_counter(), time.thread_time()
        np.copyto(dst, buf)
        s.add(buf.nbytes / (time.perf_counter() - t) / 1e9)
        cpu.add(buf.nbytes / max(time.thread_time() - c, 1e-9) / 1e9)
    s.values, cpu.values = s.values[1:], cpu.values[1:]  # first touch of dst excluded
    return {"gb_s": s.summary(), "cpu_gb_s": cpu.summary()}


def _write_files(buf: np.ndarray, d: Path, file_bytes: int, threads: int) -> float:
    """Seconds to write buf as file_bytes files into the page cache (no fsync), `threads` threads
    taking alternate files."""
    def part(k: int) -> None:
        for i, off in enumerate(range(0, buf.nbytes, file_bytes)):
            if i % threads == k:
                with open(d / f"b{i}.bin", "wb") as f:
                    f.write(buf[off: off + file_bytes])

    workers = [threading.Thread(target=part, args=(k,)) for k in range(threads)]
    t = time.perf_counter()
    for th in workers:
        th.start()
    for th in workers:
        th.join()
    return time.perf_counter() - t


def plain_file(buf: np.ndarray, work: Path, reps: int, file_bytes: int = 8 << 20,
               write_threads: int = 2) -> dict[str, Any]:
    """Write the bytes as 8 MiB files into the page cache only (no fsync: what a write costs when
    nothing waits for the disk, as neither contender's does; `write_threads` threads, as many as
    LifeboatCache's default io workers), then again + fsync each, then read them back cold (checked),
    one thread."""
    d = work / "plain-ceiling"
    w, wb, r = Series(), Series(), Series()
    resident = []
    for rep in range(reps):
        d.mkdir(parents=True, exist_ok=True)
        os.sync()
        wb.add(buf.nbytes / _write_files(buf, d, file_bytes, write_threads) / 1e9)
        for p in d.iterdir():
            p.unlink()
        os.sync()
        t = time.perf_counter()
        for i, off in enumerate(range(0, buf.nbytes, file_bytes)):
            with open(d / f"{i}.bin", "wb") as f:
                f.write(buf[off: off + file_bytes])
                f.flush()
                os.fsync(f.fileno())
        w.add(buf.nbytes / (time.perf_counter() - t) / 1e9)
        resident.append(drop_page_cache(d))
        out = np.empty(file_bytes, np.uint8)
        t = time.perf_counter()
        for i, off in enumerate(range(0, buf.nbytes, file_bytes)):
            with open(d / f"{i}.bin", "rb", buffering=0) as f:
                f.readinto(memoryview(out)[: min(file_bytes, buf.nbytes - off)])
        r.add(buf.nbytes / (time.perf_counter() - t) / 1e9)
        for p in d.iterdir():
            p.unlink()
    return {"write_buffered_gb_s": wb.summary(), "write_buffered_threads": write_threads,
            "write_fsync_gb_s": w.summary(), "cold_read_gb_s": r.summary(), "resident_pages_before_read": resident}


CALL_SIZES_KIB = (256, 512, 1024, 1536, 2048, 4096, 8192)


def write_calls(buf: np.ndarray, work: Path, pause_s: float, reps: int) -> dict[str, Any]:
    """Write buf into one new file with `os.pwrite` calls of each size, each run after a pause; GB/s and
    kernel CPU seconds per GB (this thread's system time) by call size."""
    d = work / "write-calls"
    d.mkdir(parents=True, exist_ok=True)
    mv, gb = memoryview(buf), buf.nbytes / 1e9
    by_size: dict[str, Any] = {}
    for kib in CALL_SIZES_KIB:
        step, speed, kernel = kib << 10, Series(), Series()
        for _ in range(reps):
            path = d / "calls.bin"
            path.unlink(missing_ok=True)
            os.sync()
            time.sleep(pause_s)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                t, k = time.perf_counter(), resource.getrusage(resource.RUSAGE_THREAD).ru_stime
                for off in range(0, buf.nbytes, step):
                    os.pwrite(fd, mv[off: off + step], off)
                speed.add(gb / (time.perf_counter() - t))
                kernel.add((resource.getrusage(resource.RUSAGE_THREAD).ru_stime - k) / gb)
            finally:
                os.close(fd)
        by_size[str(kib)] = {"gb_s": speed.summary(), "kernel_cpu_s_per_gb": kernel.summary()}
    shutil.rmtree(d)
    return {"pause_s": pause_s, "store_bound_kib": WriteCallBound()() >> 10, "by_call_kib": by_size}


RUNWAY_CALL_KIB = tuple(sorted(size >> 10 for size in CALL_SIZES))  # the sizes the store chooses between


def write_runway(buf: np.ndarray, work: Path, total_mib: int, pause_s: float) -> dict[str, Any]:
    """Write `total_mib` of new bytes, files of buf's size back to back, with single calls of each
    RUNWAY_CALL_KIB size (after a pause, the files of the size before deleted): GB/s per file, and the GiB
    written before the first file under half the speed of the first (`fast_gib`; all of it when none).

    Why: a write call takes page-cache folios of about its size, and where free memory is reported to
    the host, blocks of the reporting order and above cost a host fault per page once taken. Calls whose
    folios are below that order first use up the free lists of their order and the orders above it that
    are still below the reporting order; then they split reported blocks too. Smaller calls have more
    of those lists to draw from. The free GiB by order before each size shows what was there."""
    d = work / "write-runway"
    d.mkdir(parents=True, exist_ok=True)
    mv, gb = memoryview(buf), buf.nbytes / 1e9
    files = max(1, (total_mib << 20) // buf.nbytes)
    by_size: dict[str, Any] = {}
    for kib in RUNWAY_CALL_KIB:
        os.sync()
        time.sleep(pause_s)
        before, speeds = [round(b / 2**30, 3) for b in free_bytes_by_order()], []
        step = kib << 10
        try:
            for i in range(files):
                fd = os.open(d / f"{i}.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                try:
                    t = time.perf_counter()
                    for off in range(0, buf.nbytes, step):
                        os.pwrite(fd, mv[off: off + step], off)
                    speeds.append(gb / (time.perf_counter() - t))
                finally:
                    os.close(fd)
        finally:
            for p in d.iterdir():
                p.unlink()
        slow = next((i for i, v in enumerate(speeds) if v < speeds[0] / 2), len(speeds))
        by_size[str(kib)] = {"gb_s_per_file": speeds, "fast_gib": slow * buf.nbytes / 2**30,
                             "free_gib_by_order_before": before}
    shutil.rmtree(d)
    return {"file_mib": buf.nbytes >> 20, "files": files, "pause_s": pause_s, "reporting_order": reporting_order(),
            "store_bound_kib": WriteCallBound()() >> 10, "by_call_kib": by_size}


def codec_speed(pages: list[np.ndarray], compress: bool, reps: int) -> dict[str, Any]:
    """One core through the record codec: encode GB/s, decode GB/s, raw/stored ratio."""
    from ..records import DTYPE_CODES, PLANES, build_record, decode_into, unpack_header, verify_record

    digest, ns = b"\1" * 16, b"\2" * 16
    dtype = DTYPE_CODES["bf16"]
    enc, dec, enc_cpu, dec_cpu = Series(), Series(), Series(), Series()
    total = sum(p.nbytes for p in pages)
    stored = 0
    for _ in range(reps):
        t, c = time.perf_counter(), time.thread_time()
        records = [build_record(p, itemsize=2, dtype=dtype, digest=digest, namespace=ns, compress=compress)
                   for p in pages]
        enc.add(total / (time.perf_counter() - t) / 1e9)
        enc_cpu.add(total / max(time.thread_time() - c, 1e-9) / 1e9)
        blobs = [(unpack_header(h), memoryview(b"".join(bytes(memoryview(x)) for x in parts)))
                 for h, parts, _ in records]
        stored = sum(len(b) for _, b in blobs)
        out = np.empty(pages[0].nbytes, np.uint8)
        t, c = time.perf_counter(), time.thread_time()
        for h, payload in blobs:
            verify_record(h, payload, digest=digest, namespace=ns)
            decode_into(h.codec, payload, out, 2)
        dec.add(total / (time.perf_counter() - t) / 1e9)
        dec_cpu.add(total / max(time.thread_time() - c, 1e-9) / 1e9)
    assert bytes(out) == bytes(pages[-1]), "codec round trip changed the page"
    res = {"encode_gb_s": enc.summary(), "decode_gb_s": dec.summary(), "encode_cpu_gb_s": enc_cpu.summary(),
           "decode_cpu_gb_s": dec_cpu.summary(), "ratio": total / stored}
    if compress:
        res["zstd_only_cpu_gb_s"] = zstd_floor([p for h, p in blobs if h.codec == PLANES],
                                               pages[0].nbytes, reps)
    return res


def zstd_floor(payloads: list[memoryview], page_bytes: int, reps: int) -> dict[str, Any]:
    """Page GB per CPU-second for decompressing only the zstd frames of bf16 plane payloads (the
    u32 plane-size table, then each plane: a zstd frame, or the plane as it is when its size is
    the plane length): the floor under the codec's decode cost, which adds the plane merge and the
    checksum. zstd's Huffman decoding of the sign/exponent plane is most of a page's decode."""
    import struct

    import zstandard

    d = zstandard.ZstdDecompressor()
    frames = []
    for payload in payloads:
        pos = 8
        for size in struct.unpack_from("<2I", payload, 0):
            if size != page_bytes // 2:
                frames.append(payload[pos: pos + size])
            pos += size
    cpu = Series()
    for _ in range(reps):
        c = time.thread_time()
        for f in frames:
            d.decompress(f)
        cpu.add(len(payloads) * page_bytes / max(time.thread_time() - c, 1e-9) / 1e9)
    return cpu.summary()


def run(work: Path, sizes: Sizes, sample: np.ndarray | None = None) -> dict[str, Any]:
    buf = random_bf16(sizes.ceiling_mib << 20)
    out: dict[str, Any] = {"bytes": buf.nbytes, "memcpy": memcpy(buf, max(3, sizes.reps)),
                           "plain_file": plain_file(buf, work, sizes.reps),
                           "write_calls": write_calls(buf, work, sizes.write_pause_ms / 1000, sizes.reps),
                           "write_runway": write_runway(buf, work, sizes.runway_mib, sizes.write_pause_ms / 1000)}
    pages = [buf[o: o + PAGE_BYTES] for o in range(0, min(buf.nbytes, 64 << 20) - PAGE_BYTES + 1, PAGE_BYTES)]
    try:
        out["codec_random_bf16"] = {"raw": codec_speed(pages, False, sizes.reps),
                                    "compressed": codec_speed(pages, True, sizes.reps)}
        if sample is not None and sample.nbytes >= PAGE_BYTES:
            real = [sample[o: o + PAGE_BYTES] for o in
                    range(0, min(sample.nbytes, 64 << 20) - PAGE_BYTES + 1, PAGE_BYTES)]
            out["codec_real_kv"] = {"raw": codec_speed(real, False, sizes.reps),
                                    "compressed": codec_speed(real, True, sizes.reps)}
    except (AttributeError, TypeError) as e:  # the codec API moved: report, keep the rest
        log.warning("codec ceiling not available with this codec module: %s", e)
        out["codec_random_bf16"] = {"status": f"not available: {e}"}
    return out
