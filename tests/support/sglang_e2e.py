"""Helpers of the end-to-end tests that launch real SGLang servers with LifeboatCache (tests/e2e/)."""

from __future__ import annotations

from pathlib import Path

import yaml

from lifeboat_cache.testing.sglang_server import SGLangServer, cpu_flags, hicache_flags, parse_metrics

PAGE = 64
NEW_TOKENS = 12
ENV = {"LIFEBOAT_STATS_INTERVAL_S": "0.5"}


def whole_pages(prompt_tokens: int) -> int:
    """Tokens SGLang can take from storage: whole pages before the last prompt token (it computes that one)."""
    return (prompt_tokens - 1) // PAGE * PAGE


def write_config(path: Path, storage: list[dict]) -> Path:
    path.write_text(yaml.safe_dump({"storage": storage}))
    return path


def server(model: Path, root: Path, name: str, config: Path, env: dict | None = None, **extra: object) -> SGLangServer:
    """A LifeboatCache server as docs/sglang.md launches one (trace lines on), its log under `root`."""
    flags = cpu_flags(model) + hicache_flags("lifeboat", {"trace": True, **extra})
    env = {**ENV, "LIFEBOAT_CONFIG": str(config), **(env or {})}
    return SGLangServer(flags, log_path=root / f"{name}.log", env=env)


def settle(srv: SGLangServer, pages: int) -> float:
    """Wait until the backups of `pages` pages are written and no more arrive (observable, not a sleep)."""
    return srv.wait_metric("lifeboat_pages_written_total", pages, settle_s=2.0, timeout=120)


def tier_reads(srv: SGLangServer, prefix: str) -> float:
    """Pages the server's store read from tiers whose name starts with `prefix` (its /metrics)."""
    return sum(v for n, lab, v in parse_metrics(srv.metrics_text())
               if n == "lifeboat_pages_read_total" and lab.get("tier", "").startswith(prefix))
