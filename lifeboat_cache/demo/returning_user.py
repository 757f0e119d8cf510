"""The returning-user demo: the same long prompt answered by two fresh processes.

Visit 1 is a fresh process that answers a long chat prompt (two public-domain documents and a
question) with SmolLM2-135M-Instruct through SGLang's MLX runner and LifeboatCache's ``lifeboat``
radix-cache backend, then exits. Its finished request's 64-token chunks are written to the embedded
default store (``~/.cache/lifeboat``). Visit 2 is another fresh process (nothing in memory) that
answers the same prompt: its prefix comes back from the store instead of being recomputed.

The demo prints, for both visits, the cached tokens and the time to first token, and whether the two
answers are identical. Each demo run uses a new ``cache_salt`` (SGLang's per-tenant cache
partition), so visit 1 is cold even when the store already holds an earlier run; ``--salt`` reuses one.

SGLang's MLX server refuses to start without an Apple Metal device, so each visit drives SGLang's
MLX classes directly, in the scheduler's order (``lifeboat_cache.testing.mlx_serving``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import texts

log = logging.getLogger(__name__)

RESULT_PREFIX = "LIFEBOAT_DEMO "


def chat_token_ids(model_dir: str | Path, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of a chat as the model's own chat template renders it (with the assistant turn open)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tok.encode(text, add_special_tokens=False))


def decode(model_dir: str | Path, ids: list[int]) -> str:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir)).decode(ids, skip_special_tokens=True)


def visit(model_dir: str, salt: str, max_new_tokens: int) -> dict[str, Any]:
    """One visit, in this process: serve the prompt once, flush the store, report."""
    from ..testing.mlx_serving import MlxServing

    t0 = time.perf_counter()
    serving = MlxServing(model_dir, lifeboat=True, warmup=True)
    startup_s = time.perf_counter() - t0
    ids = chat_token_ids(model_dir, texts.returning_user_messages())
    r = serving.generate(ids, max_new_tokens, cache_salt=salt)
    flushed = serving.flush()
    stats = serving.engine.stats() if serving.engine is not None else {}
    serving.close()
    return {"prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens, "ttft_s": r.ttft_s,
            "decode_s": r.decode_s, "output_ids": r.output_ids, "answer": decode(model_dir, r.output_ids),
            "startup_s": startup_s, "flushed": flushed, "backend": serving.backend,
            "chunks_written": stats.get("mlx_chunks_written", 0), "stats": stats}


def _child_env() -> dict[str, str]:
    from ..testing.mlx_serving import child_env

    env = child_env(LIFEBOAT_CACHE="1", PYTHONWARNINGS="ignore")
    env.setdefault("LIFEBOAT_LOG_LEVEL", "ERROR")
    return env


def _run_visit(model_dir: Path, salt: str, max_new_tokens: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "lifeboat_cache.demo", "visit", "--model", str(model_dir), "--salt", salt,
           "--max-new-tokens", str(max_new_tokens)]
    proc = subprocess.run(cmd, env=_child_env(), capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_PREFIX) and proc.returncode == 0:
            return json.loads(line[len(RESULT_PREFIX):])
    sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
    raise SystemExit(f"the visit process failed (exit {proc.returncode})")


def run_demo(salt: str | None, max_new_tokens: int, dtype: str) -> int:
    from ..config import default_cache_dir
    from .smollm2 import ensure_model

    model_dir = ensure_model(dtype=dtype)
    salt = salt or secrets.token_hex(4)
    print("LifeboatCache returning-user demo (SGLang MLX backend, --radix-cache-backend lifeboat)")
    print(f"  model : SmolLM2-135M-Instruct ({dtype}), {model_dir}")
    print(f"  store : embedded default, {default_cache_dir()}")
    print(f"  salt  : {salt} (new per run so visit 1 starts cold; --salt {salt} reuses it)")
    print()
    visits = []
    for n, label in ((1, "first visit (fresh process, cold)"), (2, "returning user (fresh process)")):
        print(f"visit {n}: {label} ...", flush=True)
        v = _run_visit(model_dir, salt, max_new_tokens)
        visits.append(v)
        print(f"  prompt tokens {v['prompt_tokens']}, cached tokens {v['cached_tokens']}, "
              f"time to first token {v['ttft_s'] * 1e3:.0f} ms")
        print(f"  answer: {v['answer'].strip()}")
        print()
    first, second = visits
    same = first["output_ids"] == second["output_ids"]
    speedup = first["ttft_s"] / second["ttft_s"] if second["ttft_s"] > 0 else float("inf")
    print(f"cached tokens     : {first['cached_tokens']} -> {second['cached_tokens']} "
          f"of {second['prompt_tokens']}")
    print(f"time to 1st token : {first['ttft_s'] * 1e3:.0f} ms -> {second['ttft_s'] * 1e3:.0f} ms "
          f"({speedup:.1f}x faster)")
    print(f"answers identical : {'yes' if same else 'NO'}")
    return 0 if same and second["cached_tokens"] > 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lifeboat_cache.demo", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd")
    v = sub.add_parser("visit", help="one visit in this process (used by the demo)")
    v.add_argument("--model", required=True)
    v.add_argument("--salt", required=True)
    v.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--salt", default=None, help="cache salt shared by both visits (default: random)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                        help="model dtype (float32 is the fast one on Linux CPU with OpenBLAS)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("LIFEBOAT_LOG_LEVEL", "WARNING"),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.cmd == "visit":
        result = visit(args.model, args.salt, args.max_new_tokens)
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return 0
    return run_demo(args.salt, args.max_new_tokens, args.dtype)
