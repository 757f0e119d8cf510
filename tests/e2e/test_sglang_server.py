"""LifeboatCache inside a real SGLang 0.5.23 server: `python -m sglang.launch_server` over HTTP, on CPU.

What a user does, with nothing of SGLang stubbed: the server is launched as docs/sglang.md says
(`--hicache-storage-backend dynamic` + the LifeboatCache extra config, the store in `lifeboat.yaml`
through `LIFEBOAT_CONFIG`), answers `/generate`, is stopped (SIGTERM) or crashed (SIGKILL of every
process) and started again on the same store. Proven:

* restart: the same >= 1,500-token prompt comes back from storage (`cached_tokens_details.storage`
  = every whole page before the last token), greedy tokens identical to the cold run, SGLang's
  `/metrics` shows the L3 prefetch hits and our `lifeboat_*` counters show the reads;
* crash: SIGKILL right after an answer, while its backups are in flight: every page the store
  acknowledged (`batch_set_v1 ... -> N` trace lines) is on disk and verifies, the restarted server
  answers correctly (same tokens), and whatever was stored is reused;
* two servers, one store: in test_sglang_shared_servers.py;
* bad input at the server: a broken lifeboat.yaml and a read-only store directory stop the launch
  in seconds with file, key and fix; a hung S3 endpoint at start costs misses, never a hang or a
  wrong token.

float32 (see `cpu_flags`). `--tp 2` is not here: SGLang 0.5.23's generic CPU path builds a PyNccl
communicator for every TP group (`distributed/parallel_state.py:2185`, then
`device_communicators/pynccl.py:116`: "Expected a cuda device, but got: cpu"); per-rank keys are
proven at class level (tests/integration/test_sglang_backend.py).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.sglang_e2e import NEW_TOKENS, PAGE, server, settle, whole_pages, write_config  # skips without a server

from lifeboat_cache.demo.smollm2 import ensure_model
from lifeboat_cache.testing.sglang_server import ServerFailed, SGLangServer, parse_metrics, prompt_ids
from lifeboat_cache.tiers.segments.snapshot_file import SNAPSHOT_NAME

pytestmark = pytest.mark.slow
_ACK = re.compile(r"lifeboat trace: batch_set_v1 (\d+) keys -> (\d+)")


@pytest.fixture(scope="module")
def model() -> Path:
    return ensure_model(dtype="float32", layout="hf")


def acknowledged(log_path: Path) -> int:
    """Pages this server's store acknowledged to SGLang (its `batch_set_v1` trace lines)."""
    return sum(int(m.group(2)) for m in _ACK.finditer(log_path.read_text(errors="replace")))


def verify(config: Path) -> int:
    """`lifeboat verify` on the store (no server running): the record count; fails on any bad record."""
    out = subprocess.run([sys.executable, "-m", "lifeboat_cache.cli", "verify", "--config", str(config), "--quiet"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return int(re.search(r"verified (\d+) records: 0 bad", out.stdout).group(1))


# ------------------------------------------------------------------------------------------------
# Restart (SIGTERM) and crash (SIGKILL) on one store
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lifecycle(model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("sglang-server")
    config = write_config(root / "lifeboat.yaml", [{"type": "local", "path": str(root / "store")}])
    p_ids, q_ids = prompt_ids(model, 1600, salt="returning user P"), prompt_ids(model, 3000, salt="crash Q")
    out: dict = {"root": root, "config": config, "P": p_ids, "Q": q_ids}

    a = server(model, root, "a", config)
    with a:
        out["cold_P"] = a.generate(p_ids, NEW_TOKENS)
        out["pages_A"] = settle(a, len(p_ids) // PAGE)
    out["closed_A"] = "lifeboat: store closed" in a.log_path.read_text(errors="replace")
    out["snapshot_after_A"] = (root / "store" / SNAPSHOT_NAME).exists()
    out["records_A"] = verify(config)

    b = server(model, root, "b", config)
    b.start()
    try:
        out["warm_P"] = b.generate(p_ids, NEW_TOKENS)
        out["log_B"] = b.log_path.read_text(errors="replace")
        out["metrics_B"] = b.metrics_text()
        b.wait_metric("lifeboat_hits_total", 1, timeout=30)  # the read reached our counters too
        out["metrics_B_after_tick"] = b.metrics_text()
        # any backup of P's last page (recomputed; A stored its key already) is done before Q is sent
        b.wait_metric("lifeboat_pages_written_total", 0, settle_s=1.5, timeout=60)
        acked_before_q = acknowledged(b.log_path)
        out["cold_Q"] = b.generate(q_ids, NEW_TOKENS)
    finally:
        b.kill()  # SIGKILL of every process right after the answer: Q's backups are in flight
    out["acked_Q"] = acknowledged(b.log_path) - acked_before_q  # Q's pages: keys no one stored before
    out["records_after_kill"] = verify(config)

    c = server(model, root, "c", config)
    with c:
        out["after_kill_Q"] = c.generate(q_ids, NEW_TOKENS)
        out["after_kill_P"] = c.generate(p_ids, NEW_TOKENS)
    return out


def test_restart_serves_the_prompt_from_lifeboat(lifecycle: dict) -> None:
    cold, warm = lifecycle["cold_P"], lifecycle["warm_P"]
    assert cold.prompt_tokens == len(lifecycle["P"]) >= 1500
    assert cold.cached_tokens == 0
    assert lifecycle["pages_A"] >= len(lifecycle["P"]) // PAGE
    assert lifecycle["records_A"] >= len(lifecycle["P"]) // PAGE
    assert warm.storage_tokens == whole_pages(cold.prompt_tokens), warm.cached_details
    assert warm.cached_details.get("device", 0) == 0 and warm.cached_details.get("host", 0) == 0
    assert warm.output_ids == cold.output_ids and len(warm.output_ids) == NEW_TOKENS


def test_sigterm_closes_the_store(lifecycle: dict) -> None:
    """SGLang 0.5.23 never closes its storage backend on a graceful shutdown; the store closes itself when
    the scheduler process exits: segments sealed and the index snapshot saved, so the next server loads
    the snapshot instead of scanning, and finds no orphan segment to adopt."""
    assert lifecycle["closed_A"] and lifecycle["snapshot_after_A"]
    assert "loaded index snapshot" in lifecycle["log_B"]
    assert "sealed orphan segment" not in lifecycle["log_B"]


def test_restart_shows_in_sglang_and_lifeboat_metrics(lifecycle: dict) -> None:
    stored = whole_pages(lifecycle["cold_P"].prompt_tokens)
    samples = parse_metrics(lifecycle["metrics_B"])

    def total(name: str) -> float:
        return sum(v for n, _, v in samples if n == name)

    assert total("sglang:storage_prefetch_hit_tokens_total") >= stored
    assert sum(v for n, lab, v in samples if n == "sglang:cached_tokens_total" and lab.get("cache_source") == "storage") \
        >= stored
    after = parse_metrics(lifecycle["metrics_B_after_tick"])
    assert sum(v for n, _, v in after if n == "lifeboat_hits_total") >= stored // PAGE
    assert sum(v for n, _, v in after if n == "lifeboat_pages_read_total") >= stored // PAGE
    assert sum(v for n, lab, v in after if n == "lifeboat_index_pages") >= stored // PAGE


def test_sigkill_during_backups_loses_no_acknowledged_page(lifecycle: dict) -> None:
    # Every page the store said yes to is on disk and verifies (verify exits non-zero on a bad record).
    assert lifecycle["records_after_kill"] >= lifecycle["records_A"] + lifecycle["acked_Q"]


def test_sigkill_restart_never_serves_a_wrong_token(lifecycle: dict) -> None:
    cold_q, after_q = lifecycle["cold_Q"], lifecycle["after_kill_Q"]
    assert after_q.output_ids == cold_q.output_ids
    # What was acknowledged before the kill is reused (Q's backups form one prefix-ordered batch).
    acked_q = min(lifecycle["acked_Q"], whole_pages(cold_q.prompt_tokens) // PAGE)
    assert after_q.storage_tokens >= acked_q * PAGE
    assert after_q.storage_tokens <= whole_pages(cold_q.prompt_tokens)
    after_p = lifecycle["after_kill_P"]
    assert after_p.output_ids == lifecycle["cold_P"].output_ids
    assert after_p.storage_tokens == whole_pages(after_p.prompt_tokens)


def test_buffer_only_host_memory_through_the_variable_restores_the_prompt(model: Path, lifecycle: dict) -> None:
    """LIFEBOAT_SGLANG_HOST_MODE=buffer_only (docs/sglang.md, many users at once): the launch takes SGLang's
    buffer_only host memory, says so once, and a fresh server still gets the returning prompt from storage,
    token for token."""
    srv = server(model, lifecycle["root"], "buffer-only", lifecycle["config"],
                 {"LIFEBOAT_SGLANG_HOST_MODE": "buffer_only"})
    with srv:
        got = srv.generate(lifecycle["P"], NEW_TOKENS)
    log = srv.log_path.read_text(errors="replace")
    said = "LifeboatCache: host memory mode buffer_only (LIFEBOAT_SGLANG_HOST_MODE; launch had cache)"
    assert log.count(said) == 1, log[-2000:]
    assert got.storage_tokens == whole_pages(len(lifecycle["P"])), got.cached_details
    assert got.output_ids == lifecycle["cold_P"].output_ids


# ------------------------------------------------------------------------------------------------
# Bad input at the server
# ------------------------------------------------------------------------------------------------


def _refused(srv: SGLangServer, timeout: float = 120) -> tuple[float, str]:
    started = time.monotonic()
    with pytest.raises(ServerFailed, match="exited"):
        srv.start(timeout=timeout)
    return time.monotonic() - started, srv.log_path.read_text(errors="replace")


def test_broken_lifeboat_yaml_stops_the_launch_naming_file_key_and_fix(model: Path, tmp_path: Path) -> None:
    config = tmp_path / "lifeboat.yaml"
    config.write_text(f"storage:\n  - type: local\n    path: {tmp_path / 'store'}\n    capcity: 1GiB\n")
    seconds, log = _refused(server(model, tmp_path, "yaml", config))
    assert f"{config}: storage[0]: unknown key(s) capcity; allowed keys are" in log
    assert "Load weight begin" not in log  # stopped while resolving the arguments, before the model
    assert not (tmp_path / "store").exists()


def test_read_only_store_directory_stops_the_launch(model: Path, tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(ro)], check=True)
    try:
        config = write_config(tmp_path / "lifeboat.yaml", [{"type": "local", "path": str(ro / "store")}])
        seconds, log = _refused(server(model, tmp_path, "ro", config))
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=False)
    assert (f"storage[0].path: the store directory {ro / 'store'} is not writable (Read-only file system); "
            "fix the path or its permissions") in log
    assert "Load weight begin" not in log


def test_hung_s3_at_start_serves_misses_and_right_tokens(model: Path, lifecycle: dict, tmp_path: Path) -> None:
    from lifeboat_cache.testing.s3_server import MotoS3Server

    moto = MotoS3Server(log_dir=tmp_path).start()
    try:
        moto.pause()  # accepts connections, never answers: a hung endpoint
        config = write_config(tmp_path / "lifeboat.yaml", [
            {"type": "s3", "bucket": "never-answers", "endpoint_url": moto.endpoint}])
        with server(model, tmp_path, "hung", config) as srv:
            for _ in range(2):
                got = srv.generate(lifecycle["P"], NEW_TOKENS, timeout=120)
                assert got.output_ids == lifecycle["cold_P"].output_ids
                assert got.storage_tokens == 0
            assert srv.running()
            srv.wait_metric("lifeboat_writes_dropped_total", 1, timeout=60)  # the backup was dropped, not hung
    finally:
        moto.resume()
        moto.stop()
