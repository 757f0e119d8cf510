"""Child process of the fault suite: writes or checks pages through the public ChunkStore API.

    python child.py write CONFIG THREADS PAGES HOLD [close]   # prints "A <key>" per acknowledged page
    python child.py check CONFIG KEYS_FILE                      # prints one JSON line of counts
    python child.py fill CONFIG THREADS PAGES                   # write until the disk is full, close, audit
    python child.py snapwrite CONFIG PAGES_AFTER                # write until a periodic snapshot exists, then more
    python child.py churn CONFIG HOT ROUNDS                     # hot pages read every round beside one-off ones

`HOLD` >= 0 holds back that (global) record write forever, as a writer thread stalled between
reserving its offset and writing it would: later records of the same segment are written and
acknowledged around the hole. The check reads every key of KEYS_FILE ("key acked" lines) and
compares each served page byte for byte with the page the writer derives from the key.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import time

import numpy as np

from lifeboat_cache import ChunkStore, namespace_fingerprint
from lifeboat_cache.config import load_settings

NS = namespace_fingerprint(model="fault-suite")
PAGE_ELEMS = 8192  # 16 KiB u16 pages


def page(key: str) -> np.ndarray:
    """The page of a key: seeded, half of them compressible (zero runs) so both codecs are exercised."""
    seed = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    rng = np.random.default_rng(seed)
    p = rng.integers(0, 2**16, PAGE_ELEMS, dtype=np.uint16)
    if seed % 2:
        p[rng.integers(0, PAGE_ELEMS // 2):] = 0
    return p


def write(config: str, threads: int, pages: int, hold: int, close: bool) -> None:
    if hold >= 0:
        import lifeboat_cache.tiers.segments.writers as seg

        real, lock, calls = seg.pwritev_all, threading.Lock(), [0]

        def held(fd, bufs, offset, *bound):  # type: ignore[no-untyped-def]
            with lock:
                calls[0] += 1
                mine = calls[0] == hold
            if mine:
                threading.Event().wait()  # never returns: the process is killed with this write pending
            return real(fd, bufs, offset, *bound)

        seg.pwritev_all = held
    st = ChunkStore.open(load_settings(config))
    out = threading.Lock()

    def run(t: int) -> None:
        keys = [f"t{t}-{i}" for i in range(pages)]
        for i in range(0, pages, 4):
            batch = keys[i:i + 4]
            ok = st.put(NS, batch, [page(k) for k in batch])
            with out:
                for k, good in zip(batch, ok):
                    if good:
                        sys.stdout.write(f"A {k}\n")
                sys.stdout.flush()

    ts = [threading.Thread(target=run, args=(t,), daemon=True) for t in range(threads)]
    for t in ts:
        t.start()
    if hold < 0:
        for t in ts:
            t.join()
    else:
        # The put whose write is held never returns; every other thread finishes (however slow a loaded
        # machine is: a fixed wait per thread once printed DONE before any page was acknowledged).
        deadline = time.monotonic() + 120
        while sum(t.is_alive() for t in ts) > 1 and time.monotonic() < deadline:
            time.sleep(0.02)
    if close:
        st.close()
    sys.stdout.write("DONE\n")
    sys.stdout.flush()
    if hold >= 0:
        threading.Event().wait()  # wait for the SIGKILL


def check(config: str, keys_file: str) -> None:
    rows = [line.split() for line in open(keys_file) if line.strip()]
    st = ChunkStore.open(load_settings(config), background=False)
    checked = served = wrong = lost = 0
    lost_keys: list[str] = []
    try:
        for i in range(0, len(rows), 64):
            chunk = rows[i:i + 64]
            keys = [r[0] for r in chunk]
            bufs = [np.empty(PAGE_ELEMS, np.uint16) for _ in keys]
            ok = st.get_into(NS, keys, bufs)
            for (k, acked), good, b in zip(chunk, ok, bufs):
                checked += 1
                if good:
                    served += 1
                    wrong += int(not np.array_equal(b, page(k)))
                elif acked == "1":
                    lost += 1
                    lost_keys.append(k)
        tiers = st.stats()["tiers"]
    finally:
        st.close()
    damaged = sum(t.get("scan_torn", 0) for t in tiers)
    print(json.dumps({"damaged_regions": damaged, "checked": checked, "served": served, "wrong": wrong, "lost": lost, "lost_keys": lost_keys}))


def fill(config: str, threads: int, pages: int) -> None:
    """Concurrent writers on a small file system until writes fail; then close() and report what is
    left open (fds under the store) and which segments are not sealed on disk."""
    import os

    from lifeboat_cache.tiers.segments.format import read_table

    settings = load_settings(config)
    root = os.path.realpath(settings.storage[0].paths[0])
    st = ChunkStore.open(settings)
    out = threading.Lock()
    failed = [0]

    def run(t: int) -> None:
        keys = [f"t{t}-{i}" for i in range(pages)]
        for i in range(0, pages, 4):
            batch = keys[i:i + 4]
            ok = st.put(NS, batch, [page(k) for k in batch])
            with out:
                failed[0] += ok.count(False)
                for k, good in zip(batch, ok):
                    if good:
                        sys.stdout.write(f"A {k}\n")
                sys.stdout.flush()
            if not all(ok):
                time.sleep(0.05)  # let the write cooldown pass now and then, so writes keep failing

    ts = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    stats = st.stats()
    st.close()
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(root + os.sep):
            fds.append(target)
    unsealed = []
    for name in sorted(os.listdir(root)):
        if name.endswith(".seg"):
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                if read_table(fd, os.fstat(fd).st_size) is None:
                    unsealed.append(name)
            finally:
                os.close(fd)
    print(json.dumps({"open_fds": fds, "unsealed": unsealed, "failed_writes": failed[0],
                      "write_errors": stats["counters"].get("write_errors", 0)}))


def snapwrite(config: str, after: int) -> None:
    """Write (thresholds lowered) until the index thread wrote a periodic snapshot, stop further ones,
    write `after` more pages (in segments the snapshot does not know), print DONE, wait for the SIGKILL."""
    import os

    import lifeboat_cache.tiers.segments.snapshot_policy as seg
    from lifeboat_cache.tiers.segments import SNAPSHOT_NAME

    seg.SNAPSHOT_INTERVAL_S, seg.SNAPSHOT_MIN_SEGMENTS = 0.1, 2
    settings = load_settings(config)
    st = ChunkStore.open(settings)
    d = st.tiers[0].dirs[0]
    snap_file = os.path.join(str(settings.storage[0].paths[0]), SNAPSHOT_NAME)
    i = 0

    def put(n: int) -> None:
        nonlocal i
        for _ in range(0, n, 4):
            batch = [f"s-{j}" for j in range(i, i + 4)]
            i += 4
            ok = st.put(NS, batch, [page(k) for k in batch])
            sys.stdout.write("".join(f"A {k}\n" for k, good in zip(batch, ok) if good))
            sys.stdout.flush()

    deadline = time.monotonic() + 60
    while d.counters["snapshot_saves"] == 0 and time.monotonic() < deadline:
        put(16)
        time.sleep(0.01)
    d.snapshots.interval_s = 1e9  # no later periodic snapshot: what follows is only in segments
    sys.stdout.write(f"SNAP {os.path.exists(snap_file)}\n")
    put(after)
    sys.stdout.write("DONE\n")
    sys.stdout.flush()
    threading.Event().wait()  # wait for the SIGKILL


def churn(config: str, hot: int, rounds: int) -> None:
    """A full store under the issue's traffic: `hot` pages written between one-off ones (so evicting
    their segments reinserts them), then each round reads them and writes `hot` one-off pages. Prints
    "A <key>" per acknowledged hot page, then per round "R <round> <served> <wrong> <reinserted>
    <evicted>"; the parent kills it with SIGKILL mid-round (mid-eviction, mid-reinsertion)."""
    st = ChunkStore.open(load_settings(config))
    d = st.tiers[0].dirs[0]
    hk = [f"h-{i}" for i in range(hot)]
    for i, k in enumerate(hk):
        ok = st.put(NS, [f"x-{i}", k, f"y-{i}"], [page(f"x-{i}"), page(k), page(f"y-{i}")])
        if ok[1]:
            sys.stdout.write(f"A {k}\n")
    sys.stdout.flush()
    for r in range(rounds):
        bufs = [np.empty(PAGE_ELEMS, np.uint16) for _ in hk]
        got = st.get_into(NS, hk, bufs)
        wrong = sum(g and not np.array_equal(b, page(k)) for g, b, k in zip(got, bufs, hk))
        st.put(NS, hk, [page(k) for k in hk])
        ks = [f"o-{r}-{i}" for i in range(hot)]
        st.put(NS, ks, [page(k) for k in ks])
        c = d.counters
        sys.stdout.write(f"R {r} {sum(got)} {wrong} {c['retention_reinserted_records']} {c['evicted_segments']}\n")
        sys.stdout.flush()
    sys.stdout.write("DONE\n")
    sys.stdout.flush()
    threading.Event().wait()


if __name__ == "__main__":
    if sys.argv[1] == "churn":
        churn(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif sys.argv[1] == "snapwrite":
        snapwrite(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "fill":
        fill(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif sys.argv[1] == "write":
        write(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]),
              len(sys.argv) > 6 and sys.argv[6] == "close")
    else:
        check(sys.argv[2], sys.argv[3])
