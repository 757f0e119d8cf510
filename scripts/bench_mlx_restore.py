#!/usr/bin/env python3
"""Benchmark: restore a 2,048-token prefix from LifeboatCache vs recompute it (SmolLM2, MLX, one run).

Three fresh processes, each driving SGLang's MLX runner + radix cache the way its scheduler does
(``lifeboat_cache.testing.mlx_serving``; the MLX server itself needs Apple Metal):

1. ``cold``     - ``--radix-cache-backend lifeboat``, empty store: prefill the whole prompt, decode,
                  and write the finished request's chunks (background writer);
2. ``restored`` - a new process on the same store: the 2,048-token prefix comes back from the store,
                  only the tail is prefilled;
3. ``baseline`` - SGLang's default radix cache (no LifeboatCache), same prompt: the request-path
                  cost without the writer.

Targets (from the issue): time to first token restored >= 10x faster than cold; writer overhead on the
request path <= 5% of the request's decode time. Each process serves a short warm-up request first,
as SGLang's launcher does, so neither TTFT includes the pool's creation. On Linux the children run
fp32 with OpenBLAS preloaded (MLX's CPU wheel otherwise uses a reference BLAS).

    python scripts/bench_mlx_restore.py [--prefix-tokens 2048] [--new-tokens 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lifeboat_cache.demo import texts  # noqa: E402
from lifeboat_cache.demo.smollm2 import ensure_model  # noqa: E402
from lifeboat_cache.testing.mlx_serving import child_env, run_plan_process  # noqa: E402

CHUNK = 64


def build_prompt(model_dir: Path, prefix_tokens: int) -> list[int]:
    """Chat-formatted public-domain text cut to ``prefix_tokens``, then the question and the assistant turn."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    body = "\n\n".join([texts.DECLARATION, texts.GETTYSBURG] * 2)
    head = tok.apply_chat_template([{"role": "user", "content": body}], tokenize=False)
    ids = tok.encode(head, add_special_tokens=False)
    if len(ids) < prefix_tokens:
        raise SystemExit(f"the text gives only {len(ids)} tokens; ask for fewer --prefix-tokens")
    tail = tok.encode(f"\n\n{texts.QUESTION}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    return ids[:prefix_tokens] + tail


def run(prefix_tokens: int, new_tokens: int, pool_size: int) -> dict:
    model = ensure_model(dtype="float32")
    prompt = build_prompt(model, prefix_tokens)
    restorable = (len(prompt) - 1) // CHUNK * CHUNK
    with tempfile.TemporaryDirectory(prefix="lifeboat-bench-mlx-") as tmp:
        store_env = child_env(XDG_CACHE_HOME=str(Path(tmp) / "xdg"))
        plan = {"model": str(model), "prompts": {"P": prompt}, "warmup": True, "pool_size": pool_size,
                "steps": [{"op": "generate", "name": "P", "ids": "P", "max_new_tokens": new_tokens}]}
        cold = run_plan_process(plan, store_env, timeout=1800)
        restored = run_plan_process(plan, store_env, timeout=1800)
        base_env = {k: v for k, v in store_env.items() if k not in ("LIFEBOAT_CACHE", "SGLANG_USE_MLX")}
        baseline = run_plan_process({**plan, "lifeboat": False}, base_env, timeout=1800)
    c, r, b = (x["steps"]["P"] for x in (cold, restored, baseline))
    capture_s = cold["stats"].get("capture_seconds", 0.0)
    settle_s = cold["stats"].get("pool_settle_seconds", 0.0)
    return {
        "model": "SmolLM2-135M-Instruct (float32, mlx-cpu" + (" + OpenBLAS" if "LD_PRELOAD" in store_env else "") + ")",
        "prompt_tokens": len(prompt),
        "prefix_tokens": prefix_tokens,
        "restorable_tokens": restorable,
        "backend": [cold["backend"], restored["backend"], baseline["cache_class"]],
        "cold_ttft_s": c["ttft_s"],
        "restored_ttft_s": r["ttft_s"],
        "baseline_ttft_s": b["ttft_s"],
        "restored_cached_tokens": r["cached_tokens"],
        "ttft_speedup": c["ttft_s"] / r["ttft_s"],
        "tokens_identical": c["output_ids"] == r["output_ids"] == b["output_ids"],
        "decode_s": c["decode_s"],
        "new_tokens": len(c["output_ids"]),
        "writer_capture_s": capture_s,
        "writer_overhead_vs_decode": capture_s / c["decode_s"],
        "release_s_lifeboat": c["release_s"],
        "release_s_baseline": b["release_s"],
        "release_delta_vs_decode": (c["release_s"] - b["release_s"]) / c["decode_s"],
        "pool_settle_s": settle_s,
        "restore_read_install_s": restored["stats"].get("extend_seconds", 0.0),
        "chunks_written": cold["stats"].get("mlx_chunks_written", 0),
        "chunks_dropped": cold["stats"].get("mlx_chunks_dropped_queue_full", 0),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefix-tokens", type=int, default=2048)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--pool-size", type=int, default=4096)
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    res = run(args.prefix_tokens, args.new_tokens, args.pool_size)
    speed_ok = res["ttft_speedup"] >= 10.0
    overhead_ok = res["writer_overhead_vs_decode"] <= 0.05
    print(f"model                 : {res['model']}")
    print(f"prompt                : {res['prompt_tokens']} tokens ({res['restorable_tokens']} restorable, "
          f"{res['restored_cached_tokens']} restored)")
    print(f"TTFT cold (recompute) : {res['cold_ttft_s'] * 1e3:8.0f} ms")
    print(f"TTFT restored (store) : {res['restored_ttft_s'] * 1e3:8.0f} ms  "
          f"(read + install {res['restore_read_install_s'] * 1e3:.0f} ms)")
    print(f"TTFT baseline (SGLang): {res['baseline_ttft_s'] * 1e3:8.0f} ms")
    print(f"speedup               : {res['ttft_speedup']:.1f}x  (target >= 10x: {'PASS' if speed_ok else 'FAIL'})")
    print(f"writer on the request path: {res['writer_capture_s'] * 1e3:.1f} ms for {res['chunks_written']} chunks "
          f"= {res['writer_overhead_vs_decode'] * 100:.2f}% of {res['decode_s']:.2f} s decode "
          f"(target <= 5%: {'PASS' if overhead_ok else 'FAIL'})")
    print(f"release step          : {res['release_s_lifeboat'] * 1e3:.1f} ms with LifeboatCache vs "
          f"{res['release_s_baseline'] * 1e3:.1f} ms without ({res['release_delta_vs_decode'] * 100:.2f}% of decode)")
    print(f"greedy tokens identical (cold / restored / baseline): {res['tokens_identical']}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    return 0 if speed_ok and overhead_ok and res["tokens_identical"] else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    raise SystemExit(main())
