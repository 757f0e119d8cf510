"""MLX pieces of the Apple-silicon shim, one module per job; the public names are re-exported here.

SGLang's MLX backend keeps attention KV in ``MlxAttentionKVPool``: per layer an ``mx.array`` of shape
``(slots, n_kv_heads, head_dim)``, token-granular (page size 1, slot 0 is padding). LifeboatCache
stores it in **chunks of 64 tokens**, one record per chunk, laid out ``[layers, 2 (K/V), 64, heads,
head_dim]`` (token-major like the pool rows, so a chunk goes back with one copy per layer). bf16 is
stored as its uint16 bit pattern (numpy has no bfloat16 buffer format); nothing is compressed.

  keys.py         chained chunk keys and prompt-tail keys (same prefix, same position, or a miss)
  fingerprint.py  ModelFingerprint (its namespace keys every record), weights identity
  transfer.py     gathers out of the KV pool and installs into it (scheduler thread: MLX threading rule)
  writer.py       ChunkWriter, the bounded background writer (numpy and file I/O only), exit drain
  queue_size.py   the writer queue's bound: one context's KV (floor, cap) unless lifeboat.yaml sets it
  reader.py       ChunkReader (verified runs into pool-layout rows), PrefetchTable (arrival reads)
  engine.py       MlxChunkEngine: what the SGLang radix cache calls; RequestPathClock
  hybrid.py       hybrid models: recurrent-state snapshots saved and restored next to the chunks
  env.py          the MLX runtime's environment variables (index wait, OpenBLAS preload) and their parsers

**MLX threading rule**: evaluating a lazy array on a thread that does not own its stream fails
(``There is no Stream(cpu, 0) in current thread``). So gathers, installs and ``mx.eval`` run on the
caller's (SGLang scheduler) thread; the writer and readers touch only numpy and files. MLX itself is
imported inside the functions that need it, so this package imports without MLX.
"""

from __future__ import annotations

from .engine import MlxChunkEngine, RequestPathClock
from .env import (
    DEFAULT_BLAS, DEFAULT_REBUILD_WAIT_S, ENV_BLAS_PRELOAD, ENV_REBUILD_WAIT, MLX_VARIABLES, parse_blas_preload,
    parse_rebuild_wait)
from .fingerprint import (
    LAYOUT_VERSION, STATE_LAYOUT_VERSION, TAIL_LAYOUT_VERSION, ModelFingerprint, mx_dtype_name, weights_identity)
from .hybrid import HybridState, numpy_to_state, state_specs_bytes, state_to_numpy
from .keys import CHUNK_TOKENS, chain_seed, chunk_keys, tail_key
from .queue_size import QueueSize, writer_queue_size
from .reader import ChunkRead, ChunkReader, PrefetchTable, RowBuffers
from .transfer import (
    PoolLayout, gather_chunks, gather_request_chunks, gather_request_rows, install_chunks, install_rows, numpy_view,
    prepare_pool, settle_pool)
from .writer import ChunkWriter, drain_at_exit

__all__ = [
    "CHUNK_TOKENS", "DEFAULT_BLAS", "DEFAULT_REBUILD_WAIT_S", "ENV_BLAS_PRELOAD", "ENV_REBUILD_WAIT", "LAYOUT_VERSION",
    "MLX_VARIABLES", "STATE_LAYOUT_VERSION", "TAIL_LAYOUT_VERSION",
    "ChunkRead", "ChunkReader", "ChunkWriter", "HybridState", "MlxChunkEngine", "ModelFingerprint",
    "PoolLayout", "PrefetchTable", "QueueSize", "RequestPathClock", "RowBuffers",
    "chain_seed", "chunk_keys", "drain_at_exit", "gather_chunks", "gather_request_chunks", "gather_request_rows",
    "install_chunks", "install_rows", "mx_dtype_name", "numpy_to_state", "numpy_view", "parse_blas_preload", "parse_rebuild_wait", "prepare_pool", "settle_pool",
    "state_specs_bytes", "state_to_numpy", "tail_key", "weights_identity",
    "writer_queue_size",
]
