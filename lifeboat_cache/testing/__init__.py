"""Test kit shipped with the package: the tier conformance suite and reference tiers for tier
implementers, and the launchers of the real servers the tests and the bench drive.

  tiers.py          TierTests: the conformance suite every tier's tests share (declared capabilities too)
  memory.py         MemoryTier: the reference tier
  faults.py         FaultyTier: injected EIO and latency
  child_process.py  ports below the kernel's ephemeral range, the child pre-exec (own session, dies with
                    its parent): what every launched server needs
  s3_server.py      MotoS3Server: the one moto launcher (test fixtures, bench S3 sections)
  ceph_rgw.py       CephCluster: a one-machine Ceph (monitor, memstore OSD) and its RADOS Gateways
  sglang_server.py  SGLangServer: a real `python -m sglang.launch_server` on CPU over HTTP
"""

from __future__ import annotations

from .ceph_rgw import CephCluster, missing_binaries
from .s3_server import start_with_retry
from .sglang_server import (
    FILE_BACKEND_DIR_ENV, SGLangServer, ServerFailed, cpu_flags, hicache_flags, parse_metrics, prompt_ids)

__all__ = [
    "CephCluster", "FILE_BACKEND_DIR_ENV", "SGLangServer", "ServerFailed", "cpu_flags", "hicache_flags",
    "missing_binaries", "parse_metrics", "prompt_ids", "start_with_retry",
]
