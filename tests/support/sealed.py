"""Sealed-record test helpers: key files, encrypted configs, forged checksums, writes past the sealer."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import xxhash

from lifeboat_cache.records import codec
from lifeboat_cache.records.keys import digests
from lifeboat_cache.store import ChunkStore


def make_key(directory: Path, name: str = "seal.key", *, mode: int = 0o600, key: bytes | None = None) -> Path:
    """A key file of 32 random (or given) bytes, as raw bytes, with `mode`."""
    directory.mkdir(parents=True, exist_ok=True)
    p = directory / name
    p.write_bytes(os.urandom(32) if key is None else key)
    os.chmod(p, mode)
    return p


def encryption(*keys: Path, **kw: Any) -> dict[str, Any]:
    """An `encryption:` section: keys (the first seals) plus other settings."""
    return {"keys": [str(k) for k in keys], **kw}


def forge_checksums(rec: bytes | bytearray) -> bytes:
    """The record with valid header and payload checksums for whatever its bytes now say (what a
    writer without the key can always do): version 2 and 3 layouts."""
    rec = bytearray(rec)
    rec[48:56] = struct.pack("<Q", xxhash.xxh3_64_intdigest(bytes(rec[codec.HEADER_SIZE:])))
    tail = bytes(rec[60:64]) if rec[4] == codec.SEALED_VERSION else b""
    rec[56:60] = struct.pack("<I", xxhash.xxh3_64_intdigest(bytes(rec[:56]) + tail) & 0xFFFFFFFF)
    return bytes(rec)


def raw_record(store: ChunkStore, ns: bytes, key: str, level: int = 0) -> bytes:
    """The stored bytes of a key's record on tier `level` (read past the store: no check)."""
    (d,), ik = digests(ns, [key])
    tier = store.tiers[level]
    ref = tier.locate(int(ik[0]))
    assert ref is not None, f"{key} is not on tier {level}"
    buf = bytearray(ref.length)
    assert tier.read_into(ref, [memoryview(buf)])
    return bytes(buf)


def plant(store: ChunkStore, ns: bytes, key: str, record: bytes, level: int = 0) -> None:
    """Write record bytes where the index will find them for `key` (ns): a writer with storage
    access and no key, through the tier, so the sealer never sees them."""
    (d,), ik = digests(ns, [key])
    store.tiers[level].write(int(ik[0]), d, [record], len(record))


def with_identity(rec: bytes, ns: bytes, key: str) -> bytes:
    """A record's bytes with its header rewritten to claim (ns, key), checksums made valid again."""
    (d,), _ = digests(ns, [key])
    out = bytearray(rec)
    out[16:32], out[32:48] = d, ns
    return forge_checksums(out)
