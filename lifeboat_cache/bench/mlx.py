"""MLX: time to first token for a long prompt, restored from LifeboatCache vs recomputed vs SGLang's own
in-memory prefix hit (SmolLM2-135M, mlx-cpu, fp32 with OpenBLAS preloaded on Linux).

Per prompt length, three fresh processes drive SGLang's MLX runner and radix cache in scheduler order
(`lifeboat_cache.demo.mlx_serving`), each after a warm-up request as SGLang's launcher does:
  cold      `--radix-cache-backend lifeboat`, empty store: prefill the whole prompt (recompute), decode,
            write the chunks (background writer);
  restored  a new process on the same store, page cache of the store dropped first: the prefix comes
            back from the store, only the tail is prefilled;
  baseline  SGLang's default radix cache: the prompt once (recompute), then again (in-memory prefix hit).
Ratios: recompute / restored (speedup) and restored / in-memory hit (the cost of coming from disk).
With `mlx_processes=1` (the quick preset) one LifeboatCache process does all three in turn: the prompt
(recompute), flush the writer, forget the in-memory tree, the prompt again (restored, warm page cache),
and once more (in-memory hit).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .common import drop_page_cache
from .sizes import Sizes, ints

CHUNK = 64


def build_prompt(model_dir: Path, prefix_tokens: int) -> list[int]:
    """Chat-formatted public-domain text cut to `prefix_tokens` (repeated as needed), then the question."""
    from transformers import AutoTokenizer

    from ..demo import DECLARATION, GETTYSBURG, QUESTION

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    body = "\n\n".join([DECLARATION, GETTYSBURG] * 2)
    ids: list[int] = []
    while len(ids) < prefix_tokens:
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": body}], tokenize=False),
                         add_special_tokens=False)
        body = body + "\n\n" + body
    tail = tok.encode(f"\n\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    return ids[:prefix_tokens] + tail


def one_process(model: Path, prefix_tokens: int, new_tokens: int, work: Path) -> dict[str, Any]:
    """All three measurements in one LifeboatCache process (quick: one model load instead of three)."""
    from ..demo import child_env, run_plan_process

    prompt = build_prompt(model, prefix_tokens)
    pool = max(4096, 2 * len(prompt) + 4 * new_tokens + 256)
    env = child_env(XDG_CACHE_HOME=str(work / f"mlx-{prefix_tokens}"))
    gen = {"op": "generate", "ids": "P", "max_new_tokens": new_tokens}
    plan = {"model": str(model), "prompts": {"P": prompt}, "warmup": True, "pool_size": pool,
            "steps": [{**gen, "name": "C"}, {"op": "flush"}, {"op": "reset_tree"}, {**gen, "name": "R"},
                      {**gen, "name": "H"}]}
    res = run_plan_process(plan, env, timeout=1800)
    c, r, h = (res["steps"][k] for k in "CRH")
    return {
        "prompt_tokens": len(prompt), "prefix_tokens": prefix_tokens, "processes": 1,
        "restorable_tokens": len(prompt) - 1,  # full chunks + the prompt tail record
        "restored_cached_tokens": r.get("cached_tokens"), "hit_cached_tokens": h.get("cached_tokens"),
        "recompute_ttft_s": c["ttft_s"], "restored_ttft_s": r["ttft_s"], "memory_hit_ttft_s": h["ttft_s"],
        "speedup_vs_recompute": c["ttft_s"] / r["ttft_s"], "restored_vs_memory_hit": r["ttft_s"] / h["ttft_s"],
        "tokens_identical": c["output_ids"] == r["output_ids"] == h["output_ids"],
        "backends": [res["backend"]],
    }


def one(model: Path, prefix_tokens: int, new_tokens: int, work: Path) -> dict[str, Any]:
    from ..demo import child_env, run_plan_process

    prompt = build_prompt(model, prefix_tokens)
    pool = max(4096, 2 * len(prompt) + 4 * new_tokens + 256)
    xdg = work / f"mlx-{prefix_tokens}"
    store_env = child_env(XDG_CACHE_HOME=str(xdg))
    plan = {"model": str(model), "prompts": {"P": prompt}, "warmup": True, "pool_size": pool,
            "steps": [{"op": "generate", "name": "P", "ids": "P", "max_new_tokens": new_tokens}]}
    cold = run_plan_process(plan, store_env, timeout=1800)
    resident = drop_page_cache(xdg)
    restored = run_plan_process(plan, store_env, timeout=1800)
    base_env = {k: v for k, v in store_env.items() if k not in ("LIFEBOAT_CACHE", "SGLANG_USE_MLX")}
    steps = [{"op": "generate", "name": "P", "ids": "P", "max_new_tokens": new_tokens},
             {"op": "generate", "name": "H", "ids": "P", "max_new_tokens": new_tokens}]
    baseline = run_plan_process({**plan, "lifeboat": False, "steps": steps}, base_env, timeout=1800)
    c, r = cold["steps"]["P"], restored["steps"]["P"]
    b, h = baseline["steps"]["P"], baseline["steps"]["H"]
    return {
        "prompt_tokens": len(prompt), "prefix_tokens": prefix_tokens, "processes": 3,
        "restorable_tokens": len(prompt) - 1,  # full chunks + the prompt tail record
        "restored_cached_tokens": r.get("cached_tokens"), "hit_cached_tokens": h.get("cached_tokens"),
        "store_pages_resident_before_restore": resident,
        "recompute_ttft_s": c["ttft_s"], "restored_ttft_s": r["ttft_s"],
        "baseline_recompute_ttft_s": b["ttft_s"], "memory_hit_ttft_s": h["ttft_s"],
        "speedup_vs_recompute": c["ttft_s"] / r["ttft_s"],
        "restored_vs_memory_hit": r["ttft_s"] / h["ttft_s"],
        "tokens_identical": c["output_ids"] == r["output_ids"] == b["output_ids"] == h["output_ids"],
        "restore_read_install_s": restored.get("stats", {}).get("extend_seconds"),
        "backends": [cold["backend"], restored["backend"], baseline["cache_class"]],
        "writer_capture_s": cold.get("stats", {}).get("capture_seconds", 0.0), "decode_s": c["decode_s"],
        "writer_overhead_vs_decode": cold.get("stats", {}).get("capture_seconds", 0.0) / c["decode_s"],
        "chunks_written": cold.get("stats", {}).get("mlx_chunks_written", 0),
    }


def run(work: Path, sizes: Sizes) -> dict[str, Any]:
    import os

    from ..demo import ensure_model
    from ..demo import child_env

    model = ensure_model(dtype="float32")
    blas = "LD_PRELOAD" in child_env() and "openblas" in child_env().get("LD_PRELOAD", "")
    out: dict[str, Any] = {"model": "SmolLM2-135M-Instruct, float32, mlx-cpu" + (" + OpenBLAS" if blas else ""),
                           "new_tokens": sizes.mlx_new_tokens, "cores": os.cpu_count(), "prompts": []}
    for n in ints(sizes.mlx_tokens):
        fn = one_process if sizes.mlx_processes == 1 else one
        out["prompts"].append(fn(model, n, sizes.mlx_new_tokens, work))
    return out
