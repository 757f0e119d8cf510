"""Several processes sharing one store directory, as several SGLang servers share an NFS export.

Real processes (subprocess), real files, one directory. CI has no NFS server, so the directory is
local: this checks the protocol (one writer per segment file, publish by sealing, discovery by
listing, torn tails), not an NFS client's caching. docs/storage.md lists the mount options.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from lifeboat_cache import ChunkStore, namespace_fingerprint
from lifeboat_cache.tiers.segment import ORPHAN_IDLE_S
from lifeboat_cache.config import settings_from_dict

ROOT = Path(__file__).resolve().parents[2]

COMMON = textwrap.dedent('''
    import json, os, signal, sys, time
    import numpy as np
    from lifeboat_cache import ChunkStore, namespace_fingerprint
    from lifeboat_cache.config import settings_from_dict

    NS = namespace_fingerprint(model="shared-dir-test")

    def page(owner, i):
        return np.random.default_rng(owner * 100_003 + i).integers(0, 2**16, 8192, dtype=np.uint16)

    def settings(kind, root, seal_after_s=0.3):
        tier = {"type": kind, "path": root, "capacity": "1GiB", "segment_size": "1MiB", "refresh_interval_s": 0.1}
        if kind == "nfs":
            tier["seal_after_s"] = seal_after_s
        return settings_from_dict({"storage": [tier], "engine": {"io_workers": 4}})

    def check(st, ns, keys, owners_idx):
        out = [np.empty(8192, np.uint16) for _ in keys]
        ok = st.get_into(ns, keys, out)
        bad = sum(1 for o, got, (p, i) in zip(ok, out, owners_idx) if o and not (got == page(p, i)).all())
        return sum(ok), bad
''')

WRITER_READER = COMMON + textwrap.dedent('''
    kind, root, me, nproc, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    st = ChunkStore.open(settings(kind, root))
    mine = [f"w{me}-{i}" for i in range(n)]
    own_ns = namespace_fingerprint(model="shared-dir-test", writer=me)  # same key names, other namespace
    for i in range(0, n, 8):
        idx = range(i, min(n, i + 8))
        assert all(st.put(NS, [mine[j] for j in idx], [page(me, j) for j in idx]))
        assert all(st.put(own_ns, [f"same-{j}" for j in idx], [page(1000 + me, j) for j in idx]))
    everyone = [(p, i) for p in range(nproc) for i in range(n)]
    all_keys = [f"w{p}-{i}" for p, i in everyone]
    peer_ns = [namespace_fingerprint(model="shared-dir-test", writer=p) for p in range(nproc)]
    same = [f"same-{i}" for i in range(n)]

    def seen():
        return sum(st.contains(NS, all_keys)) + sum(sum(st.contains(ns, same)) for ns in peer_ns)

    t0 = time.monotonic()
    while seen() < 2 * len(all_keys) and time.monotonic() - t0 < 30:
        time.sleep(0.05)
    seen_after = time.monotonic() - t0
    hits, bad = check(st, NS, all_keys, everyone)
    ns_hits = ns_bad = 0
    for p in range(nproc):
        h, b = check(st, peer_ns[p], same, [(1000 + p, i) for i in range(n)])
        ns_hits, ns_bad = ns_hits + h, ns_bad + b
    problems = st.verify()
    time.sleep(1.0)  # stay a little, so slower peers can still read what is unsealed here (local)
    st.close()
    print(json.dumps({"me": me, "hits": hits, "bad": bad, "ns_hits": ns_hits, "ns_bad": ns_bad,
                      "seen_after_s": seen_after, "problems": problems}))
''')

STREAM_WRITER = COMMON + textwrap.dedent('''
    kind, root, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    st = ChunkStore.open(settings(kind, root, seal_after_s=0.2))
    i = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        idx = range(i, i + 4)
        st.put(NS, [f"c-{j}" for j in idx], [page(7, j) for j in idx])
        i += 4
    st.close()
    print(json.dumps({"written": i}))
''')

STREAM_READER = COMMON + textwrap.dedent('''
    kind, root, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    st = ChunkStore.open(settings(kind, root))
    hits = bad = misses = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        keys = [f"c-{j}" for j in range(4000)]
        present = [k for k, c in zip(keys, st.contains(NS, keys)) if c]
        if present:
            h, b = check(st, NS, present[-32:], [(7, int(k[2:])) for k in present[-32:]])
            hits, bad, misses = hits + h, bad + b, misses + len(present[-32:]) - h
        time.sleep(0.02)
    st.close()
    print(json.dumps({"hits": hits, "bad": bad, "misses": misses}))
''')

CRASHING_WRITER = COMMON + textwrap.dedent('''
    kind, root, n, host = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    if host != "-":  # pretend to be a writer on another host
        import lifeboat_cache.tiers.segment as seg
        seg._writer_tag = lambda: f"{host}-{os.getpid()}"
    from lifeboat_cache import codec
    from lifeboat_cache.keys import key_digest
    st = ChunkStore.open(settings(kind, root, seal_after_s=3600))  # never sealed before the crash
    assert all(st.put(NS, [f"ok-{i}" for i in range(n)], [page(3, i) for i in range(n)]))
    d = st.tiers[0].dirs[0]
    w = next(w for w in d._writers if w is not None and w.reserved)
    header, parts, _ = codec.build_record(page(3, 999).view(np.uint8), itemsize=2, dtype=codec.DTYPE_CODES["u2"],
                                          digest=key_digest(NS, "torn-0"), namespace=NS, compress=False)
    blob = header + b"".join(bytes(memoryview(p)) for p in parts)
    os.pwrite(w.fd, blob[: len(blob) // 2], w.reserved)  # the process dies in the middle of a record
    print(json.dumps({"segment": w.unit.name}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
''')


def run_script(script: str, *args: object, timeout: float = 60) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def result(proc: subprocess.Popen, timeout: float = 90) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{err[-3000:]}"
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["nfs", "local"])
def test_writers_on_one_directory_see_each_others_pages(tmp_path: Path, kind: str) -> None:
    nproc, n = 3, 40
    procs = [run_script(WRITER_READER, kind, tmp_path / "store", p, nproc, n) for p in range(nproc)]
    results = [result(p) for p in procs]
    for r in results:
        assert r["hits"] == nproc * n, r  # every writer's pages, read by every process
        assert r["bad"] == 0 and r["ns_bad"] == 0, r  # no torn or foreign page served
        assert r["ns_hits"] == nproc * n, r
        assert r["problems"] == [], r
    names = [p.name for p in (tmp_path / "store").glob("*.seg")]
    assert len({n.split("-")[2] for n in names}) == nproc, "one writer per segment file (pid in its name)"


@pytest.mark.parametrize("kind", ["nfs", "local"])
def test_reading_while_another_process_writes_serves_no_torn_page(tmp_path: Path, kind: str) -> None:
    writer = run_script(STREAM_WRITER, kind, tmp_path / "store", 3.0)
    reader = run_script(STREAM_READER, kind, tmp_path / "store", 4.0)
    w, r = result(writer), result(reader)
    assert w["written"] > 100
    assert r["hits"] > 0, r
    assert r["bad"] == 0, r


def settings(kind: str, root: Path):
    tier = {"type": kind, "path": str(root), "capacity": "1GiB", "segment_size": "1MiB", "refresh_interval_s": 0.1}
    return settings_from_dict({"storage": [tier], "engine": {"io_workers": 4}})


def page(owner: int, i: int) -> np.ndarray:
    return np.random.default_rng(owner * 100_003 + i).integers(0, 2**16, 8192, dtype=np.uint16)


NS = namespace_fingerprint(model="shared-dir-test")


@pytest.mark.parametrize("host", ["-", "otherhost"])
def test_crashed_writers_torn_segment_is_skipped(tmp_path: Path, host: str) -> None:
    root = tmp_path / "store"
    child = run_script(CRASHING_WRITER, "nfs", root, 20, host)
    out, err = child.communicate(timeout=60)
    assert child.returncode == -9, err[-2000:]
    segment = json.loads(out.strip().splitlines()[-1])["segment"]
    if host == "-":  # orphans are adopted only once idle (pids are per namespace): crash "a while ago"
        old = time.time() - 2 * ORPHAN_IDLE_S
        os.utime(root / segment, (old, old))
    st = ChunkStore.open(settings("nfs", root), background=False)
    try:
        d = st.tiers[0].dirs[0]
        if host != "-":
            # another host's writer: no pid to check; its segment is trusted once it stops growing
            assert st.exists(NS, ["ok-0"]) == 0, "an unsealed foreign segment was served before it went stale"
            d.stale_unsealed_s = 0.3
        keys = [f"ok-{i}" for i in range(20)]
        deadline = time.monotonic() + 10
        while st.exists(NS, keys) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert st.exists(NS, keys) == 20
        out_bufs = [np.empty(8192, np.uint16) for _ in keys]
        assert all(st.get_into(NS, keys, out_bufs))
        assert all((o == page(3, i)).all() for i, o in enumerate(out_bufs))
        assert st.contains(NS, ["torn-0"]) == [False]
        assert st.verify() == []
        if host == "-":  # same host, dead pid: the orphan was truncated at the tear and sealed
            assert (root / segment).stat().st_size < 20 * (64 + 16384) + 4096
            assert any(name == segment and sealed for name, _, sealed in d.units())
    finally:
        st.close()
