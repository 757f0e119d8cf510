"""Shared plumbing of the fault suite: configs, child processes, record maps, tmpfs mounts, figures.

Every check drives the public API in fresh processes (child.py). `STRESS` (LIFEBOAT_STRESS=1, set
by scripts/stress.sh) scales the trials up to the long variant.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lifeboat_cache.records import codec

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("child.py")
STRESS = os.environ.get("LIFEBOAT_STRESS", "") not in ("", "0")
PAGE_BYTES = 16384


@dataclass
class Figures:
    """What the suite prints at the end (and scripts/stress.sh reports)."""

    trials: int = 0
    sigkills: int = 0
    faults: int = 0
    pages_checked: int = 0
    wrong_pages: int = 0
    acked_lost: int = 0
    expected_lost: int = 0  # pages whose own record bytes a fault hit (nothing can bring them back)
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"trials {self.trials} (SIGKILLs {self.sigkills}), faults injected {self.faults}, "
                f"pages checked {self.pages_checked}, wrong pages served {self.wrong_pages}, "
                f"acknowledged pages lost {self.acked_lost} (pages whose own record was corrupted: "
                f"{self.expected_lost})")


FIGURES = Figures()


def age_segments(store: Path) -> None:
    """Make every segment look idle for longer than the orphan-adoption time (the next open adopts them)."""
    from lifeboat_cache.tiers.segments import ORPHAN_IDLE_S

    old = time.time() - 2 * ORPHAN_IDLE_S
    for seg in store.glob("*.seg"):
        os.utime(seg, (old, old))


def env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def config(tmp: Path, store: Path, engine: dict[str, object] | None = None, **tier: object) -> Path:
    """A lifeboat.yaml for one local tier at `store`; tier keys (and `engine` keys) override the defaults."""
    t = {"type": "local", "path": str(store), "capacity": "256MiB", "segment_size": "1MiB",
         "refresh_interval_s": 0.2, **tier}
    lines = ["storage:", "  - " + "\n    ".join(f"{k}: {json.dumps(v) if isinstance(v, str) else v}"
                                                 for k, v in t.items()),
             "engine:", "  io_workers: 8", *(f"  {k}: {v}" for k, v in (engine or {}).items())]
    p = tmp / f"lifeboat-{uuid.uuid4().hex[:6]}.yaml"
    p.write_text("\n".join(lines) + "\n")
    return p


def start_writer(cfg: Path, threads: int, pages: int, hold: int = -1, close: bool = False) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(CHILD), "write", str(cfg), str(threads), str(pages), str(hold),
                             "close" if close else "run"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env(), cwd=ROOT)


def run_writer(cfg: Path, threads: int, pages: int, *, hold: int = -1, kill_after_acks: int | None = None,
               close: bool = False, timeout_s: float = 120) -> list[str]:
    """Run a writer; SIGKILL it after `kill_after_acks` acknowledgements (or at DONE). Returns acked keys."""
    p = start_writer(cfg, threads, pages, hold, close)
    acked: list[str] = []
    deadline = time.monotonic() + timeout_s
    assert p.stdout is not None
    try:
        for line in p.stdout:
            if line.startswith("A "):
                acked.append(line[2:].strip())
            if line.startswith("DONE") or (kill_after_acks is not None and len(acked) >= kill_after_acks):
                break
            if time.monotonic() > deadline:
                raise AssertionError("writer did not finish in time")
    finally:
        if close and kill_after_acks is None:
            p.wait(timeout=timeout_s)
        else:
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=30)
            FIGURES.sigkills += 1
    if p.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(f"writer failed ({p.returncode}): {p.stderr.read()[-3000:] if p.stderr else ''}")
    return acked


def write_keys(path: Path, keys: list[str], acked: set[str]) -> Path:
    path.write_text("".join(f"{k} {int(k in acked)}\n" for k in keys))
    return path


def start_check(cfg: Path, keys_file: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(CHILD), "check", str(cfg), str(keys_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=ROOT)


def finish_check(p: subprocess.Popen, timeout_s: float = 180) -> dict[str, int]:
    out, err = p.communicate(timeout=timeout_s)
    assert p.returncode == 0, f"checker failed ({p.returncode}): {err[-3000:]}"
    res = json.loads(out.strip().splitlines()[-1])
    FIGURES.pages_checked += res["checked"]
    FIGURES.wrong_pages += res["wrong"]
    return res


def check(cfg: Path, keys_file: Path, copies: int = 1) -> list[dict[str, int]]:
    """Open the store in `copies` fresh processes at once and read every key."""
    procs = [start_check(cfg, keys_file) for _ in range(copies)]
    return [finish_check(p) for p in procs]


def cli(cfg: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lifeboat_cache.cli", *args, "--config", str(cfg)],
                          capture_output=True, text=True, env=env(), cwd=ROOT, timeout=300)


def record_map(seg: Path) -> list[tuple[int, int, bytes]]:
    """(offset, length, digest) of every record of a healthy segment, by a plain sequential parse
    (independent of the recovery code under test): records from byte 0 until the first non-record."""
    data = seg.read_bytes()
    out, pos = [], 0
    while pos + codec.HEADER_SIZE <= len(data):
        try:
            h = codec.unpack_header(data[pos:pos + codec.HEADER_SIZE])
        except codec.RecordError:
            break
        if pos + h.record_len > len(data):
            break
        out.append((pos, h.record_len, h.digest))
        pos += h.record_len
    return out


def snapshot_tree(root: Path) -> dict[str, tuple[int, int, int]]:
    """(size, mtime_ns, mode) of every file under root: 'nothing changed' is this staying equal."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns, st.st_mode)
    return out


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def mount_tmpfs(where: Path, size: str) -> None:
    """Mount a real tmpfs (needs root). Skips locally; fails with a clear message under CI=true."""
    where.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        msg = (f"cannot mount a tmpfs at {where} ({r.stderr.strip() or r.returncode}): the full-disk tests "
               "need root and mount(8); run them as root (CI runs scripts/test.sh as root)")
        if in_ci():
            pytest.fail(msg)
        pytest.skip(msg)


def umount(where: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["umount", str(where)], capture_output=True, text=True)
