"""Several writers on one Ceph bucket at once, each through its own gateway, with `lifeboat gc` beside
them: no acknowledged page lost that nobody evicted, no wrong page, and eviction by one process is a
miss in another, never an error."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import boto3
from harness import FIGURES, PAGE_BYTES, ROOT, STRESS, check, cli, env, start_writer, write_keys

THREADS, PAGES = 3, 96 if STRESS else 40


def _config(tmp: Path, endpoint: str, bucket: str, capacity: str) -> Path:
    p = tmp / f"lifeboat-{uuid.uuid4().hex[:6]}.yaml"
    p.write_text(f"storage:\n  - type: s3\n    bucket: {bucket}\n    prefix: kv/\n    endpoint_url: {endpoint}\n"
                 f"    region: us-east-1\n    capacity: {capacity}\n    refresh_interval_s: 0.5\n"
                 "engine:\n  io_workers: 8\n")
    return p


def _writers_and_gc(cfgs: list[Path], gc_rounds: int) -> set[str]:
    """Both writers at once, `lifeboat gc` run `gc_rounds` times meanwhile; the keys acknowledged."""
    procs = [start_writer(cfg, THREADS, PAGES, close=True) for cfg in cfgs]
    for _ in range(gc_rounds):
        g = cli(cfgs[0], "gc")
        assert g.returncode == 0, g.stdout + g.stderr
    acked: set[str] = set()
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        assert "DONE" in out
        acked |= {line[2:].strip() for line in out.splitlines() if line.startswith("A ")}
    FIGURES.trials += 1
    return acked


def test_two_writers_and_gc_on_one_bucket_lose_no_page(tmp_path: Path, ceph) -> None:
    gw = ceph.gateway()
    try:
        bucket = f"lb-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=gw.endpoint).create_bucket(Bucket=bucket)
        cfgs = [_config(tmp_path, ep, bucket, "1GiB") for ep in (ceph.gateways[0].endpoint, gw.endpoint)]
        acked = _writers_and_gc(cfgs, gc_rounds=2)
        assert len(acked) == THREADS * PAGES  # under capacity: every put acknowledged (both wrote every key)
        keys = write_keys(tmp_path / "keys", sorted(acked), acked)
        for res in check(cfgs[1], keys, copies=2):  # two fresh readers, through the second gateway
            assert res["wrong"] == 0 and res["lost"] == 0, res
            FIGURES.acked_lost += res["lost"]
        v = cli(cfgs[0], "verify")
        assert v.returncode == 0, v.stdout + v.stderr
    finally:
        gw.stop()


def test_eviction_by_gc_and_two_writers_is_misses_never_a_wrong_page(tmp_path: Path, ceph) -> None:
    gw = ceph.gateway()
    try:
        bucket = f"lb-{uuid.uuid4().hex[:12]}"
        s3 = boto3.client("s3", endpoint_url=gw.endpoint)
        s3.create_bucket(Bucket=bucket)
        cap = 24 * PAGE_BYTES  # a few objects: every writer and gc evict while the others write and read
        cfgs = [_config(tmp_path, ep, bucket, f"{cap}B") for ep in (ceph.gateways[0].endpoint, gw.endpoint)]
        acked = _writers_and_gc(cfgs, gc_rounds=3)
        assert acked
        g = cli(cfgs[0], "gc")
        assert g.returncode == 0, g.stdout + g.stderr
        keys = write_keys(tmp_path / "keys", sorted(acked), set())  # evicted pages are expected misses
        for res in check(cfgs[1], keys, copies=2):
            assert res["wrong"] == 0, res  # the checker read every key without an error into it
            assert res["served"] < len(acked)  # eviction happened: some pages are misses now
        listed = s3.list_objects_v2(Bucket=bucket, Prefix="kv/o/").get("Contents", [])
        assert sum(o["Size"] for o in listed) <= cap + 4 * (PAGE_BYTES + 4096), listed  # gc kept the bound
        v = subprocess.run([sys.executable, "-m", "lifeboat_cache.cli", "stats", "--json", "--config", str(cfgs[0])],
                           capture_output=True, text=True, env=env(), cwd=ROOT, timeout=120)
        assert v.returncode == 0, v.stderr
        tier = json.loads(v.stdout)["tiers"][0]
        assert tier["reachable"] and tier["usage_bytes"] <= tier["capacity_bytes"] and "retention" in tier, tier
    finally:
        gw.stop()


