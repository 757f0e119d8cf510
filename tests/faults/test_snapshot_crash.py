"""Crash reopen with a periodic snapshot: SIGKILL a writer after its index thread wrote one; the reopen
loads it and scans only the segments written after it, and every acknowledged page comes back. A
snapshot saved while another process appends to the same directory never serves a wrong page.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
from child import NS, PAGE_ELEMS, page
from harness import CHILD, FIGURES, ROOT, check, config, env, start_writer, write_keys

from lifeboat_cache import ChunkStore
from lifeboat_cache.config import load_settings
from lifeboat_cache.tiers.segments import snapshot_file as snap
from lifeboat_cache.tiers.segments.format import parse_name
from lifeboat_cache.tiers.segments.snapshot_file import SNAPSHOT_NAME


def _lines(p: subprocess.Popen, out: list[str], done: threading.Event) -> threading.Thread:
    def run() -> None:
        assert p.stdout is not None
        for line in p.stdout:
            out.append(line.strip())
            if line.startswith("DONE"):
                done.set()
        done.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_sigkill_after_a_periodic_snapshot_reopens_from_it_and_scans_only_newer_segments(tmp_path: Path) -> None:
    store = tmp_path / "store"
    cfg = config(tmp_path, store)
    p = subprocess.Popen([sys.executable, str(CHILD), "snapwrite", str(cfg), "400"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env(), cwd=ROOT)
    lines: list[str] = []
    done = threading.Event()
    _lines(p, lines, done)
    try:
        assert done.wait(120), f"writer did not finish: {p.stderr.read()[-3000:] if p.poll() is not None else ''}"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        FIGURES.sigkills += 1
    assert "SNAP True" in lines, lines[-5:]
    acked = [ln[2:] for ln in lines if ln.startswith("A ")]
    s = snap.parse((store / SNAPSHOT_NAME).read_bytes())  # the periodic one: the child never closed
    on_disk = {f.name: f.stat().st_size for f in store.glob("*.seg")}
    in_snap = {u.name for u in s.units if on_disk.get(u.name) == u.scanned}
    newer = set(on_disk) - in_snap
    assert len(s.keys) > 0 and len(in_snap) == len(s.units) >= 2 and len(newer) >= 2, (len(s.units), newer)
    FIGURES.trials += 1
    with ChunkStore.open(load_settings(cfg), background=False) as st:
        t = st.stats()["tiers"][0]
        assert t["snapshot_pages"] == len(s.keys) and t["snapshot_segments"] == len(s.units)
        assert t["snapshot_mismatched_units"] == 0 and t["snapshot_discarded"] == 0
        assert t["scanned_segments"] == len(newer)  # the snapshot's segments were not scanned
        bufs = [np.empty(PAGE_ELEMS, np.uint16) for _ in acked]
        ok = st.get_into(NS, acked, bufs)
    FIGURES.pages_checked += len(acked)
    assert all(ok), f"{ok.count(False)} acknowledged pages lost"
    wrong = sum(not np.array_equal(b, page(k)) for k, b in zip(acked, bufs))
    FIGURES.wrong_pages += wrong
    assert wrong == 0


def test_snapshots_saved_while_another_process_appends_never_serve_a_wrong_page(tmp_path: Path) -> None:
    store = tmp_path / "store"
    cfg = config(tmp_path, store)
    w = start_writer(cfg, 2, 240)
    lines: list[str] = []
    done = threading.Event()
    _lines(w, lines, done)
    copies: list[bytes] = []
    mine: list[str] = []
    st = ChunkStore.open(load_settings(cfg))
    d = st.tiers[0].dirs[0]
    try:
        i = 0
        while not done.is_set() or len(copies) < 3:
            keys = [f"m-{j}" for j in range(i, i + 8)]
            i += 8
            ok = st.put(NS, keys, [page(k) for k in keys])
            mine += [k for k, good in zip(keys, ok) if good]
            d.seal()  # sealed segments of both processes go into the snapshot
            time.sleep(0.05)
            if d.save_snapshot():
                copies.append((store / SNAPSHOT_NAME).read_bytes())
            if i > 4000:
                break
        assert done.wait(120)
    finally:
        w.send_signal(signal.SIGKILL)
        w.wait(timeout=30)
        FIGURES.sigkills += 1
        st.close()
    acked = [ln[2:] for ln in lines if ln.startswith("A ")]
    theirs = [u for c in copies for u in snap.parse(c).units if parse_name(u.name)[1] == w.pid]
    assert len(copies) >= 3 and acked
    keys = write_keys(tmp_path / "keys", acked + mine, set(acked + mine))
    FIGURES.trials += 1
    for c in (copies[0], copies[len(copies) // 2], copies[-1]):  # early, mid-write and late snapshots
        (store / SNAPSHOT_NAME).write_bytes(c)
        for res in check(cfg, keys):
            assert res["wrong"] == 0 and res["lost"] == 0, res
    assert theirs  # the snapshots also named the other process's segments
