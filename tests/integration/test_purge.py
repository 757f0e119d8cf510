"""`lifeboat purge`, compaction (`lifeboat gc`) and `max_age`, with real processes and real files.

Pages are stored uncompressed (`compression: none`) and each is random, so a page's bytes on disk
are its own unique pattern: "gone from disk" is checked by grepping every file of the store for it.
Serving processes are real child processes with their own ChunkStore and StatsReporter (what the
shims start), so `--model` resolves through the stats files exactly as for an operator.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from lifeboat_cache import ChunkStore, namespace_fingerprint
from lifeboat_cache.cli import main
from lifeboat_cache.config import ConfigError, load_settings, settings_from_dict
from lifeboat_cache.ops.stats_file import STATS_DIR_NAME

PAGE = 2048  # uint16 elements: 4 KiB pages


def page(tag: str, i: int) -> np.ndarray:
    seed = int.from_bytes(tag.encode()[:8].ljust(8, b"\0"), "little") + 7919 * i
    return np.random.default_rng(seed).integers(0, 1 << 16, PAGE, dtype=np.uint16)


def ns_of(model: str, rank: int) -> bytes:
    return namespace_fingerprint(model=model, dtype="uint16", page_size=1, rank=rank)


def keys(tag: str, n: int) -> list[str]:
    return [f"{tag}-{i:04d}" for i in range(n)]


WRITER = textwrap.dedent("""
    import sys, time
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    from test_purge import page, ns_of, keys
    from lifeboat_cache import ChunkStore
    from lifeboat_cache.config import load_settings
    from lifeboat_cache.ops.stats_file import StatsReporter

    cfg, n = sys.argv[2], int(sys.argv[3])
    specs = [s.split(":") for s in sys.argv[4:]]  # model:rank
    store = ChunkStore.open(load_settings(cfg), background=False)
    rep = StatsReporter(store, role="test", labels={"rank": 0}, interval_s=3600)
    for model, rank in specs:
        ns = ns_of(model, int(rank))
        store.counters.name_namespace(ns, model=model, pool="kv", rank=rank)
    for i in range(n):  # interleaved: every segment holds pages of every namespace
        for model, rank in specs:
            tag = f"{model}{rank}"
            assert store.put(ns_of(model, int(rank)), [keys(tag, n)[i]], [page(tag, i)]) == [True]
    store.flush()
    rep.close()
    store.close()
    print("WROTE", flush=True)
""")

READER = textwrap.dedent("""
    import sys, time
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    from test_purge import page, ns_of, keys, PAGE
    from lifeboat_cache import ChunkStore
    from lifeboat_cache.config import load_settings

    cfg, model, n = sys.argv[2], sys.argv[3], int(sys.argv[4])
    store = ChunkStore.open(load_settings(cfg), background=False)
    ns, ks = ns_of(model, 0), keys(model + "0", n)
    out = [np.empty(PAGE, np.uint16) for _ in ks]
    assert store.count_leading_hits(ns, ks) == n and all(store.get_into(ns, ks, out))
    print("SERVING", flush=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        got = store.get_into(ns, ks, out)
        if not any(got) and store.count_leading_hits(ns, ks) == 0:
            print("STOPPED", time.time(), flush=True)
            break
        time.sleep(0.02)
    store.close()
""")


def config(tmp_path: Path, name: str = "store", **tier: object) -> Path:
    cfg = tmp_path / f"{name}.yaml"
    extra = "".join(f"    {k}: {v}\n" for k, v in tier.items())
    cfg.write_text(f"storage:\n  - type: local\n    path: {tmp_path / name}\n    capacity: 256MiB\n"
                   f"    segment_size: 1MiB\n{extra}engine:\n  compression: none\n")
    return cfg


def run_writer(tmp_path: Path, cfg: Path, n: int, *specs: str) -> None:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    r = subprocess.run([sys.executable, str(script), str(Path(__file__).parent), str(cfg), str(n), *specs],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "WROTE" in r.stdout, r.stderr


def store_bytes(directory: Path) -> bytes:
    """Every byte of every file under the store directory (segments, snapshot, lists, stats)."""
    return b"".join(p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file())


def on_disk(directory: Path, tag: str, n: int) -> int:
    blob = store_bytes(directory)
    return sum(page(tag, i).tobytes()[:256] in blob for i in range(n))


def served(cfg: Path, model: str, rank: int, n: int, tries: int = 3) -> tuple[int, list[bool]]:
    """(exists count, per-page byte-exact reads) from a fresh process-local store. A page that misses
    is read again (up to `tries` reads): on a loaded machine one read can pass `engine.deadline_s` and
    become a miss, which says nothing about whether the page is stored; an indexed page that never
    reads back byte-exact does."""
    tag, ns = f"{model}{rank}", ns_of(model, rank)
    ks = keys(tag, n)
    with ChunkStore.open(load_settings(cfg), background=False, read_only=True) as store:
        exact = [False] * n
        todo = list(range(n))
        for _ in range(tries):
            out = [np.empty(PAGE, np.uint16) for _ in todo]
            ok = store.get_into(ns, [ks[i] for i in todo], out)
            for i, g, o in zip(todo, ok, out):
                exact[i] = bool(g) and np.array_equal(o, page(tag, i))
            todo = [i for i in todo if not exact[i] and store.contains(ns, [ks[i]])[0]]  # retry indexed misses
            if not todo:
                break
        return store.count_leading_hits(ns, ks), exact


def cli(*args: str) -> tuple[int, str, str]:
    r = subprocess.run([sys.executable, "-m", "lifeboat_cache.cli", *args], capture_output=True, text=True,
                       timeout=120)
    return r.returncode, r.stdout, r.stderr


# ------------------------------------------------------------------------------ purge + gc
def test_purge_model_every_namespace_then_gc_removes_bytes(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    run_writer(tmp_path, cfg, 40, "alpha:0", "alpha:1", "beta:0")
    d = tmp_path / "store"
    assert on_disk(d, "alpha0", 40) == 40 and on_disk(d, "alpha1", 40) == 40
    rc, out, err = cli("purge", "--config", str(cfg), "--model", "alpha", "--json")
    assert rc == 0, err
    rep = json.loads(out)
    assert set(rep["namespaces"]) == {ns_of("alpha", 0).hex(), ns_of("alpha", 1).hex()}
    assert rep["tiers"][0]["purged_pages"] == 80
    for rank in (0, 1):  # gone from every index at once ...
        assert served(cfg, "alpha", rank, 40) == (0, [False] * 40)
    assert served(cfg, "beta", 0, 40) == (40, [True] * 40)
    assert on_disk(d, "alpha0", 40) == 40  # ... but the bytes stay until gc
    assert (d / "purge.list").stat().st_mode & 0o077 == 0  # owner-only
    rc, out, err = cli("gc", "--config", str(cfg))
    assert rc == 0, err
    assert "compaction rewrote" in out
    assert on_disk(d, "alpha0", 40) == 0 and on_disk(d, "alpha1", 40) == 0
    assert served(cfg, "beta", 0, 40) == (40, [True] * 40)  # live pages survive byte-exact
    assert on_disk(d, "beta0", 40) == 40
    assert not list(d.glob(".compact-*"))


PLAIN_WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    from test_purge import page, ns_of, keys
    from lifeboat_cache import ChunkStore
    from lifeboat_cache.config import load_settings

    with ChunkStore.open(load_settings(sys.argv[2]), background=False) as store:  # no stats file: the Python API
        for model in sys.argv[4:]:
            ok = store.put(ns_of(model, 0), keys(f"{model}0", int(sys.argv[3])),
                           [page(f"{model}0", i) for i in range(int(sys.argv[3]))])
            assert all(ok), ok
    print("WROTE")
""")


def test_pages_written_through_the_python_api_are_named_for_ls_and_purge_model(tmp_path: Path) -> None:
    """A plain Python process (no serving shim, no stats file) leaves its namespaces' names in the store:
    `ls` shows the model, `purge --model` finds exactly its pages, and a second purge finds none."""
    cfg = config(tmp_path)
    script = tmp_path / "plain.py"
    script.write_text(PLAIN_WRITER)
    r = subprocess.run([sys.executable, str(script), str(Path(__file__).parent), str(cfg), "25", "org/alpha",
                        "org/beta"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "WROTE" in r.stdout, r.stderr
    assert not list((tmp_path / "store" / STATS_DIR_NAME).glob("*.json"))  # no stats file names them
    rc, out, err = cli("ls", "--config", str(cfg), "--json")
    assert rc == 0, err
    listed = json.loads(out)["namespaces"]
    assert listed[ns_of("org/alpha", 0).hex()]["labels"]["model"] == "org/alpha"
    assert listed[ns_of("org/beta", 0).hex()]["labels"]["model"] == "org/beta"
    rc, out, err = cli("purge", "--config", str(cfg), "--model", "org/alpha", "--json")
    assert rc == 0, err
    rep = json.loads(out)
    assert set(rep["namespaces"]) == {ns_of("org/alpha", 0).hex()} and rep["tiers"][0]["purged_pages"] == 25
    assert served(cfg, "org/alpha", 0, 25) == (0, [False] * 25)
    assert served(cfg, "org/beta", 0, 25) == (25, [True] * 25)
    rc, out, err = cli("purge", "--config", str(cfg), "--model", "org/alpha", "--json")
    assert rc == 0 and json.loads(out)["tiers"][0]["purged_pages"] == 0, err


def test_purge_namespace_prefix_and_gc_option(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    run_writer(tmp_path, cfg, 30, "alpha:0", "beta:0")
    prefix = ns_of("beta", 0).hex()[:16]  # what `lifeboat ls` prints
    assert main(["purge", "--config", str(cfg), "--namespace", prefix, "--gc"]) == 0
    d = tmp_path / "store"
    assert served(cfg, "beta", 0, 30) == (0, [False] * 30)
    assert on_disk(d, "beta0", 30) == 0
    assert served(cfg, "alpha", 0, 30) == (30, [True] * 30)


def test_purge_older_than_keeps_newer_pages(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    run_writer(tmp_path, cfg, 20, "old:0")
    time.sleep(2.5)
    run_writer(tmp_path, cfg, 20, "new:0")
    assert main(["purge", "--config", str(cfg), "--older-than", "2s"]) == 0
    assert served(cfg, "old", 0, 20) == (0, [False] * 20)
    assert served(cfg, "new", 0, 20) == (20, [True] * 20)
    assert main(["gc", "--config", str(cfg)]) == 0
    d = tmp_path / "store"
    assert on_disk(d, "old0", 20) == 0 and on_disk(d, "new0", 20) == 20


def test_second_serving_process_stops_within_documented_time(tmp_path: Path) -> None:
    """docs/operating.md: other processes stop serving within 2 x refresh_interval_s (default 1 s)."""
    cfg = config(tmp_path)
    run_writer(tmp_path, cfg, 20, "alpha:0", "beta:0")
    script = tmp_path / "reader.py"
    script.write_text(READER)
    proc = subprocess.Popen([sys.executable, str(script), str(Path(__file__).parent), str(cfg), "alpha", "20"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "SERVING"
        assert main(["purge", "--config", str(cfg), "--model", "alpha"]) == 0
        returned = time.time()
        line = proc.stdout.readline().split()
        assert line and line[0] == "STOPPED", proc.stderr.read() if proc.stderr else ""
        assert float(line[1]) - returned <= 2.0
        print(f"second process stopped serving {float(line[1]) - returned:.3f} s after purge returned")
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigkill_during_compaction_loses_nothing_live(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    n = 1200  # 3 x 1200 x 4 KiB: ~14 segments, each with every namespace
    run_writer(tmp_path, cfg, n, "keep:0", "gone:0", "also:0")
    assert main(["purge", "--config", str(cfg), "--model", "gone"]) == 0
    d = tmp_path / "store"
    mid = 0
    for extra_s in (0.0, 0.005, 0.02, 0.0, 0.01, 0.04):
        proc = subprocess.Popen([sys.executable, "-m", "lifeboat_cache.cli", "gc", "--config", str(cfg)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while proc.poll() is None and not any(p.name.startswith(".compact-") for p in os.scandir(d)):
            time.sleep(0.0005)  # wait until it is writing a compacted segment
        time.sleep(extra_s)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            mid += 1
        proc.wait()
        for model in ("keep", "also"):  # every live page, byte-exact, after each kill
            assert served(cfg, model, 0, n) == (n, [True] * n)
        assert served(cfg, "gone", 0, n) == (0, [False] * n)
    assert mid >= 1  # at least one kill landed mid-compaction
    rc, _, err = cli("gc", "--config", str(cfg))
    assert rc == 0, err
    assert on_disk(d, "gone0", n) == 0
    for model in ("keep", "also"):
        assert served(cfg, model, 0, n) == (n, [True] * n)
        assert on_disk(d, f"{model}0", n) == n
    assert not list(d.glob(".compact-*"))  # a killed compaction's temporary file is cleaned up
    print(f"gc killed mid-compaction {mid} of 6 times")


def test_compaction_of_mostly_dead_segments(tmp_path: Path) -> None:
    """Pages overwritten elsewhere leave dead records; gc rewrites segments under the live share."""
    cfg = config(tmp_path)
    run_writer(tmp_path, cfg, 60, "alpha:0", "beta:0")
    d = tmp_path / "store"
    with ChunkStore.open(load_settings(cfg), background=False) as store:  # quarantine-free drop: forget beta
        tier = store.tiers[0]
        from lifeboat_cache.records.keys import index_key, key_digest

        ns = ns_of("beta", 0)
        for k in keys("beta0", 60):
            ik = index_key(key_digest(ns, k))
            ref = tier.locate(ik)
            assert ref is not None
            tier.dirs[0].index.remove_if_match(ik, ref.loc)
        from lifeboat_cache.ops.purging import compact_tier

        got = compact_tier(tier, 0.6)
        assert got["rewritten"] >= 1 and got["kept_records"] == 60
    assert on_disk(d, "beta0", 60) == 0
    assert served(cfg, "alpha", 0, 60) == (60, [True] * 60)


# ------------------------------------------------------------------------------ max_age
def test_max_age_expires_pages_in_a_serving_process(tmp_path: Path) -> None:
    cfg = config(tmp_path, max_age="2s", refresh_interval_s=0.2)
    settings = load_settings(cfg)
    assert settings.storage[0].max_age_s == 2.0
    d = tmp_path / "store"
    ns = ns_of("alpha", 0)
    with ChunkStore.open(settings, background=True) as store:
        assert store.put(ns, keys("alpha0", 10), [page("alpha0", i) for i in range(10)]) == [True] * 10
        store.flush()
        assert store.count_leading_hits(ns, keys("alpha0", 10)) == 10
        deadline = time.time() + 10
        while time.time() < deadline and store.count_leading_hits(ns, keys("alpha0", 10)):
            time.sleep(0.1)
        assert store.count_leading_hits(ns, keys("alpha0", 10)) == 0
        out = [np.empty(PAGE, np.uint16) for _ in range(10)]
        assert not any(store.get_into(ns, keys("alpha0", 10), out))
        deadline = time.time() + 5  # and not kept: the expired segment is evicted
        while time.time() < deadline and list(d.glob("*.seg")):
            time.sleep(0.1)
        assert on_disk(d, "alpha0", 10) == 0


def test_max_age_bad_value_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"storage\[0\]\.max_age"):
        settings_from_dict({"storage": [{"type": "local", "path": str(tmp_path), "max_age": "abc"}]})
    s = settings_from_dict({"storage": [{"type": "local", "path": str(tmp_path), "max_age": "7d"}]})
    assert s.storage[0].max_age_s == 7 * 86400


# ------------------------------------------------------------------------------ S3
def test_s3_purge_rewrites_and_deletes_objects(tmp_path: Path, s3_endpoint: str) -> None:
    boto3 = pytest.importorskip("boto3")
    import uuid

    bucket = f"lb-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=bucket)
    cfg = tmp_path / "s3.yaml"
    cfg.write_text(f"storage:\n  - type: s3\n    bucket: {bucket}\n    prefix: cache/\n    endpoint_url: "
                   f"{s3_endpoint}\n    region: us-east-1\nengine:\n  compression: none\n")
    settings = load_settings(cfg)
    a, b = ns_of("alpha", 0), ns_of("beta", 0)
    with ChunkStore.open(settings, background=False) as store:
        assert all(store.put(a, keys("alpha0", 8), [page("alpha0", i) for i in range(8)]))  # alone in its objects
        mixed = store.tiers[0].write_many([  # one object holding both namespaces
            *(_rec(a, "alpha0", i) for i in range(8, 12)), *(_rec(b, "beta0", i) for i in range(4))])
        assert len(mixed) == 8
        assert all(store.put(b, keys("beta0", 8)[4:], [page("beta0", i) for i in range(4, 8)]))
        store.flush()

    def bucket_bytes() -> bytes:
        objs = client.list_objects_v2(Bucket=bucket, Prefix="cache/").get("Contents", [])
        return b"".join(client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in objs)

    assert page("alpha0", 9).tobytes() in bucket_bytes()
    assert main(["purge", "--config", str(cfg), "--namespace", a.hex()]) == 0
    blob = bucket_bytes()
    assert not any(page("alpha0", i).tobytes()[:256] in blob for i in range(12))
    assert all(page("beta0", i).tobytes()[:256] in blob for i in range(8))
    with ChunkStore.open(settings, background=False, read_only=True) as store:
        out = [np.empty(PAGE, np.uint16) for _ in range(8)]
        assert all(store.get_into(b, keys("beta0", 8), out))
        assert all(np.array_equal(o, page("beta0", i)) for i, o in enumerate(out))
        assert store.count_leading_hits(a, keys("alpha0", 12)) == 0


def _rec(ns: bytes, tag: str, i: int) -> tuple[int, bytes, list[object], int]:
    from lifeboat_cache.records import codec
    from lifeboat_cache.records.keys import index_key, key_digest

    k = keys(tag, 12)[i]
    dg = key_digest(ns, k)
    header, parts, length = codec.build_record(page(tag, i), itemsize=2, dtype=codec.DTYPE_CODES["u2"], digest=dg,
                                               namespace=ns, compress=False)
    return index_key(dg), dg, [header, *parts], length


# ------------------------------------------------------------------------------ bad input
def test_bad_arguments_give_clear_errors(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    run_writer(tmp_path, cfg, 2, "alpha:0")
    rc, _, err = cli("purge", "--config", str(cfg), "--older-than", "abc")
    assert rc == 2 and "--older-than" in err and "7d" in err
    rc, _, err = cli("purge", "--config", str(cfg))
    assert rc == 2 and "--model" in err
    rc, _, err = cli("purge", "--config", str(cfg), "--namespace", "xyz")
    assert rc == 2 and "--namespace" in err
    rc, _, err = cli("purge", "--config", str(cfg), "--model", "nosuch")
    assert rc == 2 and "nosuch" in err and "alpha" in err
    rc, _, err = cli("gc", "--config", str(cfg), "--compact-below", "2")
    assert rc == 2 and "--compact-below" in err
    assert not (tmp_path / "store" / "purge.list").exists()  # a refused purge records nothing


def test_purge_on_read_only_store_is_a_clear_error(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    run_writer(tmp_path, cfg, 4, "alpha:0")
    d = tmp_path / "store"
    if os.geteuid() == 0:  # root writes through mode bits: make the file system itself read-only
        r = subprocess.run(["mount", "--bind", str(d), str(d)], capture_output=True)
        if r.returncode != 0:
            pytest.skip(f"cannot bind-mount: {r.stderr!r}")
        try:
            subprocess.run(["mount", "-o", "remount,bind,ro", str(d)], check=True, capture_output=True)
            rc, _, err = cli("purge", "--config", str(cfg), "--model", "alpha")
        finally:
            subprocess.run(["umount", str(d)], capture_output=True)
    else:
        d.chmod(0o500)
        try:
            rc, _, err = cli("purge", "--config", str(cfg), "--model", "alpha")
        finally:
            d.chmod(0o700)
    assert rc == 4 and "read-only" in err and str(d) in err, err  # a storage error (docs/operating.md)
    assert served(cfg, "alpha", 0, 4) == (4, [True] * 4)


def test_verify_after_purge_reports_no_problem(tmp_path: Path) -> None:
    """Purged records still on disk (before gc) are not 'missing from the index', and --fix keeps them out."""
    cfg = config(tmp_path)
    run_writer(tmp_path, cfg, 10, "alpha:0", "beta:0")
    assert main(["purge", "--config", str(cfg), "--model", "alpha"]) == 0
    rc, out, err = cli("verify", "--config", str(cfg), "--quiet")
    assert rc == 0 and "0 bad" in out, out + err
    rc, out, err = cli("verify", "--config", str(cfg), "--quiet", "--fix")
    assert rc == 0, out + err
    assert served(cfg, "alpha", 0, 10) == (0, [False] * 10)
    assert served(cfg, "beta", 0, 10) == (10, [True] * 10)


def test_namespace_purge_covers_a_writer_whose_clock_runs_ahead(tmp_path: Path) -> None:
    """A segment named 60 s in the future (a skewed host) that exists at purge time is still covered."""
    cfg = config(tmp_path)
    run_writer(tmp_path, cfg, 10, "alpha:0")
    d = tmp_path / "store"
    for p in d.glob("*.seg"):
        ms, rest = p.name.split("-", 1)
        p.rename(d / f"{int(ms) + 60_000:013d}-{rest}")
    assert main(["purge", "--config", str(cfg), "--model", "alpha", "--gc"]) == 0
    assert served(cfg, "alpha", 0, 10) == (0, [False] * 10)
    assert on_disk(d, "alpha0", 10) == 0


def test_s3_purge_with_server_down_is_reported_incomplete(tmp_path: Path, s3_server) -> None:
    boto3 = pytest.importorskip("boto3")
    import uuid

    bucket = f"lb-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_server.endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    cfg = tmp_path / "s3.yaml"
    cfg.write_text(f"storage:\n  - type: s3\n    bucket: {bucket}\n    prefix: cache/\n    endpoint_url: "
                   f"{s3_server.endpoint}\n    region: us-east-1\n    connect_timeout_s: 0.5\n"
                   f"    read_timeout_s: 1\n    max_attempts: 1\nengine:\n  compression: none\n")
    a = ns_of("alpha", 0)
    with ChunkStore.open(load_settings(cfg), background=False) as store:
        assert all(store.put(a, keys("alpha0", 4), [page("alpha0", i) for i in range(4)]))
    s3_server.stop()
    rc, _, err = cli("purge", "--config", str(cfg), "--namespace", a.hex())
    # never a silent success: a storage error, before any rule is written (a purge is every tier or none)
    assert rc == 4 and "storage error" in err and "nothing purged" in err and "again" in err, err


def test_compaction_on_a_full_disk_keeps_every_live_page(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs")
    try:
        cfg = config(mnt)
        cfg.write_text(cfg.read_text().replace("256MiB", "6MiB"))
        run_writer(tmp_path, cfg, 200, "keep:0", "gone:0")  # 3.2 MiB in 1 MiB segments
        assert main(["purge", "--config", str(cfg), "--model", "gone"]) == 0
        filler = mnt / "filler"
        with open(filler, "wb", buffering=0) as f:  # fill the disk to the last block (unbuffered: a short
            try:                                     # last write leaves nothing for close() to flush)
                while True:
                    f.write(b"\0" * 65536)
            except OSError:
                pass
        rc, _, err = cli("gc", "--config", str(cfg))
        assert rc == 0, err
        assert served(cfg, "keep", 0, 200) == (200, [True] * 200)
        assert served(cfg, "gone", 0, 200) == (0, [False] * 200)
        assert not list((mnt / "store").glob(".compact-*"))  # a failed rewrite leaves no temporary file
        assert on_disk(mnt / "store", "gone0", 200) > 0  # the rewrite did fail: nothing was half-done
        filler.unlink()
        rc, _, err = cli("gc", "--config", str(cfg))
        assert rc == 0, err
        assert on_disk(mnt / "store", "gone0", 200) == 0
        assert served(cfg, "keep", 0, 200) == (200, [True] * 200)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
