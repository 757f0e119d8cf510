"""What sealing costs: sealed vs unsealed LifeboatCache through SGLang's factory on a real host pool,
and AES-256-GCM seal / open per core.

primitives  one core, the record as the store builds and opens it (`Sealer.build` / `decode_into`),
            raw pages (the local tier's default) and compressed ones, against the unsealed codec in the
            same loop: GB of page per CPU-second, so the ratio is the CPU cost of sealing alone.
sglang      the sglang_vs_file harness (SGLang 0.5.23's StorageBackendFactory + HybridCacheController
            over one MHATokenToKVPoolHost, LifeboatCache's default settings) with two contenders:
            `unsealed` and `sealed` (the same settings plus `encryption: {keys: [a key file]}`),
            interleaved reps with the order rotated, write (including close), cold read (page cache
            dropped and checked) and warm read; GB/s, CPU s/GB, and the per-rep ratio sealed / unsealed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from .common import Series, log
from .sizes import Sizes, names

SIDES = ("unsealed", "sealed")
PHASES = ("write", "cold_read", "warm_read")


def _pages(sample: np.ndarray | None, page_bytes: int, n: int) -> list[np.ndarray]:
    """n pages of real KV bytes (tiled from the sample) or random bf16 bits."""
    rng = np.random.default_rng(7)
    if sample is None:
        return [rng.integers(0, 256, page_bytes, dtype=np.uint8) for _ in range(n)]
    src = np.tile(np.ascontiguousarray(sample).reshape(-1).view(np.uint8), -(-page_bytes * 2 // sample.nbytes) + 1)
    starts = [2 * int(rng.integers(0, page_bytes // 2)) for _ in range(n)]
    return [np.ascontiguousarray(src[o: o + page_bytes]) for o in starts]


def primitives(key_path: Path, sizes: Sizes, sample: np.ndarray | None) -> dict[str, Any]:
    """Seal / open GB per CPU-second of one core, raw and compressed, sealed vs the plain codec."""
    from ..records import DTYPE_CODES, unpack_header, verify_record
    from ..config import EncryptionSettings
    from ..records import Sealer, sealer_for

    sealed, plain = sealer_for(EncryptionSettings(keys=(key_path,))), Sealer()
    out: dict[str, Any] = {}
    for label, page_bytes in (("768KiB", 768 << 10), ("8MiB", 8 << 20)):
        n = max(2, (sizes.ceiling_mib << 20) // page_bytes)
        pages = _pages(sample, page_bytes, n)
        dst = np.empty(page_bytes, np.uint8)
        for compress in (False, True):
            row: dict[str, Any] = {}
            for name, s in (("plain", plain), ("sealed", sealed)):
                enc, dec = Series(), Series()
                for _ in range(sizes.reps):
                    t = time.process_time()
                    for p in pages:  # each record dropped after its build, as after the store's write
                        s.build(p, itemsize=2, dtype=DTYPE_CODES["bf16"], digest=bytes(16),
                                namespace=bytes(16), compress=compress)
                    enc.add(n * page_bytes / max(time.process_time() - t, 1e-9) / 1e9)
                    recs = [s.build(p, itemsize=2, dtype=DTYPE_CODES["bf16"], digest=bytes(16),
                                    namespace=bytes(16), compress=compress) for p in pages]
                    blobs = [(unpack_header(h), memoryview(b"".join(bytes(memoryview(x)) for x in parts)))
                             for h, parts, _ in recs]
                    t = time.process_time()
                    for h, payload in blobs:
                        verify_record(h, payload, digest=h.digest, namespace=h.namespace)
                        s.decode_into(h, payload, [dst])
                    dec.add(n * page_bytes / max(time.process_time() - t, 1e-9) / 1e9)
                row[name] = {"build_cpu_gb_s": enc.summary(), "open_cpu_gb_s": dec.summary()}
            row["write_ratio"] = row["sealed"]["build_cpu_gb_s"]["median"] / row["plain"]["build_cpu_gb_s"]["median"]
            row["read_ratio"] = row["sealed"]["open_cpu_gb_s"]["median"] / row["plain"]["open_cpu_gb_s"]["median"]
            out[f"{label} {'compressed' if compress else 'raw'}"] = row
    # AES-256-GCM alone (cryptography / OpenSSL), one 8 MiB buffer: the floor under the sealed rows
    key = sealed.keyring.sealing.aead  # type: ignore[union-attr]
    buf = _pages(sample, 8 << 20, 1)[0]
    ct = np.empty(buf.nbytes + 16, np.uint8)
    reps = max(2, (sizes.ceiling_mib << 20) // buf.nbytes)
    t = time.process_time()
    for i in range(reps):
        key.encrypt_into(i.to_bytes(12, "little"), buf, b"", ct)
    seal = reps * buf.nbytes / max(time.process_time() - t, 1e-9) / 1e9
    t = time.process_time()
    for _ in range(reps):
        key.decrypt_into((reps - 1).to_bytes(12, "little"), ct, b"", buf)
    open_ = reps * buf.nbytes / max(time.process_time() - t, 1e-9) / 1e9
    out["aes_gcm"] = {"seal_cpu_gb_s": seal, "open_cpu_gb_s": open_}
    return out


def run_case(root: Path, key_path: Path, shape: str, layout: str, kind: str, sizes: Sizes,
             realkv: np.ndarray | None) -> dict[str, Any]:
    from .sglang_vs_file import BACKEND, Controller, compare_case

    def attach(side: str, dev: Any, host: Any, path: Path) -> Controller:
        extra: dict[str, Any] = {**BACKEND, "storage": [{"type": "local", "path": str(path)}]}
        if side == "sealed":
            extra["encryption"] = {"keys": [str(key_path)]}
        ctl = Controller(dev, host, "dynamic", extra)
        ctl.backend.store.wait_rebuilt()
        return ctl

    return compare_case(root, shape, layout, kind, sizes, realkv, SIDES, attach, tag="seal", numerator="sealed")


def run(work: Path, sizes: Sizes, realkv: np.ndarray | None) -> dict[str, Any]:
    from ..records import write_key_file
    from .common import pin_torch_threads

    work.mkdir(parents=True, exist_ok=True)
    key_path = work / "bench-seal.key"
    if key_path.exists():
        key_path.unlink()
    write_key_file(key_path)
    res: dict[str, Any] = {"primitives": primitives(key_path, sizes, realkv)}
    res["torch_threads"] = pin_torch_threads(sizes.torch_threads)
    kind = "real" if realkv is not None else "random"
    cases = []
    for shape in names(sizes.shapes):
        for layout in names(sizes.layouts):
            log.info("sealing: %s %s %s", shape, layout, kind)
            cases.append(run_case(work / "sealing", key_path, shape, layout, kind, sizes, realkv))
    res["cases"] = cases
    return res
