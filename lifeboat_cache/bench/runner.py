"""Run the sections in order, keep going when one fails (its error is recorded and the exit status is 1),
then write the report."""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from .common import available_bytes, log, machine, release_memory
from .sizes import SECTIONS, Sizes, make, names


def _section(name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    t = time.perf_counter()
    log.info("section %s ...", name)
    try:
        out = fn()
        out.setdefault("status", "ok")
    except Exception as e:  # noqa: BLE001 - one failed section must not lose the others
        log.error("section %s failed: %s", name, e)
        out = {"status": "error", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
    out["elapsed_s"] = time.perf_counter() - t
    out["bench_rss_gib_after"] = round(release_memory() / 2**30, 2)
    out["mem_available_gib_after"] = round(available_bytes() / 2**30, 2)
    log.info("section %s: %s in %.1f s (after it: bench process %.2f GiB resident, %.1f GiB available)", name,
             out["status"], out["elapsed_s"], out["bench_rss_gib_after"], out["mem_available_gib_after"])
    return out


def run_all(out: Path, work: Path, sizes: Sizes, quick: bool, only: list[str]) -> dict[str, Any]:
    from . import (busy_tier, ceilings, compression, interference, mlx, realkv, retention, s3, sealing, server,
                   serving, sglang_vs_file)
    from .adapters import call_run

    t0 = time.perf_counter()
    res: dict[str, Any] = {"machine": machine(), "quick": quick, "sizes": sizes.__dict__, "sections": {}}
    kv: dict[str, Any] = {}

    def real() -> dict[str, Any]:
        kv["bytes"] = realkv.load_or_make(Path.home() / ".cache" / "lifeboat" / "bench", sizes.realkv_tokens)
        return {"tokens": sizes.realkv_tokens, "bytes": int(kv["bytes"].nbytes),
                "source": "SmolLM2-135M-Instruct K/V on the demo texts, bf16"}

    if {"ceilings", "sglang_vs_file", "sealing", "compression"} & set(only):
        res["real_kv"] = _section("real_kv", real)
    sample = kv.get("bytes")
    plan: dict[str, Callable[[], dict[str, Any]]] = {
        "ceilings": lambda: ceilings.run(work, sizes, sample),
        "sglang_vs_file": lambda: sglang_vs_file.run(
            work, sizes if sample is not None else _no_real(sizes), sample),
        "sealing": lambda: sealing.run(work, sizes, sample),
        "index_scale": lambda: call_run("lifeboat_cache.bench.index_scale", work=work, root=work, quick=quick,
                                        sizes=[int(x) for x in sizes.index_pages.split(",")],
                                        pages=[int(x) for x in sizes.index_pages.split(",")]),
        "compression": lambda: compression.run(work, sizes, sample),
        "retention": lambda: retention.run(work, sizes, quick),
        "interference": lambda: interference.run(work, sizes, quick),
        "busy_tier": lambda: busy_tier.run(work, sizes, quick),
        "s3": lambda: s3.run(work, sizes, quick),
        "mlx": lambda: mlx.run(work, sizes),
        "server": lambda: server.run(work, sizes),
        "serving": lambda: serving.run(work, sizes),
    }
    for name in SECTIONS:
        if name in only:
            work.mkdir(parents=True, exist_ok=True)
            res["sections"][name] = _section(name, plan[name])
            shutil.rmtree(work, ignore_errors=True)
            _partial(res, out)
        else:
            res["sections"][name] = {"status": "skipped", "reason": "not in --only"}
    res["elapsed_s"] = time.perf_counter() - t0
    return res


def _partial(res: dict[str, Any], out: Path) -> None:
    """results.json after every section, so an interrupted run keeps what it measured."""
    import json

    from .report import json_default

    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({**res, "partial": True}, indent=1, default=json_default))


def _no_real(sizes: Sizes) -> Sizes:
    """Without real KV (MLX failed), the real-KV cases are left out rather than mislabelled."""
    from dataclasses import replace

    kinds = ",".join(k for k in names(sizes.kinds) if k != "real") or "random"
    return replace(sizes, kinds=kinds)


def main(args: argparse.Namespace) -> int:
    logging.getLogger("lifeboat.bench").setLevel(logging.INFO)
    if not logging.getLogger().handlers:
        logging.basicConfig(format="%(asctime)s %(message)s")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s bench: %(message)s", "%H:%M:%S"))
    log.addHandler(handler)
    log.propagate = False
    try:
        sizes = make(args.quick, args.size)
    except ValueError as e:
        print(f"lifeboat bench: {e}", file=sys.stderr)
        return 2
    only = names(args.only)
    bad = [s for s in only if s not in SECTIONS]
    if bad:
        print(f"lifeboat bench: --only {','.join(bad)}: unknown section; choose from {', '.join(SECTIONS)}",
              file=sys.stderr)
        return 2
    out = Path(args.out)
    work = Path(args.work_dir) if args.work_dir else out / "work"
    res = run_all(out, work, sizes, args.quick, only)
    from .report import write

    md, pngs = write(res, out)
    print(md)
    print(f"results: {out / 'results.json'}, {out / 'results.md'}, plots: {', '.join(p.name for p in pngs)}")
    failed = [n for n, s in res["sections"].items() if s.get("status") == "error"]
    failed += [f"{n}.rebuild" for n, s in res["sections"].items()
               if isinstance(s.get("rebuild"), dict) and s["rebuild"].get("status") == "error"]
    if res.get("real_kv", {}).get("status") == "error":
        failed.append("real_kv")
    if failed:
        print(f"lifeboat bench: sections failed: {', '.join(failed)} (see results.json)", file=sys.stderr)
        return 1
    return 0
