"""Two real SGLang 0.5.23 servers (`python -m sglang.launch_server`, CPU) on one LifeboatCache store.

Server A (own local tier + a shared directory tier + S3) answers a >= 1,500-token prompt and copies its
pages down. While A runs: server B (own local tier + the shared directory) gets A's prefix from the
shared tier, and server C (own local tier + the same bucket) from S3, beside a `lifeboat gc` of A's
store; every answer is token for token A's, and A is unharmed afterwards. C is started on a port a
squatter holds first, as when another process takes it in CI: the launcher must relaunch elsewhere.

The S3 server is Ceph's RADOS Gateway (a real distributed object store over HTTP). The same S3 tier runs
against moto's server as well in tests/integration (test_s3_tier.py, test_s3_faults.py); here a second
S3 server would cost three more server launches (~5 min of CI) for the same path through SGLang. Kept
in its own module so the session-wide S3 fixture's ordering never splits test_sglang_server.py, whose
module fixture (three server launches) would then be built again.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from support.sglang_e2e import (  # skips without a server
    NEW_TOKENS, PAGE, server, settle, tier_reads, whole_pages, write_config)

from lifeboat_cache.demo.smollm2 import ensure_model
from lifeboat_cache.testing.child_process import LOOPBACK
from lifeboat_cache.testing.sglang_server import prompt_ids

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("s3_endpoint", ["ceph"], indirect=True)
def test_second_server_gets_the_prefix_from_the_shared_tier_and_from_s3(tmp_path: Path, s3_endpoint: str) -> None:
    import boto3

    model = ensure_model(dtype="float32", layout="hf")
    bucket = "lifeboat-two-servers"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    shared = {"type": "nfs", "path": str(tmp_path / "shared")}
    s3 = {"type": "s3", "bucket": bucket, "prefix": "kv/", "endpoint_url": s3_endpoint}
    ids = prompt_ids(model, 1600, salt="returning user P")
    a_cfg = write_config(tmp_path / "a.yaml", [{"type": "local", "path": str(tmp_path / "a")}, shared, s3])
    b_cfg = write_config(tmp_path / "b.yaml", [{"type": "local", "path": str(tmp_path / "b")}, shared])
    c_cfg = write_config(tmp_path / "c.yaml", [{"type": "local", "path": str(tmp_path / "c")}, s3])
    pages = len(ids) // PAGE
    with server(model, tmp_path, "a", a_cfg) as a:
        cold = a.generate(ids, NEW_TOKENS)
        assert cold.storage_tokens == 0 and cold.output_ids, cold.cached_details
        settle(a, pages)
        a.wait_metric("lifeboat_pages_copied_down_total", 2 * pages, settle_s=2.0, timeout=120)  # shared + S3
        with server(model, tmp_path, "b", b_cfg) as b:  # while A still runs
            got = b.generate(ids, NEW_TOKENS)
            assert got.storage_tokens == whole_pages(len(ids)), got.cached_details
            assert got.output_ids == cold.output_ids
            b.wait_metric("lifeboat_pages_read_total", pages - 1, timeout=30)
            assert tier_reads(b, "nfs") >= whole_pages(len(ids)) // PAGE
        c = server(model, tmp_path, "c", c_cfg)  # while A still runs: two servers on one bucket
        # The port taken before SGLang binds it, as in a CI run where a socket of another process got it
        # first (one that accepts and never answers HTTP): the launcher must notice and relaunch elsewhere.
        taken = c.port
        with socket.socket() as squatter:
            squatter.bind((LOOPBACK, taken))
            squatter.listen()
            c.start()
        assert c.port != taken and "address already in use" in c.log_path.read_text(errors="replace")
        with c:  # and a `lifeboat gc` of A's store beside both
            gc = subprocess.Popen([sys.executable, "-m", "lifeboat_cache.cli", "gc", "--config", str(a_cfg)],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            got = c.generate(ids, NEW_TOKENS)
            assert got.storage_tokens == whole_pages(len(ids)), got.cached_details
            assert got.output_ids == cold.output_ids
            c.wait_metric("lifeboat_pages_read_total", pages - 1, timeout=30)
            assert tier_reads(c, "s3") >= whole_pages(len(ids)) // PAGE
            out, _ = gc.communicate(timeout=120)
            assert gc.returncode == 0, out
        assert a.generate(ids, NEW_TOKENS).output_ids == cold.output_ids  # A unharmed by C and the gc
