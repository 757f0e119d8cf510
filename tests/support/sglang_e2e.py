"""Helpers of the end-to-end tests that launch real SGLang servers with LifeboatCache (tests/e2e/).

Importing this module skips the importing test module where a server cannot start here (SGLang's
server packages or the SmolLM2 weights missing; under CI the conftest turns that skip into a failure),
so each test module imports it before anything of SGLang's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytest.importorskip("sglang.launch_server", reason="SGLang 0.5.23 is not installed")
pytest.importorskip("uvloop", reason="the SGLang server's packages are not installed (requirements/test.txt)")

from lifeboat_cache.demo.smollm2 import locate_gguf  # noqa: E402

try:
    locate_gguf()
except FileNotFoundError as e:  # pragma: no cover - the CI conftest turns skips into failures
    pytest.skip(str(e), allow_module_level=True)
from lifeboat_cache.testing.sglang_server import SGLangServer, cpu_flags, hicache_flags, parse_metrics  # noqa: E402

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
