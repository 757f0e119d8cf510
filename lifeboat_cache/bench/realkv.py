"""Real KV: SmolLM2-135M's keys and values for real text (the demo's public-domain documents), as bf16.

Produced in a child process (MLX on CPU, fp32 with OpenBLAS preloaded, as the demo runs it), laid out
(layers, K/V, tokens, heads, head_dim) and cached as a .npy in ~/.cache/lifeboat/bench (next to the
built model). The SGLang section
fills its host-pool pages from this stream (any shape: the values are tiled), so "real KV" has the
value statistics of a real model's cache, which is what the codec and the disks see.

    python -m lifeboat_cache.bench.realkv OUT.npy TOKENS
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from .common import log


def produce(out: Path, tokens: int) -> None:
    """In this process: run SmolLM2 over the text and save the bf16 KV stream (uint16 view)."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    from ..demo import DECLARATION, GETTYSBURG, QUESTION
    from ..demo import ensure_model

    model, tok = load(str(ensure_model(dtype="float32")))
    body = "\n\n".join([DECLARATION, GETTYSBURG, QUESTION])
    ids = tok.encode(body)
    while len(ids) < tokens:  # only for very long asks: the text itself is ~1,500 tokens
        ids = ids + ids
    ids = ids[:tokens]
    cache = make_prompt_cache(model)
    model(mx.array([ids]), cache=cache)
    layers = []
    for c in cache:
        k, v = c.state[0][0, :, :tokens, :], c.state[1][0, :, :tokens, :]  # (heads, T, dim)
        kv = mx.stack([k.transpose(1, 0, 2), v.transpose(1, 0, 2)])      # (2, T, heads, dim)
        layers.append(np.array(kv.astype(mx.bfloat16).view(mx.uint16)))
    np.save(out, np.stack(layers))


def load_or_make(cache_dir: Path, tokens: int, timeout: float = 900.0) -> np.ndarray:
    """Flat uint8 bytes of real bf16 KV (cached per token count); raises RuntimeError when MLX fails."""
    from ..demo import child_env

    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"smollm2-kv-v1-{tokens}.npy"
    if not path.exists():
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npy")  # concurrent runs never share a temp file
        proc = subprocess.run([sys.executable, "-m", "lifeboat_cache.bench.realkv", str(tmp), str(tokens)],
                              env=child_env(), capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0 or not tmp.exists():
            raise RuntimeError(f"real KV child failed (rc={proc.returncode}): {proc.stderr[-2000:]}")
        os.replace(tmp, path)
    arr = np.load(path)
    log.info("real KV: %s bf16 values from %s", arr.shape, path)
    return np.ascontiguousarray(arr).reshape(-1).view(np.uint8)


if __name__ == "__main__":
    produce(Path(sys.argv[1]), int(sys.argv[2]))
