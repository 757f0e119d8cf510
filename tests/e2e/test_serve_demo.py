"""`scripts/serve_demo.sh`'s program, as a user runs it: a real SGLang server restarted on one store.

Under `stress` (scripts/stress.sh), not CI: its two server launches (~150 s) repeat the path CI already
drives through SGLang in tests/e2e/test_sglang_server.py (a server restarted on its store restores the
prompt, answers identical), which asserts more of it; this test adds the demo's own printing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("sglang.launch_server", reason="SGLang 0.5.23 is not installed")
pytest.importorskip("uvloop", reason="the SGLang server's packages are not installed (requirements/test.txt)")

pytestmark = [pytest.mark.slow, pytest.mark.stress]


def test_serve_demo_restores_the_prompt_after_a_restart(tmp_path: Path) -> None:
    config = tmp_path / "lifeboat.yaml"
    config.write_text(yaml.safe_dump({"storage": [{"type": "local", "path": str(tmp_path / "store")}]}))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "LIFEBOAT_CONFIG": str(config)}
    out = subprocess.run([sys.executable, "-m", "lifeboat_cache.demo.serve_restart", "--copies", "1",
                          "--max-new-tokens", "8", "--log-dir", str(tmp_path / "logs")],
                         capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    text = out.stdout
    assert f"store: {config}: local:{tmp_path / 'store'}" in text
    prompt = int(re.search(r"prompt: (\d+) tokens", text).group(1))
    restored = int(re.search(r"restored from LifeboatCache after the restart: (\d+) of (\d+)", text).group(1))
    assert restored == (prompt - 1) // 64 * 64 > 0
    assert "answers identical: True" in text
    hits = float(re.search(r"sglang:storage_prefetch_hit_tokens_total (\d+)", text).group(1))
    assert hits >= restored
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["server-1.log", "server-2.log"]
