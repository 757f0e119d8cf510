"""Namespaced keys.

A runtime's page key (SGLang's SHA-256 chain hex, or the MLX shim's chained hash) says nothing of the
model, dtype, layout, page size or shard. The namespace fingerprint covers those; the key digest mixes
it in, so the same page key under another namespace is another record. Both go into every record
header and are checked on every read.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

FINGERPRINT_BYTES = 16
KEY_FORMAT = "lifeboat-key-v1"


class Namespace(bytes):
    """A namespace fingerprint (the same 16 bytes) that remembers the scalar parts it was made of
    (`labels`: model, dtype, ...). The fingerprint is a hash, so without them `lifeboat ls` and
    `purge --model` could not tell whose pages a namespace holds; a store names each Namespace it
    writes under with them (a shim's own names win)."""

    labels: dict[str, str]


def namespace_fingerprint(**parts: Any) -> Namespace:
    """16-byte fingerprint of everything that makes two pages incompatible.

    Values must be JSON-serialisable; order of keyword arguments does not matter, None is a value.
    """
    canon = json.dumps({"_format": KEY_FORMAT, **parts}, sort_keys=True, separators=(",", ":"), default=str)
    ns = Namespace(hashlib.blake2b(canon.encode(), digest_size=FINGERPRINT_BYTES).digest())
    ns.labels = {k: str(v) for k, v in parts.items() if isinstance(v, (str, int, float)) and v != ""}
    return ns


def key_bytes(key: str | bytes) -> bytes:
    if isinstance(key, str):
        return key.encode()
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key)
    raise TypeError(f"a page key must be str or bytes, got {type(key).__name__}")


def key_digest(ns: bytes, key: str | bytes) -> bytes:
    """16-byte digest of (namespace, key): the record's identity."""
    return digests(ns, [key])[0][0]


def index_key(digest: bytes) -> int:
    """The signed 64-bit integer the in-memory index uses (first 8 bytes of the digest).

    A 64-bit collision is harmless: reads compare the full 16-byte digest in the record header.
    """
    return int.from_bytes(digest[:8], "little", signed=True)


def digests(ns: bytes, keys: list[str | bytes] | tuple[str | bytes, ...]) -> tuple[list[bytes], np.ndarray]:
    """Digests of a batch of keys plus their index keys as an int64 array."""
    base = hashlib.blake2b(digest_size=16, key=ns)  # copying a keyed state is cheaper than re-keying
    ds = []
    for k in keys:
        h = base.copy()
        h.update(k.encode() if isinstance(k, str) else key_bytes(k))
        ds.append(h.digest())
    ik = np.frombuffer(b"".join(d[:8] for d in ds), dtype="<i8") if ds else np.empty(0, dtype=np.int64)
    return ds, ik


DIGEST_CACHE_ENTRIES = 1 << 15  # ~6.5 MB at most: ~80 B per entry, ~200 B with the 64-char hex key it holds


class DigestCache:
    """`digests` with memory: SGLang asks `exists` about the same prefix pages again and again, and a
    keyed blake2b per key in Python (~1 us each) was most of a 300-key `exists`.

    The cache maps the exact key object (str or bytes, per namespace) to the digest blake2b gave it,
    so the identity keeps every property of the keyed 128-bit digest; only recomputation is saved.
    Only `exists` (`index_keys`) adds entries; put / get (`__call__`) use them but add none, since
    their keys were just asked by `exists` or are new pages that would push its keys out (a thread
    storing pages emptied the cache about once a second in bench/index_scale.py). Full: emptied (no
    per-hit bookkeeping). Thread-safe: single dict operations under the GIL, and a lost race only
    computes a digest twice.
    """

    def __init__(self, limit: int = DIGEST_CACHE_ENTRIES) -> None:
        self._limit = limit
        self._maps: dict[bytes, tuple[Any, dict[str | bytes, bytes]]] = {}
        self._size = 0

    def __call__(self, ns: bytes, keys: list[str | bytes] | tuple[str | bytes, ...],
                 remember: bool = False) -> tuple[list[bytes], np.ndarray]:
        """(digests, int64 index keys) of `keys`; `remember`: keep the ones computed here."""
        entry = self._maps.get(ns)
        if entry is None:
            entry = self._maps.setdefault(bytes(ns), (hashlib.blake2b(digest_size=16, key=ns), {}))
        base, memo = entry
        try:
            ds = [memo.get(k) for k in keys]
        except TypeError:  # an unhashable key type (bytearray, memoryview): no caching
            return digests(ns, keys)
        if None in ds:
            copy = base.copy
            for i, d in enumerate(ds):
                if d is None:
                    k = keys[i]
                    h = copy()
                    h.update(k.encode() if isinstance(k, str) else key_bytes(k))
                    d = ds[i] = h.digest()
                    if remember:
                        if self._size >= self._limit:
                            for _, m in self._maps.values():
                                m.clear()
                            self._size = 0
                        memo[k] = d
                        self._size += 1
        if not ds:
            return ds, np.empty(0, dtype=np.int64)
        return ds, np.frombuffer(b"".join(ds), dtype="<i8")[::2].copy()

    def index_keys(self, ns: bytes, keys: list[str | bytes] | tuple[str | bytes, ...]) -> np.ndarray:
        """Only the int64 index keys, remembering their digests (`exists`). When every key is cached:
        one C-level join of the cached digests, without a digest list, a None scan or a second memo.
        Any miss (or an unhashable key, or a cache emptied meanwhile by another thread) takes the
        full path."""
        entry = self._maps.get(ns)
        if entry is not None:
            try:
                joined = b"".join(map(entry[1].__getitem__, keys))
            except (KeyError, TypeError):
                pass
            else:
                if len(joined) == 16 * len(keys):  # every cached value is a 16-byte digest; never misalign
                    return np.frombuffer(joined, dtype="<i8")[::2].copy()
        return self(ns, keys, remember=True)[1]
