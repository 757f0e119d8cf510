"""The returning-user demo: the same long prompt answered by two fresh processes.

Visit 1 is a fresh process that answers a long chat prompt (two public-domain documents and a
question) with SmolLM2-135M-Instruct through SGLang's MLX runner and LifeboatCache's ``lifeboat``
radix-cache backend, then exits. Its finished request's 64-token chunks are written to the store
that ``lifeboat.yaml`` configures (the usual lookup; without one, the embedded default store under
``~/.cache/lifeboat``). Visit 2 is another fresh process (nothing in memory) that answers the same
prompt: its prefix comes back from the store instead of being recomputed.

The demo prints the store it actually uses, then for both visits the cached tokens, the time to first
token and what happened (cold: computed; warm: restored from the store), whether the two answers are
identical, and at the end the disk it used and how to remove it. Each demo run uses a new
``cache_salt`` (SGLang's per-tenant cache partition), so visit 1 is cold even when the store already
holds an earlier run; ``--salt`` reuses one, and then visit 1 is warm too (and labelled so).

SGLang's MLX server refuses to start without an Apple Metal device, so each visit drives SGLang's
MLX classes directly, in the scheduler's order (``lifeboat_cache.demo.mlx_serving``).
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
    from .mlx_serving_loop import MlxServing

    t0 = time.perf_counter()
    serving = MlxServing(model_dir, lifeboat=True, warmup=True)
    startup_s = time.perf_counter() - t0
    ids = chat_token_ids(model_dir, texts.returning_user_messages())
    r = serving.generate(ids, max_new_tokens, cache_salt=salt)
    flushed = serving.flush()
    stats = serving.engine.stats() if serving.engine is not None else {}
    stored_bytes = serving.engine.store.counters.get("bytes_written_stored") if serving.engine is not None else 0
    serving.close()
    return {"prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens, "ttft_s": r.ttft_s,
            "decode_s": r.decode_s, "output_ids": r.output_ids, "answer": decode(model_dir, r.output_ids),
            "startup_s": startup_s, "flushed": flushed, "backend": serving.backend,
            "chunks_written": stats.get("mlx_chunks_written", 0), "stored_bytes": stored_bytes, "stats": stats}


def _child_env() -> dict[str, str]:
    from .mlx_serving import child_env

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


def outcome(v: dict[str, Any]) -> str:
    """What happened in a visit, from what it reports (not from its position in the demo)."""
    if v["cached_tokens"] <= 0:
        return "cold: the whole prompt was computed"
    return f"warm: {v['cached_tokens']} of {v['prompt_tokens']} prompt tokens restored from the store"


def describe_store(settings: Any) -> str:
    """The store the visits open: the config's source and each tier's place."""
    where = []
    for ts in settings.storage:
        if ts.paths:
            where.append(f"{ts.type} {', '.join(str(p) for p in ts.paths)}")
        else:
            where.append(f"{ts.type} s3://{ts.bucket}/{ts.prefix}")
    source = settings.source
    if Path(source).is_file():
        source = str(Path(source).resolve())
    return f"{source}: {'; '.join(where)}"


def disk_bytes(path: Path, exclude: Path | None = None) -> int:
    """Bytes of the files under ``path`` (``exclude``'s subtree left out); 0 when it does not exist."""
    total = 0
    for root, dirs, files in os.walk(path):
        if exclude is not None:
            dirs[:] = [d for d in dirs if Path(root, d) != exclude]
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                continue
    return total


def _mb(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def run_demo(salt: str | None, max_new_tokens: int, dtype: str) -> int:
    from ..config import load_settings
    from .smollm2 import ensure_model

    settings = load_settings()  # the same lookup as each visit's process (same directory and environment)
    model_dir = ensure_model(dtype=dtype)
    fresh_salt = salt is None
    salt = salt or secrets.token_hex(4)
    print("LifeboatCache returning-user demo (SGLang MLX backend, --radix-cache-backend lifeboat)")
    print(f"  model : SmolLM2-135M-Instruct ({dtype}), {model_dir}")
    print(f"  store : {describe_store(settings)}")
    print(f"  salt  : {salt} " + ("(new for this run, so visit 1 starts cold; --salt " + salt + " reuses it)"
                                  if fresh_salt else "(given: visit 1 is warm if an earlier run used it)"))
    print()
    visits = []
    for n, label in ((1, "first visit (fresh process)"), (2, "returning user (fresh process)")):
        print(f"visit {n}: {label} ...", flush=True)
        v = _run_visit(model_dir, salt, max_new_tokens)
        visits.append(v)
        print(f"  {outcome(v)}")
        print(f"  prompt tokens {v['prompt_tokens']}, cached tokens {v['cached_tokens']}, "
              f"time to first token {v['ttft_s'] * 1e3:.0f} ms")
        print(f"  answer: {v['answer'].strip()}")
        print()
    first, second = visits
    same = first["output_ids"] == second["output_ids"]
    print(f"cached tokens     : {first['cached_tokens']} -> {second['cached_tokens']} "
          f"of {second['prompt_tokens']}")
    ttft = f"{first['ttft_s'] * 1e3:.0f} ms -> {second['ttft_s'] * 1e3:.0f} ms"
    if first["cached_tokens"] == 0 and second["cached_tokens"] > 0 and second["ttft_s"] > 0:
        ttft += f" ({first['ttft_s'] / second['ttft_s']:.1f}x faster restored than computed)"
    elif first["cached_tokens"] > 0:
        ttft += " (both visits were warm, so there is no cold time to compare; run without --salt)"
    print(f"time to 1st token : {ttft}")
    print(f"answers identical : {'yes' if same else 'NO'}")
    print_disk_use(settings, model_dir, sum(v["stored_bytes"] for v in visits))
    return 0 if same and second["cached_tokens"] > 0 else 1


def print_disk_use(settings: Any, model_dir: Path, run_bytes: int) -> None:
    """How much disk the demo used and how to remove it."""
    model = disk_bytes(model_dir)
    print()
    print(f"disk used         : model {_mb(model)} in {model_dir}")
    print(f"                    KV chunks written by this run {_mb(run_bytes)}")
    local = [p for ts in settings.storage for p in ts.paths]
    for p in local:
        inside = " (besides the model)" if model_dir.is_relative_to(p) else ""
        print(f"                    store {p} now holds {_mb(disk_bytes(p, exclude=model_dir.parent))}{inside}")
    print("to remove it      : rm -rf " + str(model_dir) + "   (the model; the next demo run rebuilds it)")
    if local:
        also = " and the model" if any(model_dir.is_relative_to(p) for p in local) else ""
        print("                    rm -rf " + " ".join(str(p) for p in local)
              + f"   (every cached chunk in this store, of every model{also}: stop servers using it first)")
    if any(not ts.paths for ts in settings.storage):
        print("                    S3 tiers keep their objects under the configured bucket/prefix")


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
    from ..config import ConfigError
    from ..config import parse_log_level

    try:
        level = parse_log_level(os.environ)
    except ConfigError as e:
        print(f"lifeboat demo: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=level,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.cmd == "visit":
        result = visit(args.model, args.salt, args.max_new_tokens)
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return 0
    return run_demo(args.salt, args.max_new_tokens, args.dtype)
