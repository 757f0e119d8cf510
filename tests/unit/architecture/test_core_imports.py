"""The core must not import any runtime: SGLang, torch, MLX and boto3 are optional extras."""

from __future__ import annotations

import subprocess
import sys

BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('sglang', 'torch', 'mlx', 'mlx_lm', 'boto3', 'botocore'):
            raise ImportError('blocked for this test: ' + name)
sys.meta_path.insert(0, Block())
import lifeboat_cache.store, lifeboat_cache.tiers.local, lifeboat_cache.tiers.nfs, lifeboat_cache.cli
import lifeboat_cache.integrations.launch.rules
from lifeboat_cache import ChunkStore, load_settings, namespace_fingerprint
print('ok')
"""


def test_core_imports_without_runtimes():
    r = subprocess.run([sys.executable, "-c", BLOCKER], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"
