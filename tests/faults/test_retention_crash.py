"""Retention under SIGKILL: a process killed mid-eviction or mid-reinsertion loses no page it kept (the
hot pages read every round), and nobody serves a wrong page afterwards (reinsertion writes and indexes
the copy before the old segment is unlinked, so a crash in between leaves two valid copies)."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness import CHILD, FIGURES, PAGE_BYTES, ROOT, STRESS, check, cli, config, env, write_keys

HOT = 16


def _churn(cfg: Path, rounds: int, kill_after_round: int) -> tuple[list[str], list[list[int]]]:
    """Run the churn child; SIGKILL it once `kill_after_round` rounds were reported (then a random
    few ms more, so the kill lands inside the next round's reads, writes, evictions or reinsertions)."""
    p = subprocess.Popen([sys.executable, str(CHILD), "churn", str(cfg), str(HOT), str(rounds)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=ROOT)
    acked: list[str] = []
    rows: list[list[int]] = []
    assert p.stdout is not None
    try:
        deadline = time.monotonic() + 180
        for line in p.stdout:
            if line.startswith("A "):
                acked.append(line[2:].strip())
            elif line.startswith("R "):
                rows.append([int(x) for x in line.split()[1:]])
                if len(rows) > kill_after_round:
                    time.sleep(random.random() * 0.05)
                    break
            elif line.startswith("DONE"):
                break
            assert time.monotonic() < deadline, "churn child did not report in time"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        FIGURES.sigkills += 1
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stderr.read()[-3000:] if p.stderr else "")
    return acked, rows


def test_sigkill_during_eviction_and_reinsertion_keeps_the_hot_pages(tmp_path: Path) -> None:
    rng = random.Random(77)
    trials = 12 if STRESS else 3
    reinserted_before_kill = 0
    for trial in range(trials):
        root = tmp_path / f"t{trial}"
        root.mkdir()
        store = root / "store"
        # 64 pages of 16 KiB: 64 KiB segments, a few pages each, evicted every round; engine.deadline_s
        # past the trial, so a slow read on a loaded machine is not taken for a page retention lost
        cfg = config(root, store, engine={"deadline_s": 600}, capacity=f"{64 * (PAGE_BYTES + 128)}B")
        acked, rows = _churn(cfg, rounds=40, kill_after_round=rng.randint(3, 12))
        FIGURES.trials += 1
        assert len(acked) == HOT
        assert all(r[2] == 0 for r in rows), "a wrong page was served before the kill"
        assert all(r[1] == HOT for r in rows[2:]), f"hot pages missed while the process ran: {rows}"
        reinserted_before_kill = max(reinserted_before_kill, max(r[3] for r in rows))
        one_off = [f"o-{r}-{i}" for r in range(len(rows) + 1) for i in range(HOT)]
        keys = write_keys(root / "keys", acked + one_off, set(acked))
        for res in check(cfg, keys, copies=2):  # two fresh processes at once, right after the kill
            assert res["wrong"] == 0 and res["lost"] == 0, res
            FIGURES.acked_lost += res["lost"]
        v = cli(cfg, "verify")
        assert v.returncode == 0, v.stdout + v.stderr
    assert reinserted_before_kill > 0, "the trials never reinserted a record: the kill windows were not covered"
