"""MLX pieces of the Apple-silicon shim: chunk keys, model fingerprint, chunk copier, writer, reader.

SGLang's MLX backend keeps attention KV in ``MlxAttentionKVPool``: per layer an ``mx.array`` of shape
``(slots, n_kv_heads, head_dim)``, token-granular (page size 1, slot 0 is padding). LifeboatCache
stores it in **chunks of 64 tokens**, one record per chunk, laid out ``[layers, 2 (K/V), 64, heads,
head_dim]`` (token-major like the pool rows, so a chunk goes back with one scatter per layer). bf16 is
stored as its uint16 bit pattern (numpy has no bfloat16 buffer format); nothing is compressed.

Why the pieces look the way they do:

* **Keys are chained** (``key_i = sha256(key_{i-1} || tokens of chunk i)``) and seeded with the
  namespace, the radix tree's ``extra_key`` and ``cache_salt``: a chunk's key depends on its position
  and every earlier token, so it can only return to the same prefix. ``hashlib`` is used because
  SGLang's native page hash refuses non-Linux platforms.
* **The namespace is the model fingerprint** (weights identity, dtype, layer/head geometry, chunk
  size, layout version), so a chunk can only return to the same model.
* **MLX threading rule**: evaluating a lazy array on a thread that does not own its stream fails
  (``There is no Stream(cpu, 0) in current thread``). So the gather and ``mx.eval`` run on the caller's
  (SGLang scheduler) thread; the writer thread receives read-only numpy *views of evaluated copies*
  and does only numpy and file I/O. Reads into numpy may run on any thread; turning them into MLX
  arrays and scattering them into the pool happens on the scheduler thread again.
* **Never block the scheduler**: the writer's queue is bounded in bytes; when full, chunks are dropped
  and counted (``mlx_chunks_dropped_queue_full``). A dropped chunk is recomputed next time, never wrong.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import numpy as np

from ..background import BoundedWriter, WriterCounters
from ..keys import namespace_fingerprint

if TYPE_CHECKING:  # imported lazily: the core must import without MLX
    import mlx.core as mx

    from ..store import ChunkStore

log = logging.getLogger(__name__)

CHUNK_TOKENS = 64
#: Bump when the record layout changes; it is part of the namespace, so old records become misses.
LAYOUT_VERSION = "lifeboat-mlx-kv-v1"
STATE_LAYOUT_VERSION = "lifeboat-mlx-state-v1"
TAIL_LAYOUT_VERSION = "lifeboat-mlx-kv-tail-v1"
_KEY_DOMAIN = b"lifeboat-mlx-chain-v1\0"
_TAIL_DOMAIN = b"lifeboat-mlx-tail-v1\0"
_FINGERPRINT_MEMO = "weights-fingerprints.json"
_HASH_BLOCK = 8 << 20


# ---------------------------------------------------------------------------------------------- keys

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


# ---------------------------------------------------------------------------------------- fingerprint

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


# -------------------------------------------------------------------------------- gather / install

def _contiguous(slots: np.ndarray) -> tuple[int, int] | None:
    """(start, stop) when the slots are one ascending run (the common case): slices beat gathers."""
    if len(slots) == 0:
        return None
    a = int(slots[0])
    if int(slots[-1]) - a + 1 != len(slots):
        return None
    return (a, a + len(slots)) if np.array_equal(slots, np.arange(a, a + len(slots))) else None


def settle_pool(pool: Any) -> None:
    """Evaluate the pool's pending lazy writes (SGLang's own deferred prefill/decode syncs)."""
    import mlx.core as mx

    mx.eval(*pool.all_buffers())


def gather_chunks(pool: Any, slot_ids: np.ndarray, chunk_tokens: int = CHUNK_TOKENS) -> "mx.array":
    """Copy whole chunks out of an ``MlxAttentionKVPool`` and evaluate them.

    ``slot_ids`` holds ``n * chunk_tokens`` pool slots in token order. Returns an evaluated, contiguous
    ``[n, layers, 2, chunk_tokens, heads, head_dim]`` array. Must run on the thread that owns the
    pool (SGLang's scheduler thread): it evaluates lazy pool writes.
    """
    import mlx.core as mx

    n = len(slot_ids) // chunk_tokens
    if n * chunk_tokens != len(slot_ids) or n == 0:
        raise ValueError(f"gather_chunks: {len(slot_ids)} slots is not a positive multiple of {chunk_tokens}")
    slot_ids = np.asarray(slot_ids)
    run = _contiguous(slot_ids)
    shape = (n, chunk_tokens, pool.n_kv_heads, pool.head_dim)
    if run is not None:
        a, b = run
        ks = [pool.k_buffer[layer][a:b].reshape(shape) for layer in range(pool.num_layers)]
        vs = [pool.v_buffer[layer][a:b].reshape(shape) for layer in range(pool.num_layers)]
    else:
        idx = mx.array(slot_ids.astype(np.int32))
        ks = [pool.k_buffer[layer][idx].reshape(shape) for layer in range(pool.num_layers)]
        vs = [pool.v_buffer[layer][idx].reshape(shape) for layer in range(pool.num_layers)]
    kv = mx.stack([x for pair in zip(ks, vs) for x in pair], axis=1).reshape(
        n, pool.num_layers, 2, chunk_tokens, pool.n_kv_heads, pool.head_dim)
    mx.eval(kv)
    return kv


def gather_request_chunks(layer_caches: Sequence[Any], chunk_ids: Sequence[int],
                          chunk_tokens: int = CHUNK_TOKENS) -> "mx.array":
    """Copy whole chunks out of one request's own per-layer KV caches and evaluate them.

    ``layer_caches`` are the request's full-attention caches in pool-layer order (SGLang's
    ``ContiguousAttentionKVCache``: ``keys``/``values`` of shape ``(1, heads, max_len, head_dim)``,
    evaluated after every forward). These hold exactly the bytes SGLang copies into the pool rows, but
    reading them does not force the pool's lazy writes (work SGLang defers to the next prefix hit).
    Returns ``[n, layers, 2, chunk_tokens, heads, head_dim]`` like :func:`gather_chunks`.
    """
    import mlx.core as mx

    chunk_ids = list(chunk_ids)
    if not chunk_ids:
        raise ValueError("gather_request_chunks: no chunks")
    runs: list[tuple[int, int]] = []
    for i in chunk_ids:  # consecutive chunk ids become one slice
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))

    def rows(buf: "mx.array") -> "mx.array":
        parts = [buf[0, :, a * chunk_tokens:b * chunk_tokens, :] for a, b in runs]
        x = parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=1)
        heads, _, dim = x.shape
        return x.transpose(1, 0, 2).reshape(len(chunk_ids), chunk_tokens, heads, dim)

    # one stack of [k0, v0, k1, v1, ...] along axis 1 is already the record layout (one copy, not two)
    per_layer = [x for c in layer_caches for x in (rows(c.keys), rows(c.values))]
    n, _, heads, dim = per_layer[0].shape
    kv = mx.stack(per_layer, axis=1).reshape(n, len(layer_caches), 2, chunk_tokens, heads, dim)
    mx.eval(kv)
    return kv


def gather_request_rows(layer_caches: Sequence[Any], start: int, stop: int) -> "mx.array":
    """Rows ``start..stop-1`` of a request's own per-layer caches as ``[layers, 2, r, heads, head_dim]``
    (a prompt tail record), evaluated; see :func:`gather_request_chunks`."""
    import mlx.core as mx

    per_layer = [x[0, :, start:stop, :].transpose(1, 0, 2) for c in layer_caches for x in (c.keys, c.values)]
    r, heads, dim = per_layer[0].shape
    kv = mx.stack(per_layer, axis=0).reshape(len(layer_caches), 2, r, heads, dim)
    mx.eval(kv)
    return kv


def numpy_view(arr: "mx.array") -> np.ndarray:
    """Read-only zero-copy numpy view of an *evaluated* MLX array (bf16 as uint16 bits)."""
    import mlx.core as mx

    if arr.dtype == mx.bfloat16:
        arr = arr.view(mx.uint16)
    view = np.asarray(arr)
    view.flags.writeable = False  # writes through a view would reach the MLX buffer
    return view


def install_chunks(pool: Any, slots: np.ndarray, chunks: np.ndarray, skip: int = 0) -> None:
    """Scatter stored chunks into pool slots (scheduler thread).

    ``chunks`` is ``[n, layers, 2, C, heads, head_dim]`` as read from the store; the first ``skip``
    token rows are already in the tree and are not installed. ``slots`` has ``n*C - skip`` entries.
    One ascending run of slots (what a fresh allocation usually gives) is written with slice updates;
    anything else goes through the pool's own ``set_kv_all_layers``.
    """
    import mlx.core as mx

    n, layers, _, c, heads, dim = chunks.shape
    rows = n * c - skip
    slots = np.asarray(slots)
    if len(slots) != rows or rows <= 0:
        raise ValueError(f"install_chunks: {len(slots)} slots for {rows} rows")
    # [n, L, 2, C, H, D] -> [L, 2, n*C, H, D] in numpy (one pass), then a single copy into MLX
    host = np.ascontiguousarray(chunks.transpose(1, 2, 0, 3, 4, 5)).reshape(layers, 2, n * c, heads, dim)
    arr = mx.array(host[:, :, skip:] if skip else host)
    if pool.dtype == mx.bfloat16:
        arr = arr.view(mx.bfloat16)
    elif arr.dtype != pool.dtype:
        raise ValueError(f"install_chunks: chunk dtype {arr.dtype} does not match the pool's {pool.dtype}")
    run = _contiguous(slots)
    if run is not None:
        a, b = run
        for layer in range(pool.num_layers):
            pool.k_buffer[layer][a:b] = arr[layer, 0]
            pool.v_buffer[layer][a:b] = arr[layer, 1]
    else:
        pool.set_kv_all_layers(mx.array(slots.astype(np.int32)), arr[:, 0], arr[:, 1])
    mx.eval(*pool.all_buffers())


def install_rows(pool: Any, slots: np.ndarray, rows: np.ndarray, skip: int = 0) -> None:
    """Scatter stored rows in pool layout into pool slots (scheduler thread); the fast restore path.

    ``rows`` is ``[layers, 2, R, heads, head_dim]`` (what :class:`ChunkReader` reads records into:
    each layer's K or V rows already contiguous, token-major like the pool). Rows ``skip..R-1`` go
    to ``slots``. Per layer and K/V: one copy of numpy into MLX and one slice update (or the pool's
    own ``set_kv_all_layers`` for scattered slots); no transpose, no staging array of all layers.
    One evaluation of the pool at the end (no separate settle of its pending writes first).
    """
    import mlx.core as mx

    layers, _, r, heads, dim = rows.shape
    slots = np.asarray(slots)
    n = r - skip
    if len(slots) != n or n <= 0:
        raise ValueError(f"install_rows: {len(slots)} slots for {n} rows")
    if layers != pool.num_layers or (heads, dim) != (pool.n_kv_heads, pool.head_dim):
        raise ValueError(f"install_rows: rows {rows.shape} do not fit the pool ({pool.num_layers} layers x "
                         f"{pool.n_kv_heads} heads x {pool.head_dim})")
    bf16 = pool.dtype == mx.bfloat16

    def to_mx(x: np.ndarray) -> "mx.array":
        a = mx.array(x)
        if bf16:
            return a.view(mx.bfloat16)
        if a.dtype != pool.dtype:
            raise ValueError(f"install_rows: row dtype {a.dtype} does not match the pool's {pool.dtype}")
        return a

    run = _contiguous(slots)
    if run is not None:
        a, b = run
        for layer in range(layers):
            pool.k_buffer[layer][a:b] = to_mx(rows[layer, 0, skip:])
            pool.v_buffer[layer][a:b] = to_mx(rows[layer, 1, skip:])
    else:
        idx = mx.array(slots.astype(np.int32))
        pool.set_kv_all_layers(idx, to_mx(rows[:, 0, skip:]), to_mx(rows[:, 1, skip:]))
    # evaluated here, with the pool's pending writes: left lazy inside SGLang's prefill graph, the
    # prefill's own rows came out different in the last float bits (tests/integration/
    # test_mlx_radix_cache.py::test_short_in_memory_match_is_extended_mid_chunk)
    mx.eval(*pool.all_buffers())


# -------------------------------------------------------------------------------------------- writer

@dataclass
class _Batch:
    ns: bytes
    keys: list[bytes]
    views: list[np.ndarray]
    keepalive: Any
    nbytes: int
    affinity: int | None = None
    enqueued: float = field(default_factory=time.perf_counter)
    kind: str = "chunks"  # counter family: mlx_<kind>_written


class ChunkWriter:
    """Background writer: numpy views in, ``store.put`` out, bounded in bytes, never blocks.

    ``offer`` runs on the scheduler thread and only appends to the queue of a
    :class:`~lifeboat_cache.background.BoundedWriter` (one worker thread); when the queue would exceed
    ``max_bytes`` the chunks that do not fit are dropped and counted (the earliest chunks of a
    request are kept, since later chunks are useless without them).
    """

    def __init__(self, store: "ChunkStore", max_bytes: int, *, name: str = "lifeboat-mlx-writer") -> None:
        self.store = store
        self.max_bytes = int(max_bytes)
        self.counters = store.counters
        self._lock = threading.Lock()
        self._pending: dict[bytes, int] = {}  # key -> batches holding it, queued or being written
        self._writer: BoundedWriter[_Batch] = BoundedWriter(
            self._write, self.counters, max_bytes=self.max_bytes, name=name, what="KV chunks", queue="MLX chunk write",
            names=WriterCounters(dropped_full="mlx_chunks_dropped_queue_full",
                                 dropped_closed="mlx_chunks_dropped_closed",
                                 dropped_exit="mlx_chunks_dropped_exit", errors="mlx_chunk_write_exceptions"),
            done=self._release, items=lambda b: len(b.keys), exit_note="they are recomputed next time",
            join_timeout_s=1.0)

    def offer(self, ns: bytes, keys: Sequence[bytes], views: Sequence[np.ndarray], keepalive: Any = None,
              *, affinity: int | None = None, kind: str = "chunks") -> int:
        """Queue chunks for writing; returns how many were accepted (a prefix of ``keys``).

        ``affinity`` is the dialog's drive choice (``ChunkStore.affinity_of`` over its first chunks).
        """
        sizes = [v.nbytes for v in views[:len(keys)]]

        def make(take: int) -> _Batch:  # under the writer's lock: pending before a worker can take it
            batch = _Batch(ns, list(keys[:take]), list(views[:take]), keepalive, sum(sizes[:take]), affinity,
                           kind=kind)
            with self._lock:
                for k in batch.keys:
                    self._pending[k] = self._pending.get(k, 0) + 1
            return batch

        take = self._writer.offer_prefix(sizes, make)
        if take:
            self.counters.add("mlx_chunks_enqueued", take)
        return take

    def is_pending(self, key: bytes) -> bool:
        with self._lock:
            return key in self._pending

    def queued_bytes(self) -> int:
        return self._writer.pending_bytes

    def _write(self, batches: list[_Batch]) -> None:
        for batch in batches:
            ok: list[bool] = [False] * len(batch.keys)
            try:  # the store only raises for caller bugs; the BoundedWriter counts and logs that
                ok = self.store.put(batch.ns, batch.keys, batch.views, affinity=batch.affinity)
            finally:
                n_ok = sum(ok)
                self.counters.add(f"mlx_{batch.kind}_written", n_ok)
                if n_ok < len(ok):
                    self.counters.add(f"mlx_{batch.kind}_write_failed", len(ok) - n_ok)

    def _release(self, batches: list[_Batch]) -> None:
        """After a write (or a drop at close): the keys stop being pending, the views are let go."""
        with self._lock:
            for batch in batches:
                for k in batch.keys:
                    left = self._pending.get(k, 1) - 1
                    if left <= 0:
                        self._pending.pop(k, None)
                    else:
                        self._pending[k] = left
                batch.views.clear()
                batch.keepalive = None

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued chunk is written (tests, demo, shutdown). False on timeout."""
        return self._writer.flush(timeout)

    def close(self, timeout: float | None = 30.0) -> bool:
        """Write what is queued within ``timeout`` seconds, then stop; True when nothing was left.

        Chunks still queued at the deadline are dropped and counted (``mlx_chunks_dropped_exit``),
        with one log line: they are recomputed next time, never served wrong.
        """
        return self._writer.close(timeout)


def drain_at_exit(engine: "MlxChunkEngine", timeout_s: float) -> None:
    """Close ``engine`` (drain its writer within ``timeout_s``) at a clean interpreter exit.

    Registered with ``threading``'s exit hooks, which run before ``atexit`` and, being registered
    later, before ``concurrent.futures`` stops taking work: the store's io pool is still there while
    the queue drains (plain ``atexit`` ran after it and every multi-chunk write failed with "cannot
    schedule new futures after interpreter shutdown").
    """
    fn = functools.partial(engine.close, timeout_s)
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise RuntimeError("no threading exit hooks")
        register(fn)
    except RuntimeError:
        atexit.register(fn)


# -------------------------------------------------------------------------------------------- reader

@dataclass
class ChunkRead:
    """Chunks ``first .. first+n_ok-1`` of a chain, read (verified) into ``rows``.

    ``rows`` is in pool layout, ``[layers, 2, n*C, heads, head_dim]``: chunk i is rows
    ``[i*C, (i+1)*C)`` of every layer's K and V, so the install copies each layer's rows with no
    transpose (the read scatters each record's blocks there).
    """

    keys: list[bytes]
    first: int
    rows: np.ndarray
    n_ok: int
    seconds: float
    tail_key: bytes | None = None  # the prompt tail asked for after the last chunk, if any
    tail_rows: int = 0              # rows allocated for it after the chunks' rows
    tail: int = 0                   # tail rows verified: rows[:, :, n*C:n*C+tail] (0: none)

    @property
    def buf(self) -> np.ndarray:
        """The chunks in record layout, ``[n, layers, 2, C, heads, head_dim]`` (a view, no copy)."""
        layers, two, r, heads, dim = self.rows.shape
        n = len(self.keys)
        c = (r - self.tail_rows) // max(n, 1)
        return self.rows[:, :, :n * c].reshape(layers, two, n, c, heads, dim).transpose(2, 0, 1, 3, 4, 5)


class ChunkReader:
    """Reads runs of consecutive chunks into numpy buffers; safe on any thread (no MLX)."""

    def __init__(self, store: "ChunkStore", fingerprint: ModelFingerprint, workers: int = 2) -> None:
        self.store = store
        self.fp = fingerprint
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lifeboat-mlx-read")

    def leading_hits(self, ns: bytes, keys: Sequence[bytes]) -> int:
        return self.store.count_leading_hits(ns, keys) if keys else 0

    def read(self, ns: bytes, keys: Sequence[bytes], first: int, affinity: int | None = None,
             tail: tuple[bytes, bytes, int] | None = None) -> ChunkRead:
        """Read ``keys`` (chunks ``first..``) and keep the verified leading run; then, if every
        chunk verified, the prompt tail ``tail = (namespace, key, rows)`` right after them."""
        t0 = time.perf_counter()
        layers, two, c, heads, dim = self.fp.chunk_shape
        extra = tail[2] if tail is not None else 0
        rows = np.empty((layers, two, len(keys) * c + extra, heads, dim), dtype=self.fp.np_dtype)
        flat = rows.reshape(layers * two, -1)
        step = c * heads * dim
        # chunk i's record is [layers, 2, C, heads, dim]: its 2*layers blocks land in their pool rows
        pages = [[flat[j, i * step:(i + 1) * step] for j in range(layers * two)] for i in range(len(keys))]
        ok = self.store.get_into(ns, list(keys), pages, affinity=affinity) if keys else []
        n_ok = ok.index(False) if False in ok else len(ok)
        got = 0
        if tail is not None and n_ok == len(keys):
            a, b = len(keys) * step, len(keys) * step + extra * heads * dim
            if self.store.get_into(tail[0], [tail[1]], [[flat[j, a:b] for j in range(layers * two)]],
                                   affinity=affinity)[0]:
                got = extra
        return ChunkRead(list(keys), first, rows, n_ok, time.perf_counter() - t0,
                         tail_key=tail[1] if tail is not None else None, tail_rows=extra, tail=got)

    def submit(self, ns: bytes, keys: Sequence[bytes], first: int, affinity: int | None = None,
               tail: tuple[bytes, bytes, int] | None = None) -> "Future[ChunkRead]":
        return self._pool.submit(self.read, ns, list(keys), first, affinity, tail)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class PrefetchTable:
    """Reads started at request arrival, by request id, bounded in bytes (oldest dropped first)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._items: OrderedDict[str, tuple[bytes, int, int, Future[ChunkRead]]] = OrderedDict()
        self._bytes = 0

    def put(self, rid: str, chain_tag: bytes, first: int, nbytes: int, fut: "Future[ChunkRead]") -> bool:
        with self._lock:
            if nbytes > self.max_bytes:
                return False
            self._drop_locked(rid)
            while self._items and self._bytes + nbytes > self.max_bytes:
                _, (_, _, size, f) = self._items.popitem(last=False)
                f.cancel()
                self._bytes -= size
            self._items[rid] = (chain_tag, first, nbytes, fut)
            self._bytes += nbytes
            return True

    def take(self, rid: str) -> tuple[bytes, int, "Future[ChunkRead]"] | None:
        with self._lock:
            item = self._items.pop(rid, None)
            if item is None:
                return None
            self._bytes -= item[2]
            return item[0], item[1], item[3]

    def drop(self, rid: str) -> None:
        with self._lock:
            self._drop_locked(rid)

    def _drop_locked(self, rid: str) -> None:
        item = self._items.pop(rid, None)
        if item is not None:
            item[3].cancel()
            self._bytes -= item[2]

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


# --------------------------------------------------------------------------------- hybrid state

def state_to_numpy(arrays: Sequence["mx.array"]) -> np.ndarray:
    """Pack evaluated recurrent-state arrays into one flat byte vector (scheduler thread).

    Layout: each array's raw bytes, in order; shapes and dtypes are fixed by the model and recorded
    in the fingerprint's ``state_layout``, so a record only returns to a model with the same layout.
    """
    import mlx.core as mx

    parts = []
    for a in arrays:
        if a.dtype == mx.bfloat16:
            a = a.view(mx.uint16)
        parts.append(np.asarray(a).reshape(-1).view(np.uint8))
    return np.concatenate(parts) if parts else np.zeros(0, np.uint8)


def numpy_to_state(buf: np.ndarray, specs: Sequence[tuple[tuple[int, ...], str]]) -> list["mx.array"]:
    """Inverse of :func:`state_to_numpy` for the given (shape, dtype-name) specs (scheduler thread)."""
    import mlx.core as mx

    out = []
    off = 0
    for shape, dname in specs:
        np_dt = np.dtype(np.uint16) if dname == "bfloat16" else np.dtype(dname)
        n = int(np.prod(shape)) * np_dt.itemsize
        a = mx.array(buf[off:off + n].view(np_dt).reshape(shape))
        if dname == "bfloat16":
            a = a.view(mx.bfloat16)
        out.append(a)
        off += n
    if off != buf.nbytes:
        raise ValueError(f"state record is {buf.nbytes} bytes, layout wants {off}")
    return out


def state_specs_bytes(specs: Iterable[tuple[tuple[int, ...], str]]) -> int:
    total = 0
    for shape, dname in specs:
        total += int(np.prod(shape)) * (2 if dname == "bfloat16" else np.dtype(dname).itemsize)
    return total


# -------------------------------------------------------------------------------------------- timing

class RequestPathClock:
    """Accumulates seconds spent on the scheduler thread by LifeboatCache (for the overhead report)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.totals: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def add(self, what: str, seconds: float) -> None:
        with self._lock:
            self.totals[what] = self.totals.get(what, 0.0) + seconds
            self.counts[what] = self.counts.get(what, 0) + 1

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            out = {f"{k}_seconds": v for k, v in self.totals.items()}
            out.update({f"{k}_calls": float(v) for k, v in self.counts.items()})
            return out


# -------------------------------------------------------------------------------------------- engine

class MlxChunkEngine:
    """Store + writer + reader + prefetch for one model: what the SGLang radix cache calls.

    Owns nothing of SGLang. Threading: ``capture`` and ``install`` run on the pool-owning (scheduler)
    thread; the writer and the readers never touch MLX.
    """

    def __init__(self, store: "ChunkStore", fingerprint: ModelFingerprint, *, queue_bytes: int,
                 prefetch_bytes: int | None = None, read_workers: int = 2, owns_store: bool = True) -> None:
        self.store = store
        self.fp = fingerprint
        self.ns = fingerprint.namespace()
        self.state_ns = fingerprint.state_namespace()
        self.tail_ns = fingerprint.tail_namespace()
        self.chunk = fingerprint.chunk_tokens
        self.writer = ChunkWriter(store, queue_bytes)
        self.reader = ChunkReader(store, fingerprint, workers=read_workers)
        self.prefetches = PrefetchTable(prefetch_bytes if prefetch_bytes is not None else queue_bytes)
        self.clock = RequestPathClock()
        self.counters = store.counters
        self._owns_store = owns_store
        self._closed = False
        self.reporter: Any = None  # a StatsReporter (stats file, Prometheus) when serving

    # -------------------------------------------------------------- keys
    def seed(self, extra_key: str | None = None, cache_salt: str | None = None) -> bytes:
        return chain_seed(self.ns, extra_key, cache_salt)

    def keys(self, seed: bytes, tokens: Sequence[int] | np.ndarray, n_chunks: int) -> list[bytes]:
        return chunk_keys(seed, tokens, n_chunks, self.chunk)

    def affinity(self, keys: Sequence[bytes]) -> int | None:
        """Drive choice of a dialog from its first chunk keys (chunk 0 onwards)."""
        fn = getattr(self.store, "affinity_of", None)
        return fn(self.ns, list(keys)) if fn is not None and keys else None

    # -------------------------------------------------------------- writes (scheduler thread)
    def missing(self, keys: Sequence[bytes]) -> list[int]:
        """Indices of keys neither stored nor waiting in the writer's queue (index only, no I/O)."""
        present = self.store.contains(self.ns, list(keys)) if keys else []
        return [i for i, (k, p) in enumerate(zip(keys, present)) if not p and not self.writer.is_pending(k)]

    def capture(self, pool: Any, chunk_slots: Sequence[np.ndarray], keys: Sequence[bytes],
                affinity: int | None = None) -> int:
        """Copy chunks out of the pool (gather + eval here) and queue them; returns chunks queued."""
        if not keys:
            return 0
        t0 = time.perf_counter()
        settle_pool(pool)  # SGLang's deferred pool writes: work it would do anyway, timed apart
        t1 = time.perf_counter()
        self.clock.add("pool_settle", t1 - t0)
        kv = gather_chunks(pool, np.concatenate(list(chunk_slots)), self.chunk)
        return self._queue(kv, keys, affinity, t1)

    def capture_from_request(self, layer_caches: Sequence[Any], chunk_ids: Sequence[int],
                             keys: Sequence[bytes], affinity: int | None = None) -> int:
        """Copy chunks out of a request's own KV caches (see :func:`gather_request_chunks`) and queue them."""
        if not keys:
            return 0
        t0 = time.perf_counter()
        kv = gather_request_chunks(layer_caches, chunk_ids, self.chunk)
        return self._queue(kv, keys, affinity, t0)

    def _queue(self, kv: "mx.array", keys: Sequence[bytes], affinity: int | None, t0: float) -> int:
        whole = numpy_view(kv)
        views = [whole[i] for i in range(len(keys))]
        n = self.writer.offer(self.ns, keys, views, keepalive=kv, affinity=affinity)
        self.clock.add("capture", time.perf_counter() - t0)
        return n

    # -------------------------------------------------------------- reads
    def stored_run(self, keys: Sequence[bytes]) -> int:
        """How many of ``keys``, from the first, the store holds (index only)."""
        return self.reader.leading_hits(self.ns, keys)

    def read(self, keys: Sequence[bytes], first: int, affinity: int | None = None,
             tail: tuple[bytes, int] | None = None) -> ChunkRead:
        return self.reader.read(self.ns, keys, first, affinity, self.tail_spec(tail))

    # -------------------------------------------------------------- prompt tails
    def tail_of(self, keys: Sequence[bytes], tokens: Sequence[int] | np.ndarray,
                stop: int) -> tuple[bytes, int] | None:
        """(key, rows) of the partial chunk ``tokens[n*C:stop]`` after the ``n = stop // C`` full
        chunks whose keys are ``keys[:n]``; None when ``stop`` is chunk-aligned or ``n`` is 0.

        A prompt's tail (what SGLang matches of it: all but its last token) is stored once per
        prompt, so the same prompt again restores everything an in-memory hit would and prefills
        one token, not up to C-1.
        """
        n = stop // self.chunk
        r = stop - n * self.chunk
        if r <= 0 or n <= 0 or len(keys) < n:
            return None
        return tail_key(keys[n - 1], np.asarray(tokens[n * self.chunk:stop])), r

    def has_tail(self, key: bytes) -> bool:
        return bool(self.store.contains(self.tail_ns, [key])[0])

    def tail_spec(self, tail: tuple[bytes, int] | None) -> tuple[bytes, bytes, int] | None:
        return (self.tail_ns, tail[0], tail[1]) if tail is not None else None

    def capture_tail(self, kv: "mx.array", key: bytes, affinity: int | None = None) -> int:
        """Queue an evaluated ``[layers, 2, r, heads, head_dim]`` prompt tail (scheduler thread)."""
        n = self.writer.offer(self.tail_ns, [key], [numpy_view(kv)], keepalive=kv, affinity=affinity,
                              kind="tails")
        return n

    def prefetch(self, rid: str, chain_tag: bytes, keys: Sequence[bytes], first: int,
                 affinity: int | None = None, tail: tuple[bytes, int] | None = None) -> bool:
        """Start reading at request arrival; ``chain_tag`` (the key of the last chunk) validates reuse."""
        if not keys:
            return False
        nbytes = len(keys) * self.fp.chunk_bytes
        fut = self.reader.submit(self.ns, keys, first, affinity, self.tail_spec(tail))
        ok = self.prefetches.put(rid, chain_tag, first, nbytes, fut)
        if not ok:
            fut.cancel()
        else:
            self.counters.add("mlx_prefetches_started")
        return ok

    def take_prefetch(self, rid: str, keys: Sequence[bytes], first: int,
                      timeout: float = 30.0) -> ChunkRead | None:
        """The arrival read for ``rid`` if it covers chunk ``first`` of this chain, else None."""
        item = self.prefetches.take(rid)
        if item is None:
            return None
        tag, p_first, fut = item
        try:
            read = fut.result(timeout=timeout)
        except Exception as e:  # cancelled, timed out or failed: fall back to a direct read
            log.debug("lifeboat: prefetch for %s unusable: %s", rid, e)
            return None
        if p_first > first or not read.keys or p_first + read.n_ok <= first:
            return None
        if read.keys[-1] != tag or list(keys[p_first:p_first + len(read.keys)]) != read.keys:
            return None  # another chain (the prompt changed): never install it
        self.counters.add("mlx_prefetches_used")
        return read

    def install(self, pool: Any, slots: np.ndarray, read: ChunkRead, upto_chunk: int, skip: int,
                tail: int = 0) -> None:
        """Install chunks ``read.first .. upto_chunk-1`` and then ``tail`` rows of the prompt tail,
        minus the first ``skip`` rows (scheduler thread)."""
        t0 = time.perf_counter()
        # no settle first: install_rows evaluates the pool's pending writes together with these rows
        n = upto_chunk - read.first
        install_rows(pool, slots, read.rows[:, :, :n * self.chunk + tail], skip)
        self.clock.add("install", time.perf_counter() - t0)

    # -------------------------------------------------------------- hybrid state records
    def put_state(self, key: bytes, state: np.ndarray, affinity: int | None = None) -> int:
        """Queue one recurrent-state record (already numpy, evaluated) under the state namespace."""
        return self.writer.offer(self.state_ns, [key], [state], affinity=affinity)

    def has_states(self, keys: Sequence[bytes]) -> list[bool]:
        return self.store.contains(self.state_ns, list(keys)) if keys else []

    def get_state(self, key: bytes, nbytes: int, affinity: int | None = None) -> np.ndarray | None:
        buf = np.empty(nbytes, dtype=np.uint8)
        ok = self.store.get_into(self.state_ns, [key], [buf], affinity=affinity)
        return buf if ok and ok[0] else None

    # -------------------------------------------------------------- housekeeping
    def stats(self) -> dict[str, Any]:
        c = self.counters.snapshot()
        out: dict[str, Any] = {k: v for k, v in c.items()
                               if k.startswith(("mlx_", "miss_", "read_", "write_", "pages_"))}
        out["writer_queued_bytes"] = self.writer.queued_bytes()
        out.update(self.clock.snapshot())
        return out

    def flush(self, timeout: float | None = 60.0) -> bool:
        """Write everything queued and make it durable for the next process."""
        done = self.writer.flush(timeout)
        self.store.flush()
        return done

    def close(self, timeout: float | None = 30.0) -> None:
        if self._closed:
            return
        self._closed = True
        self.writer.close(timeout)
        self.reader.close()
        if self.reporter is not None:
            self.reporter.close()  # after the drain, so the last stats file counts it
        if self._owns_store:
            self.store.close()
