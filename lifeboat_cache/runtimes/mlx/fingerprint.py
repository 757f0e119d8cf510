"""The model fingerprint: everything that makes two models' KV chunks incompatible.

Its namespace (weights identity, dtype, layer/head geometry, chunk size, layout version) keys every
record, so a chunk can only return to the same model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...records import namespace_fingerprint
from .keys import CHUNK_TOKENS

log = logging.getLogger(__name__)

#: Bump when the record layout changes; it is part of the namespace, so old records become misses.
LAYOUT_VERSION = "lifeboat-mlx-kv-v1"
STATE_LAYOUT_VERSION = "lifeboat-mlx-state-v1"
TAIL_LAYOUT_VERSION = "lifeboat-mlx-kv-tail-v1"
_FINGERPRINT_MEMO = "weights-fingerprints.json"
_HASH_BLOCK = 8 << 20


@dataclass(frozen=True)
class ModelFingerprint:
    """Everything that makes two models' KV chunks incompatible; its namespace keys every record."""

    weights: str            # digest of config + weight files, or "model_id:<id>" when configured
    dtype: str              # KV dtype of the pool: float32 / float16 / bfloat16
    num_layers: int         # full-attention layers held in the pool
    n_kv_heads: int
    head_dim: int
    chunk_tokens: int = CHUNK_TOKENS
    state_layout: str | None = None  # hybrid models: auxiliary (recurrent) state layout, else None
    key_namespace: str = ""          # lifeboat.yaml `key_namespace`: an operator's explicit partition

    def namespace(self) -> bytes:
        return namespace_fingerprint(runtime="mlx", layout=LAYOUT_VERSION, **asdict(self))

    def state_namespace(self) -> bytes:
        """Separate namespace for recurrent-state records, so a state is never read as a KV chunk."""
        return namespace_fingerprint(runtime="mlx", layout=STATE_LAYOUT_VERSION, **asdict(self))

    def tail_namespace(self) -> bytes:
        """Namespace of prompt tails (partial last chunks, ``[layers, 2, r, heads, head_dim]``)."""
        return namespace_fingerprint(runtime="mlx", layout=TAIL_LAYOUT_VERSION, **asdict(self))

    @property
    def chunk_shape(self) -> tuple[int, int, int, int, int]:
        return (self.num_layers, 2, self.chunk_tokens, self.n_kv_heads, self.head_dim)

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(np.uint16) if self.dtype == "bfloat16" else np.dtype(self.dtype)

    @property
    def chunk_bytes(self) -> int:
        return int(np.prod(self.chunk_shape)) * self.np_dtype.itemsize

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token in every pooled layer: layers x 2 x heads x head_dim x dtype bytes."""
        return self.chunk_bytes // self.chunk_tokens


def weights_identity(model_dir: str | os.PathLike[str], memo_dir: Path | None = None) -> str:
    """Content digest of a model directory's config and weight files (blake2b-128 hex).

    Hashing every byte is what makes "the same model" mean the same weights; the result is memoised
    per (path, size, mtime, inode) under ``memo_dir`` so a restart does not re-read gigabytes.
    """
    root = Path(model_dir)
    files = sorted([*root.glob("*.safetensors"), *root.glob("*.npz"), *root.glob("*.gguf")])
    cfg = root / "config.json"
    if cfg.is_file():
        files.insert(0, cfg)
    if not files:
        raise FileNotFoundError(f"{root}: no config.json or weight files to fingerprint")
    stamps = []
    for f in files:
        st = f.stat()
        stamps.append([str(f.resolve()), st.st_size, st.st_mtime_ns, st.st_ino])
    stamp_key = hashlib.sha256(json.dumps(stamps).encode()).hexdigest()
    memo_path = (memo_dir / _FINGERPRINT_MEMO) if memo_dir is not None else None
    memo: dict[str, str] = {}
    if memo_path is not None:
        try:
            memo = json.loads(memo_path.read_text())
        except (OSError, ValueError):
            memo = {}
        if isinstance(memo.get(stamp_key), str):
            return memo[stamp_key]
    h = hashlib.blake2b(digest_size=16)
    for f in files:
        h.update(f.name.encode() + b"\0")
        with open(f, "rb") as fh:
            while block := fh.read(_HASH_BLOCK):
                h.update(block)
    digest = h.hexdigest()
    if memo_path is not None:
        try:
            memo_path.parent.mkdir(parents=True, exist_ok=True)
            memo[stamp_key] = digest
            tmp = memo_path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(memo))
            os.replace(tmp, memo_path)
        except OSError as e:  # a memo is an optimisation only
            log.debug("lifeboat: cannot write the fingerprint memo %s: %s", memo_path, e)
    return digest


def mx_dtype_name(dtype: Any) -> str:
    """'float32' / 'float16' / 'bfloat16' for an ``mx.Dtype``."""
    name = str(dtype).rsplit(".", 1)[-1]
    if name not in ("float32", "float16", "bfloat16"):
        raise ValueError(f"unsupported MLX KV dtype {dtype}; LifeboatCache stores float32, float16 or bfloat16")
    return name
