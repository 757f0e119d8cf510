"""Chunk keys of the MLX shim: chained per request, seeded with the namespace and the tree's partition keys.

``key_i = sha256(key_{i-1} || tokens of chunk i)``: a chunk's key depends on its position and every
earlier token, so it can only return to the same prefix. ``hashlib`` is used because SGLang's native
page hash refuses non-Linux platforms.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

CHUNK_TOKENS = 64
_KEY_DOMAIN = b"lifeboat-mlx-chain-v1\0"
_TAIL_DOMAIN = b"lifeboat-mlx-tail-v1\0"


def chain_seed(namespace: bytes, extra_key: str | None = None, cache_salt: str | None = None) -> bytes:
    """Seed of a request's key chain: the namespace plus the radix tree's own partition keys.

    SGLang's tree keeps prefixes with different ``extra_key`` (LoRA, ...) or ``cache_salt`` apart;
    the chain does the same, so a salted prompt never receives an unsalted chunk.
    """
    h = hashlib.sha256(_KEY_DOMAIN)
    h.update(namespace)
    for part in (extra_key, cache_salt):
        b = b"" if part is None else str(part).encode()
        h.update(len(b).to_bytes(4, "little"))
        h.update(b)
    return h.digest()


def chunk_keys(seed: bytes, tokens: Sequence[int] | np.ndarray, n_chunks: int,
               chunk_tokens: int = CHUNK_TOKENS, *, start: int = 0, prev: bytes | None = None) -> list[bytes]:
    """Chained keys of chunks ``start .. n_chunks-1``: ``key_i = sha256(key_{i-1} || tokens_i)``.

    ``prev`` is ``key_{start-1}`` when resuming a chain; with ``start=0`` the seed is used. Tokens are
    hashed as little-endian int64, so the same ids give the same key on every platform.
    """
    if n_chunks <= start:
        return []
    if start > 0 and prev is None:
        raise ValueError("chunk_keys: resuming a chain needs the previous key")
    arr = np.asarray(tokens[start * chunk_tokens:n_chunks * chunk_tokens], dtype="<i8")
    if arr.size < (n_chunks - start) * chunk_tokens:
        raise ValueError(f"chunk_keys: {arr.size} tokens cannot fill chunks {start}..{n_chunks - 1}")
    out: list[bytes] = []
    h = seed if start == 0 else prev
    raw = arr.tobytes()
    step = chunk_tokens * 8
    for i in range(n_chunks - start):
        h = hashlib.sha256(h + raw[i * step:(i + 1) * step]).digest()
        out.append(h)
    return out


def tail_key(prev: bytes, tokens: Sequence[int] | np.ndarray) -> bytes:
    """Key of a prompt's partial last chunk (1..C-1 tokens) after the chunk whose key is ``prev``.

    Domain-separated from chunk keys and bound to the token count, so a tail is only found by a
    prompt whose limit ends exactly there (the same prompt again).
    """
    raw = np.asarray(tokens, dtype="<i8").tobytes()
    return hashlib.sha256(_TAIL_DOMAIN + prev + len(tokens).to_bytes(4, "little") + raw).digest()
