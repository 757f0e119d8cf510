"""Items 5, 6 and 8: capacity bounds the bytes on disk (open segments included), a full disk leaks no
fd and leaves no segment unsealed, and `stats` / `verify` never change the store.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from harness import (
    CHILD,
    FIGURES,
    PAGE_BYTES,
    ROOT,
    STRESS,
    check,
    cli,
    config,
    env,
    mount_tmpfs,
    run_writer,
    snapshot_tree,
    umount,
    write_keys,
)

from lifeboat_cache.records import HEADER_SIZE, framing, trailer_size

STRIPES = 4  # LocalTier's open segments per path
# documented slack (docs/storage.md): one record and one trailer per open segment beyond the capacity
SLACK_BYTES = STRIPES * (HEADER_SIZE + PAGE_BYTES + 4096)


def _framed(cap: int) -> int:
    """Bytes on disk of a store holding `cap` bytes of pages (what `capacity:` counts): the pages, their
    records' headers and trailer entries, and a trailer's fixed part per segment (at least 64 KiB each)."""
    return cap + framing(cap // PAGE_BYTES) + (cap // (64 << 10) + STRIPES) * trailer_size(0)


def _bytes_on_disk(store: Path) -> int:
    total = 0
    for p in store.glob("*"):
        try:
            total += p.lstat().st_size
        except FileNotFoundError:
            continue
    return total


def _peak_while(proc_fn, store: Path) -> tuple[int, object]:  # type: ignore[no-untyped-def]
    peak, done, out = [0], threading.Event(), []

    def poll() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _bytes_on_disk(store))
            time.sleep(0.005)

    t = threading.Thread(target=poll)
    t.start()
    try:
        out.append(proc_fn())
    finally:
        done.set()
        t.join()
    return max(peak[0], _bytes_on_disk(store)), out[0]


def test_capacity_bounds_bytes_on_disk_including_open_segments(tmp_path: Path) -> None:
    store = tmp_path / "store"
    cap = 8 << 20
    cfg = config(tmp_path, store, capacity="8MiB", segment_size="256MiB")
    peak, acked = _peak_while(lambda: run_writer(cfg, 6, 600 if STRESS else 200, close=True), store)
    FIGURES.trials += 1
    FIGURES.notes.append(f"capacity 8 MiB: peak {peak / 2**20:.2f} MiB on disk while writing "
                         f"{len(acked) * PAGE_BYTES / 2**20:.0f} MiB of pages")
    assert len(acked) * PAGE_BYTES > 2 * cap
    assert peak <= _framed(cap) + SLACK_BYTES, f"{peak} bytes on disk for a capacity of {cap}"
    assert _bytes_on_disk(store) <= _framed(cap) + SLACK_BYTES


def test_auto_capacity_never_fills_a_small_disk(tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mount_tmpfs(mnt, "32m")
    try:
        store = mnt / "store"
        cfg = config(tmp_path, store, capacity=None)
        cfg.write_text(cfg.read_text().replace("    capacity: None\n", ""))
        p = subprocess.run([sys.executable, str(CHILD), "fill", str(cfg), "4", "300" if STRESS else "160"],
                           capture_output=True, text=True, env=env(), cwd=ROOT, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        res = json.loads(p.stdout.strip().splitlines()[-1])
        FIGURES.trials += 1
        assert res["write_errors"] == 0 and res["failed_writes"] == 0, res  # the disk never filled
        # half the disk's 32 MiB of pages, their headers and trailers on top (docs/storage.md, "Honest capacity")
        assert _bytes_on_disk(store) <= _framed(16 << 20) + SLACK_BYTES
        assert res["open_fds"] == [] and res["unsealed"] == [], res
    finally:
        assert umount(mnt).returncode == 0


def test_full_disk_leaks_no_fd_and_leaves_no_segment_unsealed(tmp_path: Path) -> None:
    """A tmpfs filled to the top by concurrent writers (capacity above the disk size)."""
    mnt = tmp_path / "mnt"
    size_mb = 64 if STRESS else 8
    mount_tmpfs(mnt, f"{size_mb}m")
    try:
        store = mnt / "store"
        cfg = config(tmp_path, store, capacity="1GiB", failure_cooldown_s=0.05, failure_cooldown_max_s=0.1)
        pages = size_mb * 2**20 // PAGE_BYTES // 6 * 2  # twice what fits
        p = subprocess.Popen([sys.executable, str(CHILD), "fill", str(cfg), "6", str(pages)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=ROOT)
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        lines = out.strip().splitlines()
        res = json.loads(lines[-1])
        acked = [ln[2:] for ln in lines if ln.startswith("A ")]
        FIGURES.trials += 1
        FIGURES.faults += res["failed_writes"]
        FIGURES.notes.append(f"full {size_mb} MiB tmpfs: {res['failed_writes']} writes failed with ENOSPC, "
                             f"{len(res['open_fds'])} fds left open after close(), {len(res['unsealed'])} "
                             "segments left unsealed")
        assert res["failed_writes"] > 0, "the disk never filled"
        assert res["open_fds"] == [], res["open_fds"]
        assert res["unsealed"] == [], res["unsealed"]
        keys = write_keys(tmp_path / "keys", acked, set(acked))
        (chk,) = check(cfg, keys)
        assert chk["wrong"] == 0 and chk["lost"] == 0, chk
        FIGURES.acked_lost += chk["lost"]
    finally:
        r = umount(mnt)
    assert r.returncode == 0, f"the full tmpfs could not be unmounted: {r.stderr}"


def test_stats_and_verify_change_nothing_and_only_gc_evicts(tmp_path: Path) -> None:
    store = tmp_path / "store"
    run_writer(config(tmp_path, store, capacity="64MiB"), 4, 100, close=True)
    small = config(tmp_path, store, capacity="2MiB")
    before = snapshot_tree(store)
    for cmd in (["stats"], ["stats", "--json"], ["verify", "--quiet"]):
        r = cli(small, *cmd)
        assert r.returncode == 0, r.stdout + r.stderr
    assert snapshot_tree(store) == before, "stats / verify changed the store"
    r = cli(small, "gc")
    assert r.returncode == 0 and "freed 0 B" not in r.stdout, r.stdout
    assert _bytes_on_disk(store) <= (2 << 20) + SLACK_BYTES


def test_stats_works_on_a_read_only_store_and_creates_no_directory(tmp_path: Path) -> None:
    missing = tmp_path / "nothing" / "here"
    r = cli(config(tmp_path, missing), "stats", "--json")  # a storage error (exit 4), never "0 pages, fine"
    t = json.loads(r.stdout)["tiers"][0]
    assert r.returncode == 4 and t["pages"] == 0 and t["reachable"] is False, r.stdout + r.stderr
    assert "does not exist" in r.stderr
    assert not (tmp_path / "nothing").exists()
    mnt = tmp_path / "mnt"
    mount_tmpfs(mnt, "16m")
    try:
        store = mnt / "store"
        cfg = config(tmp_path, store)
        acked = run_writer(cfg, 2, 20, close=True)
        assert subprocess.run(["mount", "-o", "remount,ro", str(mnt)], capture_output=True).returncode == 0
        r = cli(cfg, "stats", "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["tiers"][0]["pages"] == len(acked), r.stdout + r.stderr
        r = cli(cfg, "verify", "--quiet")
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        assert umount(mnt).returncode == 0
