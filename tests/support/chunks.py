"""Pages, keys, read-back, polling, byte-flip corruption and a one-local-tier config: written once for every
test module."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Union

import numpy as np


def page(i: int, n: int = 8192, dtype: Any = np.uint16) -> np.ndarray:
    """Seeded page of ``n`` bf16-like values (the top 16 bits of small float32s), as ``dtype``."""
    rng = np.random.default_rng(i)
    x = (rng.standard_normal(n).astype(np.float32) * 0.05)
    return (x.view(np.uint32) >> 16).astype(np.uint16).view(dtype)


def pages(n: int, seed: int = 0, size: int = 16384) -> list[np.ndarray]:
    """``n`` seeded float16 pages of ``size`` bytes each."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(size // 2).astype(np.float32) * 0.05).astype(np.float16) for _ in range(n)]


def keys(n: int, prefix: str = "k", width: int = 6) -> list[str]:
    return [f"{prefix}{i:0{width}d}" for i in range(n)]


def read_back(store: Any, ks: list[str], ps: list[np.ndarray], *, ns: bytes, **kw: Any) -> list[bool]:
    """Per key: read into a fresh buffer through ``get_into`` and compare bit for bit."""
    out = [np.empty_like(p) for p in ps]
    ok = store.get_into(ns, ks, out, **kw)
    return [bool(o and (a == b).all()) for o, a, b in zip(ok, out, ps)]


def wait_for(cond: Callable[[], bool], timeout: float = 10.0, step: float = 0.05) -> bool:
    """Poll ``cond`` until it holds or ``timeout`` passes; the final answer is ``cond()`` itself."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return bool(cond())


def flip_byte(target: Union[bytearray, str, os.PathLike], offset: int, mask: int = 0xFF) -> None:
    """Corrupt one byte in place: XOR ``mask`` into ``target[offset]`` (a bytearray or a file)."""
    if isinstance(target, bytearray):
        target[offset] ^= mask
        return
    with open(Path(target), "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        if len(b) != 1:
            raise ValueError(f"{target}: offset {offset} is past the end of the file")
        f.seek(offset)
        f.write(bytes([b[0] ^ mask]))


def local_settings(path: Union[str, os.PathLike], **tier: Any) -> Any:
    """One local tier at path (1 GiB, 4 MiB segments, `tier` overrides), 4 io workers, short cooldowns."""
    from lifeboat_cache.config import settings_from_dict

    t = {"type": "local", "path": str(path), "capacity": "1GiB", "segment_size": "4MiB", **tier}
    return settings_from_dict({"storage": [t], "engine": {"io_workers": 4, "failure_cooldown_s": 0.2,
                                                          "failure_cooldown_max_s": 0.8}})
