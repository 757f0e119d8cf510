"""A real SGLang 0.5.23 server on this machine's CPU (`python -m sglang.launch_server`, HiCache on, SmolLM2-135M
float32): time to first token of a returning prompt, recomputed vs restored after a restart from LifeboatCache
vs restored from SGLang's own `file` backend, and the server's start time on an empty store and on a big one.
Both backends run with `--hicache-mem-layout layer_first --hicache-io-backend direct` (the only pair SGLang's
CPU path can copy; SGLang's defaults, page_first / kernel, need its CUDA kernels and crash the `file` server)
and `--hicache-storage-prefetch-policy wait_complete`: with the default `timeout` policy (1 s + 0.25 s per 1K
tokens) a restore on this loaded VM expired once into a plain recompute (storage 0), which measures the load,
not the backend.

Why a server and not the classes: this is what a user measures (launch, send, SIGTERM, launch, send again),
with everything between the HTTP request and the first token: the scheduler, the prefetch policy and its
threshold, the host pool, the backend's reads. Everything here is one run on one machine, so the figures
that mean something on a shared 2-core VM are the ratios; absolutes carry the machine label.

Four server processes, in this order, each a fresh process (the device radix cache never serves a
restored request), all with the same flags except the storage backend:
  lifeboat store   empty LifeboatCache store: start time (empty store), a first request (a prompt no later
                   server sees: the first request right after ready, which also warms the process up), then
                   per size the returning prompt with max_new_tokens=1 (recomputed: the cold request) and
                   once more with `check_tokens` greedy tokens (the reference output); wait until
                   `lifeboat_pages_written_total` reaches the prompts' whole pages and holds still; SIGTERM.
  file store       the same with `--hicache-storage-backend file` on an empty directory; settled when the
                   directory holds the prompts' whole pages as files and holds still.
  (then `store_pages` small filler pages are written into the LifeboatCache directory under another model
  id through the public ChunkStore API, its index snapshot is removed, as after a crash, so the next start
  scans every record, and both stores' page cache is dropped and checked: restores read from the disk)
  lifeboat restore a new server on the big store: start time, its first request (a fresh prompt) right after
                   ready while the index rebuild of the scan may still run, the index rebuild time from
                   its log, then per size the returning prompt (timed, max_new_tokens=1; must come from
                   storage) and the check request (its tokens against the cold run's); then SIGKILL (nothing
                   left to keep, and SGLang's drain on SIGTERM costs ~10 s a server here).
  file restore     the same on the `file` directory.
Prompt sizes use distinct salts, so no two prompts share a page; each size is timed once per server.
One server at a time: SGLang refuses a host pool unless 10 GiB plus the pool stay available
(`pool_host/base.py`, HICACHE_HOST_MEMORY_RESERVE_BYTES), and two of these servers next to other work do
not fit a 24 GiB VM. So the contenders' restores are minutes apart: each server's first request (a fresh
prompt, recomputed) is in the results as a gauge of the load it met.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from .common import available_bytes, drop_page_cache, log
from .sizes import Sizes, ints

PAGE_TOKENS = 64  # cpu_flags' --page-size
SETTLE_S = 2.0  # backups count as done when the written pages hold still this long
SETTLE_TIMEOUT_S = 300.0
STATS_SETTLE_S = 6.0  # lifeboat_* metrics are as fresh as the stats file: every 5 s by default
REBUILD_LINE = re.compile(r"index rebuilt: (\d+) pages in (\d+) ms")
STORE_LOG_LINE = re.compile(r"lifeboat: .*(store open|snapshot|index rebuilt)")
# SGLang 0.5.23 starts a HiCache host pool only while MemAvailable stays above its 10 GiB reserve plus the pool
# (`pool_host/base.py`, HICACHE_HOST_MEMORY_RESERVE_BYTES); on a VM shared with other servers that is not always so
HOST_RESERVE_BYTES = 10 * 2**30
START_MEMORY_BYTES = HOST_RESERVE_BYTES + 3 * 2**30  # + the 1 GiB pool, the model and the server's own processes
MEMORY_WAIT_S = 180.0
PREFETCH_LOG = re.compile(r"HiCache prefetch|[Pp]refetch.*(timeout|timed out|abort|terminat|fail)|lifeboat: ")
FILLER_MODEL = "lifeboat-bench-filler"  # the filler pages' model id: a namespace the server never asks for


def whole_pages(tokens: int) -> int:
    """Pages a prompt of `tokens` fills completely: what HiCache backs up to the storage backend."""
    return tokens // PAGE_TOKENS


def restorable(tokens: int) -> int:
    """Prompt tokens a restore can supply: whole pages, leaving at least one token to compute."""
    return (tokens - 1) // PAGE_TOKENS * PAGE_TOKENS


def fill_store(path: Path, pages: int, page_kib: int) -> dict[str, Any]:
    """`pages` small pages under another model id, written through ChunkStore into the server's directory,
    so the next server's index rebuild reads that many records; then the snapshot goes (a full scan)."""
    import numpy as np

    from .. import ChunkStore, namespace_fingerprint
    from ..config import settings_from_dict
    from ..tiers.segments import SNAPSHOT_NAME

    ns = namespace_fingerprint(model=FILLER_MODEL, page_kib=page_kib)
    page = np.random.default_rng(7).integers(0, 256, page_kib * 1024, dtype=np.uint8)
    settings = settings_from_dict({"storage": [{"type": "local", "path": str(path)}]}, source="bench filler")
    t = time.perf_counter()
    with ChunkStore.open(settings, background=False) as st:
        for a in range(0, pages, 1024):
            keys = [f"filler-{i}" for i in range(a, min(pages, a + 1024))]
            if not all(st.put(ns, keys, [page] * len(keys))):
                raise RuntimeError(f"filler: put of pages {a}.. into {path} failed")
        st.flush()
    snapshot = path / SNAPSHOT_NAME
    had_snapshot = snapshot.exists()
    snapshot.unlink(missing_ok=True)
    return {"pages": pages, "page_kib": page_kib, "seconds": time.perf_counter() - t,
            "snapshot_removed": had_snapshot}


def count_files(path: Path, suffix: str = ".bin") -> int:
    try:
        return sum(1 for e in os.scandir(path) if e.name.endswith(suffix) and e.is_file())
    except FileNotFoundError:
        return 0


def wait_files(path: Path, at_least: int, timeout: float = SETTLE_TIMEOUT_S) -> int:
    """The `file` backend's backups are done: `at_least` page files, and no new one for SETTLE_S."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        n = count_files(path)
        if n != last:
            last, since = n, time.monotonic()
        if n >= at_least and time.monotonic() - since >= SETTLE_S:
            return n
        time.sleep(0.2)
    raise RuntimeError(f"file backend: {last} page files in {path}, not >= {at_least} within {timeout:.0f} s")


def wait_log(path: Path, pattern: re.Pattern[str], timeout: float = 120.0) -> Optional[re.Match[str]]:
    """The last match of `pattern` in a server log, waiting for the first one (None after the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = list(pattern.finditer(path.read_text(errors="replace")))
        except OSError:
            found = []
        if found or time.monotonic() >= deadline:
            return found[-1] if found else None
        time.sleep(0.2)


def start(srv: Any) -> None:
    """Start a server when SGLang's host-pool check can pass: wait (bounded) for memory that other work holds,
    and start once more when the check failed anyway (memory taken during the start). The start time
    measured is the successful start's."""
    from ..testing import ServerFailed

    for attempt in (1, 2):
        deadline = time.monotonic() + MEMORY_WAIT_S
        while available_bytes() < START_MEMORY_BYTES and time.monotonic() < deadline:
            time.sleep(2.0)
        if available_bytes() < START_MEMORY_BYTES:
            log.warning("server: %.1f GiB available, SGLang's host pool wants > %.0f GiB; starting anyway",
                        available_bytes() / 2**30, (HOST_RESERVE_BYTES + 2**30) / 2**30)
        try:
            srv.start()
            return
        except ServerFailed as e:
            if attempt == 2 or "Not enough host memory" not in str(e):
                raise
            log.warning("server %s: SGLang found too little host memory for its pool; starting it again",
                        srv.log_path.stem)


class Plan:
    """What every server of one run shares: the model, the prompts, the flags per backend."""

    def __init__(self, work: Path, sizes: Sizes) -> None:
        from ..demo import ensure_model
        from ..testing import FILE_BACKEND_DIR_ENV, cpu_flags, hicache_flags, prompt_ids

        self.model = ensure_model(dtype="float32", layout="hf")  # cpu_flags: --dtype float32
        self.tokens = ints(sizes.server_tokens)
        self.check_tokens = sizes.server_check_tokens
        self.prompts = {n: prompt_ids(self.model, n, salt=f"lifeboat bench server, prompt of {n} tokens")
                        for n in self.tokens}
        self.first_tokens = min(self.tokens)
        self.dirs = {"lifeboat": work / "server-lifeboat", "file": work / "server-file"}
        self.logs = work / "server-logs"
        # SGLang's CPU path can copy only the layer_first layout with the direct io backend: the LifeboatCache
        # plugin declares it for its own launches, SGLang's `file` launch gets it here, so the flags match
        # wait_complete: under SGLang's default `timeout` policy (1 s + 0.25 s per 1K tokens) a loaded 2-core
        # VM let a 1K-token restore expire into a recompute (storage 0); this section measures restores
        base = cpu_flags(self.model) + ["--hicache-mem-layout", "layer_first", "--hicache-io-backend", "direct",
                                        "--hicache-storage-prefetch-policy", "wait_complete"]
        self.flags = {
            "lifeboat": base + hicache_flags("lifeboat", {"storage": [{"type": "local",
                                                                       "path": str(self.dirs["lifeboat"])}]}),
            "file": base + hicache_flags("file"),
        }
        # LifeboatCache's stats-file interval stays at its default (5 s), as users run it, not 0.5 s (fast
        # metrics: in one check a 1K restore took 1.9 s at 0.5 s, 0.55 s at 60 s); the settle wait holds longer
        self.env = {"lifeboat": {"LIFEBOAT_STATS_INTERVAL_S": ""},
                    "file": {FILE_BACKEND_DIR_ENV: str(self.dirs["file"])}}
        self.base_flags = base
        self._prompt_ids = prompt_ids

    def first_prompt(self, tag: str) -> list[int]:
        """A prompt no other request of the run shares a page with (the first request after ready)."""
        return self._prompt_ids(self.model, self.first_tokens, salt=f"lifeboat bench server, first request, {tag}")

    def server(self, backend: str, tag: str) -> Any:
        from ..testing import SGLangServer

        return SGLangServer(self.flags[backend], log_path=self.logs / f"{tag}.log", env=self.env[backend])


def one_server(plan: Plan, backend: str, tag: str, *, store: bool) -> dict[str, Any]:
    """Start, first request, the prompts (cold when `store`, restored otherwise); a storing server waits for
    its backups to settle and gets SIGTERM, a restoring one SIGKILL. A failure kills it (no drain wait)."""
    srv = plan.server(backend, tag)
    out: dict[str, Any] = {"backend": backend, "log": str(srv.log_path), "load_avg_at_start": os.getloadavg()[0]}
    try:
        start(srv)
        out["start_s"] = srv.ready_s
        first = srv.generate(plan.first_prompt(tag), 1)
        out["first_request"] = {"tokens": plan.first_tokens, "seconds": first.seconds,
                                "storage_tokens": first.storage_tokens}
        log.info("server %s: ready in %.1f s, first request (%d tokens) %.2f s", tag, srv.ready_s,
                 plan.first_tokens, first.seconds)
        if backend == "lifeboat" and not store:
            m = wait_log(srv.log_path, REBUILD_LINE)
            out["index_rebuild"] = {"pages": int(m.group(1)), "ms": int(m.group(2))} if m else None
            out["lifeboat_log"] = [ln for ln in srv.log_path.read_text(errors="replace").splitlines()
                                   if STORE_LOG_LINE.search(ln)][-6:]
        out["prompts"] = {}
        for n, ids in plan.prompts.items():
            timed = srv.generate(ids, 1)
            check = srv.generate(ids, plan.check_tokens)
            out["prompts"][n] = {"seconds": timed.seconds, "storage_tokens": timed.storage_tokens,
                                 "cached_details": timed.cached_details, "first_token": timed.output_ids[:1],
                                 "check_output": check.output_ids}
            log.info("server %s: %d tokens in %.2f s (storage %d)", tag, n, timed.seconds, timed.storage_tokens)
        if store:
            pages = whole_pages(plan.first_tokens) + sum(whole_pages(n) for n in plan.tokens)
            t = time.monotonic()
            if backend == "lifeboat":
                out["pages_stored"] = srv.wait_metric("lifeboat_pages_written_total", pages,
                                                      settle_s=STATS_SETTLE_S, timeout=SETTLE_TIMEOUT_S)
            else:
                out["pages_stored"] = wait_files(plan.dirs["file"], pages)
            out["settle_s"] = time.monotonic() - t
        else:
            out["prefetch_log"] = [ln for ln in srv.log_path.read_text(errors="replace").splitlines()
                                   if PREFETCH_LOG.search(ln) and "server_args=" not in ln][-12:]
        t = time.monotonic()
        if store:  # a clean stop, as a service manager does: what the next server reads was written before it
            out["stop_rc"] = srv.stop()
        else:  # nothing left to keep: no need to wait for SGLang's drain
            srv.kill()
            out["stop_rc"] = "killed"
        out["stop_s"] = time.monotonic() - t
    finally:
        if "stop_rc" not in out:
            srv.kill()
    return out


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a and b else None


def summarize(plan: Plan, s: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per prompt size: the three times, the ratios of this run, what storage supplied, same tokens."""
    rows = []
    for n in plan.tokens:
        cold, cold_f = s["lifeboat_store"]["prompts"][n], s["file_store"]["prompts"][n]
        lb, fb = s["lifeboat_restore"]["prompts"][n], s["file_restore"]["prompts"][n]

        def same(r: dict[str, Any]) -> bool:
            return r["first_token"] == cold["first_token"] and r["check_output"] == cold["check_output"]

        rows.append({
            "tokens": n, "restorable_tokens": restorable(n),
            "recompute_s": cold["seconds"], "recompute_file_server_s": cold_f["seconds"],
            "lifeboat_restored_s": lb["seconds"], "file_restored_s": fb["seconds"],
            "lifeboat_speedup": _ratio(cold["seconds"], lb["seconds"]),
            "file_speedup": _ratio(cold["seconds"], fb["seconds"]),
            "lifeboat_vs_file": _ratio(fb["seconds"], lb["seconds"]),
            "lifeboat_storage_tokens": lb["storage_tokens"], "file_storage_tokens": fb["storage_tokens"],
            "lifeboat_tokens_identical": same(lb), "file_tokens_identical": same(fb),
            "file_server_recompute_identical": same(cold_f),
        })
    return rows


def run(work: Path, sizes: Sizes) -> dict[str, Any]:
    plan = Plan(work, sizes)
    for d in plan.dirs.values():
        shutil.rmtree(d, ignore_errors=True)
    load0 = os.getloadavg()
    servers: dict[str, dict[str, Any]] = {}
    servers["lifeboat_store"] = one_server(plan, "lifeboat", "lifeboat_store", store=True)
    servers["file_store"] = one_server(plan, "file", "file_store", store=True)
    filler = fill_store(plan.dirs["lifeboat"], sizes.server_store_pages, sizes.server_filler_kib)
    log.info("server: %d filler pages of %d KiB written in %.1f s", filler["pages"], filler["page_kib"],
             filler["seconds"])
    resident = {}
    for backend, tag in (("lifeboat", "lifeboat_restore"), ("file", "file_restore")):
        resident[backend] = drop_page_cache(plan.dirs[backend])
        servers[tag] = one_server(plan, backend, tag, store=False)
    a, b = servers["lifeboat_store"], servers["lifeboat_restore"]
    return {
        "model": "SmolLM2-135M-Instruct, float32, HF layout",
        "flags": " ".join(_shown(plan.base_flags)), "cores": os.cpu_count(),
        "load_avg": {"start": [round(x, 2) for x in load0], "end": [round(x, 2) for x in os.getloadavg()]},
        "check_tokens": plan.check_tokens, "page_tokens": PAGE_TOKENS,
        "prompts": summarize(plan, servers),
        "start": {
            "empty_store_s": a["start_s"], "big_store_s": b["start_s"],
            "store_pages": sizes.server_store_pages, "filler": filler,
            "index_rebuild": b.get("index_rebuild"),
            "first_request_tokens": plan.first_tokens,
            "first_request_empty_s": a["first_request"]["seconds"],
            "first_request_big_s": b["first_request"]["seconds"],
            "first_request_big_vs_empty": _ratio(b["first_request"]["seconds"], a["first_request"]["seconds"]),
            "file_empty_s": servers["file_store"]["start_s"], "file_stored_s": servers["file_restore"]["start_s"],
            "file_first_request_s": [servers[t]["first_request"]["seconds"] for t in ("file_store", "file_restore")],
        },
        "resident_pages_before_restore": resident,
        "servers": {k: {kk: vv for kk, vv in v.items() if kk != "prompts"} for k, v in servers.items()},
    }


def _shown(flags: Sequence[str]) -> list[str]:
    """The launch flags without the model path (a local directory)."""
    out, skip = [], False
    for f in flags:
        if skip:
            skip = False
            continue
        if f == "--model-path":
            skip = True
            continue
        out.append(f)
    return out
