"""Plans of serving steps for SGLang's real MLX classes, each plan in a fresh process (a server lifetime).

The serving loop itself, :class:`MlxServing` (SGLang's MLX scheduler pieces driven in the scheduler's
order, one request at a time, on Linux CPU too), is ``mlx_serving_loop``'s; it is re-exported here.
A plan (:func:`run_plan`) runs in a process of its own (:func:`run_plan_process`,
``python -m lifeboat_cache.demo.mlx_serving plan.json``), because MlxServing sets ``SGLANG_USE_MLX=1``
and ``LIFEBOAT_CACHE=1`` in its process's environment as a launch would. Product code (the demo and
the bench run on it), not a test helper: see docs/architecture.md, "Where the demo and its serving
loop live".
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from ..config import parse_log_level
from ..runtimes.mlx import DEFAULT_BLAS, ENV_BLAS_PRELOAD, parse_blas_preload
from .mlx_serving_loop import MlxServing

__all__ = ["child_env", "main", "run_plan", "run_plan_process"]

log = logging.getLogger(__name__)


def _ids(step: dict[str, Any], prompts: dict[str, list[int]]) -> list[int]:
    ids = step.get("ids")
    if isinstance(ids, str):
        return prompts[ids]
    return [int(t) for t in ids]


def run_plan(plan: dict[str, Any]) -> dict[str, Any]:
    """Run a JSON plan of serving steps in this (fresh) process; returns JSON-able results.

    Tests and benchmarks start one process per plan, so each plan is one "server lifetime":
    ``{"model": dir, "lifeboat": true, "pool_size": 4096, "prompts": {name: [ids]}, "out": dir,
    "steps": [{"op": "generate", "name": ..., "ids": name-or-list, "max_new_tokens": 8,
    "save_rows": n_tokens, "extra_key": ..., "cache_salt": ...}, {"op": "flush"},
    {"op": "reset_tree"}, {"op": "arrive", "ids": ..., "rid": ...}, {"op": "stats"}]}``.
    Raises ValueError for an unknown op, KeyError for a missing field.
    """
    import json
    from pathlib import Path

    out_dir = Path(plan["out"]) if plan.get("out") else None
    serving = MlxServing(plan["model"], lifeboat=plan.get("lifeboat", True),
                         pool_size=int(plan.get("pool_size", 4096)), warmup=bool(plan.get("warmup", False)),
                         named=bool(plan.get("named", False)), hicache=bool(plan.get("hicache", False)))
    prompts = {k: [int(t) for t in v] for k, v in (plan.get("prompts") or {}).items()}
    results: dict[str, Any] = {"backend": serving.backend, "cache_class": type(serving.cache).__name__,
                               "steps": {}}
    if serving.engine is not None:
        results["namespace"] = serving.engine.ns.hex()
        results["state_namespace"] = serving.engine.state_ns.hex()
        hybrid = getattr(serving.cache, "hybrid", None)
        results["state_bytes"] = hybrid.nbytes if hybrid is not None else 0
    for i, step in enumerate(plan.get("steps", [])):
        op = step["op"]
        name = step.get("name", f"{op}{i}")
        if op == "generate":
            r = serving.generate(_ids(step, prompts), int(step.get("max_new_tokens", 8)), rid=step.get("rid"),
                                 extra_key=step.get("extra_key"), cache_salt=step.get("cache_salt"))
            rec = dict(r.__dict__)
            if step.get("save_rows") and out_dir is not None and r.aborted is None:
                k, v = serving.tree_kv_rows(_ids(step, prompts), int(step["save_rows"]))
                np.save(out_dir / f"{name}_k.npy", k)
                np.save(out_dir / f"{name}_v.npy", v)
            results["steps"][name] = rec
        elif op == "arrive":
            results["steps"][name] = {"refused": serving.arrive(_ids(step, prompts), step["rid"])}
        elif op == "abort":
            serving.abort(step["rid"])
        elif op == "flush":
            results["steps"][name] = {"flushed": serving.flush()}
        elif op == "reset_tree":
            serving.reset_tree()
        elif op == "stats":
            results["steps"][name] = serving.engine.stats() if serving.engine is not None else {}
        else:
            raise ValueError(f"unknown plan op {op!r}")
    serving.flush()  # the writer's queue drained first, so the stats count what reached the store
    if serving.engine is not None:
        results["stats"] = serving.engine.stats()
    serving.close()
    if out_dir is not None:
        (out_dir / "results.json").write_text(json.dumps(results))
    return results


def child_env(base: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    """Environment for a plan process: OpenBLAS preloaded on Linux (MLX's CPU wheel ships a reference
    BLAS ~30x slower for fp32 GEMM), plus ``extra`` (e.g. ``XDG_CACHE_HOME`` for an isolated store).

    Raises ConfigError when ``LIFEBOAT_BLAS_PRELOAD`` names a file that does not exist."""
    import sys

    env = dict(os.environ if base is None else base)
    lib = parse_blas_preload(env) or DEFAULT_BLAS
    if sys.platform.startswith("linux") and os.path.exists(lib):
        parts = [p for p in env.get("LD_PRELOAD", "").split() if p and p != lib]
        env["LD_PRELOAD"] = " ".join([lib, *parts])
        env[ENV_BLAS_PRELOAD] = lib
    env.update(extra)
    return env


def run_plan_process(plan: dict[str, Any], env: dict[str, str], timeout: float = 600.0) -> dict[str, Any]:
    """Run a plan in a fresh Python process (a server lifetime); raise with its output if it fails."""
    import json
    import subprocess
    import sys
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(plan, f)
        path = f.name
    try:
        proc = subprocess.run([sys.executable, "-m", "lifeboat_cache.demo.mlx_serving", path],
                              env=env, capture_output=True, text=True, timeout=timeout)
    finally:
        os.unlink(path)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("LIFEBOAT_RESULTS "):
            if proc.returncode == 0:
                return json.loads(line[len("LIFEBOAT_RESULTS "):])
    raise RuntimeError(f"plan process failed (rc={proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")


def main(argv: list[str] | None = None) -> int:
    """``python -m lifeboat_cache.demo.mlx_serving plan.json``: run a plan, print its results."""
    import json
    import sys

    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=parse_log_level(os.environ),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with open(args[0]) as f:
        plan = json.load(f)
    results = run_plan(plan)
    print("LIFEBOAT_RESULTS " + json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
