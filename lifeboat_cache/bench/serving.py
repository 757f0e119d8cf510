"""Many returning users at once: a real SGLang CPU server under SGLang's own load generator, restarted in
the middle of the traffic, for four servers on the same traffic and the same flags otherwise:

  none       no HiCache: SGLang's device prefix cache only
  host       HiCache with host memory only (no storage backend)
  file       HiCache + SGLang's `file` backend
  lifeboat   HiCache + LifeboatCache (one local tier)

The traffic is our seeded multi-turn trace (`serving_trace`): conversations that grow turn by turn and come
back after all the others, replayed by `python -m sglang.bench_serving` at each concurrency. The device
pool (`--max-total-tokens`) and the host pool (`--hicache-ratio` x the device pool) are sized small, so
the conversations' KV is several times what device + host hold and a returning prompt's prefix is, if
anywhere, in storage (`serving_host_gb` sizes the host pool in GB instead, the LifeboatCache server's
through LIFEBOAT_SGLANG_HOST_GB as users set it; each half records the pool SGLang allocated). After
`serving_restart_turn` turns the server is stopped (SIGTERM, or SIGKILL with
`serving_stop=sigkill`) and a new one starts on the same store for the remaining turns: every returning
conversation of the second half comes back to a process that has never seen it. With
`serving_dataset=shared_prefix` the traffic is SGLang's own `generated-shared-prefix` instead (groups of users
sharing a system prompt, `serving_shared_prefix`), the whole set sent before the restart and again after it.

Per server (`serving_load.summary`): request throughput and output tokens/s over the run, TTFT p50 /
p90 / p99 (all requests of both halves; and p50 per half: the cold-start cliff), prompt tokens per
cache source (SGLang's per-request `cached_tokens_details`), and the growth of SGLang's storage counters
(`/metrics`). Correctness: the answers (greedy, fixed seed) of `lifeboat` against `none`, request by
request. One server at a time (see `server.py` for SGLang's 10 GiB host-memory reserve).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from .common import log
from .server import start
from .serving_floor import probe
from .serving_load import command, differing, run_half, summary, ttft_p50_ms
from .serving_shared_prefix import SharedPrefixShape
from .serving_trace import TraceShape, dataset_args, halves, write
from .sizes import Sizes, ints, names

SERVERS = ("none", "host", "file", "lifeboat")
FLOOR_SERVERS = ("none", "file", "lifeboat")  # probed alone afterwards (serving_floor); `host` restores nothing
PREFETCH_POLICIES = ("timeout", "best_effort", "wait_complete")
WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
HOST_MODES = ("cache", "buffer_only")
STOPS = ("sigterm", "sigkill")
DATASETS = ("multi_turn", "shared_prefix")  # our seeded conversations; SGLang's generated-shared-prefix
KV_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4  # SmolLM2-135M: K and V, 30 layers, 3 KV heads of 64, float32
_HOST_POOL = re.compile(r"Allocating \S+ hierarchical KV host pool: (\d+) tokens")  # srt/mem_cache/pool_host/base.py


def check(sizes: Sizes) -> None:
    """Raise ValueError naming the --size key when a serving option is unusable."""
    for key, value, allowed in (("serving_prefetch_policy", sizes.serving_prefetch_policy, PREFETCH_POLICIES),
                                ("serving_write_policy", sizes.serving_write_policy, WRITE_POLICIES),
                                ("serving_host_mode", sizes.serving_host_mode, HOST_MODES),
                                ("serving_stop", sizes.serving_stop, STOPS),
                                ("serving_dataset", sizes.serving_dataset, DATASETS)):
        if value not in allowed:
            raise ValueError(f"--size {key}={value}: choose one of {', '.join(allowed)}")
    bad = [s for s in names(sizes.serving_servers) if s not in SERVERS]
    if bad or not names(sizes.serving_servers):
        raise ValueError(f"--size serving_servers={sizes.serving_servers}: a comma-separated list of "
                         f"{', '.join(SERVERS)}")
    if sizes.serving_floor_prompts < 0:
        raise ValueError(f"--size serving_floor_prompts={sizes.serving_floor_prompts}: a count of prompts, 0 for no "
                         "floor probe")
    if sizes.serving_dataset == "shared_prefix":
        SharedPrefixShape.parse(sizes.serving_shared_prefix)
    if not sizes.serving_host_gb and float(sizes.serving_host_ratio) <= 1.0:
        raise ValueError(f"--size serving_host_ratio={sizes.serving_host_ratio}: SGLang needs a host pool larger "
                         "than the device pool (a ratio > 1)")


class ServingPlan:
    """What every server of a serving run shares: model, trace, halves, flags per server."""

    def __init__(self, work: Path, sizes: Sizes) -> None:
        from ..demo import ensure_model
        from ..integrations.launch import ENV_HOST_GB
        from ..testing import FILE_BACKEND_DIR_ENV, cpu_flags, hicache_flags

        check(sizes)
        self.sizes = sizes
        self.model = ensure_model(dtype="float32", layout="hf")
        self.shape = TraceShape(conversations=sizes.serving_conversations, turns=sizes.serving_turns,
                                system_words=sizes.serving_system_words, user_words=sizes.serving_user_words,
                                reply_words=sizes.serving_reply_words, seed=sizes.serving_seed)
        self.shared = (SharedPrefixShape.parse(sizes.serving_shared_prefix)
                       if sizes.serving_dataset == "shared_prefix" else None)
        self.halves = self.shared.halves() if self.shared else halves(self.shape, sizes.serving_restart_turn)
        self.trace = None if self.shared else write(work / "serving-trace.json", self.shape)
        self.servers = names(sizes.serving_servers)
        self.dirs = {"lifeboat": work / "serving-lifeboat", "file": work / "serving-file"}
        self.logs = work / "serving-logs"
        # the host pool: ratio x the device pool, or serving_host_gb GB, which the LifeboatCache server gets
        # from LIFEBOAT_SGLANG_HOST_GB (the plugin sets --hicache-size) and the others as --hicache-size
        gb = sizes.serving_host_gb
        ratio = None if gb else float(sizes.serving_host_ratio)
        self.base = cpu_flags(self.model, max_total_tokens=sizes.serving_device_tokens)
        hicache = ["--hicache-mem-layout", "layer_first", "--hicache-io-backend", "direct",
                   "--hicache-write-policy", sizes.serving_write_policy]
        # buffer_only (needs a storage backend): the host pool only stages, and a prefetched span stays pinned
        # until its request is admitted
        policy = ["--hicache-storage-prefetch-policy", sizes.serving_prefetch_policy,
                  "--hicache-host-memory-mode", sizes.serving_host_mode]
        # serving_store_mib: both stores bounded alike, by the bytes of the pages they hold (LifeboatCache's
        # `capacity:` counts what `file`'s LRU evictor counts against its `max_size`), so a full store's
        # retention is part of what the run measures
        mib = sizes.serving_store_mib
        tier = {"type": "local", "path": str(self.dirs["lifeboat"]), **({"capacity": f"{mib}MiB"} if mib else {})}
        store = {"storage": [tier]}
        file_cap = {"max_size": str(mib << 20)} if mib else None
        self.flags = {
            "none": self.base,
            "host": self.base + hicache_flags("none", host_gb=gb, host_ratio=ratio) + hicache,
            "file": self.base + hicache_flags("file", file_cap, host_gb=gb, host_ratio=ratio) + hicache + policy,
            "lifeboat": self.base + hicache_flags("lifeboat", store, host_gb=None, host_ratio=ratio) + hicache + policy,
        }
        # one intra-op thread per server: on a shared 2-core VM two OpenMP threads wait on each other whenever
        # either is descheduled (seen at load 8: 4 s per decode step of 4 requests, 0.6 output tok/s)
        threads = {"OMP_NUM_THREADS": str(sizes.serving_threads)}
        self.env = {"none": threads, "host": threads, "file": {**threads, FILE_BACKEND_DIR_ENV: str(self.dirs["file"])},
                    "lifeboat": {**threads, "LIFEBOAT_STATS_INTERVAL_S": "1",
                                 **({ENV_HOST_GB: str(gb)} if gb else {})}}
        device = sizes.serving_device_tokens
        self.pool_tokens = {"device": device, "host": gb * 10**9 // KV_BYTES_PER_TOKEN if gb else int(ratio * device)}

    def dataset(self, offset: int) -> list[str]:
        """bench_serving's dataset arguments for a half starting at visit `offset`."""
        if self.shared:
            return self.shared.args(self.sizes.serving_output_tokens)
        assert self.trace is not None
        return dataset_args(self.trace, offset)

    def server(self, name: str, tag: str) -> Any:
        from ..testing import SGLangServer

        return SGLangServer(self.flags[name], log_path=self.logs / f"{tag}.log", env=self.env[name])


def one_server(plan: ServingPlan, name: str, concurrency: int, work: Path) -> dict[str, Any]:
    """Both halves of the trace on `name`: a server, the first half, a stop, a new server on the same store,
    the second half. A failure kills whatever runs (no drain wait)."""
    out: dict[str, Any] = {"server": name, "halves": []}
    for half, (offset, count) in enumerate(plan.halves):
        tag = f"{name}-c{concurrency}-half{half + 1}"
        srv = plan.server(name, tag)
        try:
            start(srv)
            cmd = command(srv, plan.model, plan.dataset(offset), count=count, concurrency=concurrency,
                          output_tokens=plan.sizes.serving_output_tokens, out_file=work / f"{tag}.jsonl",
                          seed=plan.sizes.serving_seed)
            load0 = os.getloadavg()[0]
            res = run_half(srv, cmd, work / f"{tag}.jsonl", plan.logs / f"{tag}.bench.log")
            res.update({"start_s": srv.ready_s, "log": str(srv.log_path), "load_avg_1m": [load0, os.getloadavg()[0]],
                        "effective_prefetch_policy":
                        _effective_policy(srv.log_path) if name == "lifeboat" else None,
                        "host_pool_tokens": host_pool_tokens(srv.log_path)})
            t = time.monotonic()
            if half == 0 and plan.sizes.serving_stop == "sigterm":
                res["stop_rc"] = srv.stop()  # in the middle of the traffic's life: backups may still run
            else:
                srv.kill()
                res["stop_rc"] = "killed"
            res["stop_s"] = time.monotonic() - t
            out["halves"].append(res)
        finally:
            srv.kill()
    out["summary"] = summary(out["halves"])
    out["ttft_p50_ms_by_half"] = [ttft_p50_ms(h) for h in out["halves"]]
    if name in FLOOR_SERVERS and plan.sizes.serving_floor_prompts > 0 and plan.trace is not None:
        try:
            out["floor"] = probe(plan, name, concurrency, work)
        except Exception as e:  # the run's figures stand without it; the results say why it is missing
            log.warning("serving c=%d %s: floor probe failed: %s", concurrency, name, e)
            out["floor"] = {"error": str(e)}
    return out


def _effective_policy(log_path: Path) -> str | None:
    """The prefetch policy the LifeboatCache plugin declared (it replaces an untyped `timeout` on a CPU launch)."""
    try:
        for line in log_path.read_text(errors="replace").splitlines():
            if "LifeboatCache: storage prefetch policy" in line:
                return line.split("storage prefetch policy", 1)[1].strip(" :=").split()[0]
    except OSError:
        pass
    return None


def host_pool_tokens(log_path: Path) -> int | None:
    """The host pool SGLang allocated, in tokens, from its own log line (None: no HiCache, or no such line):
    what a server really got, whoever sized it (a flag, the plugin, LIFEBOAT_SGLANG_HOST_GB)."""
    try:
        found = _HOST_POOL.search(log_path.read_text(errors="replace"))
    except OSError:
        return None
    return int(found.group(1)) if found else None


def run(work: Path, sizes: Sizes) -> dict[str, Any]:
    plan = ServingPlan(work, sizes)
    by_conc: dict[str, Any] = {}
    for conc in ints(sizes.serving_concurrency):
        runs: dict[str, Any] = {}
        for name in plan.servers:
            for d in plan.dirs.values():
                shutil.rmtree(d, ignore_errors=True)
            runs[name] = one_server(plan, name, conc, work)
            log.info("serving c=%d %s: %s", conc, name, json.dumps(runs[name]["summary"]))
        cmp = {}
        if "none" in runs:
            for name in ("lifeboat", "file", "host"):
                if name in runs:
                    cmp[name] = [differing(a, b) for a, b in zip(runs[name]["halves"], runs["none"]["halves"])]
            _floor_answers(runs, plan.halves[1][0])
        by_conc[str(conc)] = {"servers": runs, "answers_vs_none": cmp}
    (_, first), (_, second) = plan.halves
    if plan.shared:
        trace: dict[str, Any] = {"dataset": "shared_prefix", **plan.shared.__dict__}
        kv_tokens = plan.shared.distinct_tokens
    else:
        trace = {"dataset": "multi_turn", **plan.shape.__dict__}
        kv_tokens = _conversation_tokens(by_conc, plan.shape.conversations)
    pools = plan.pool_tokens["device"] + plan.pool_tokens["host"]
    return {
        "model": "SmolLM2-135M-Instruct, float32, HF layout", "cores": os.cpu_count(),
        "flags": " ".join(plan.base[2:]),
        "trace": {**trace, "visits": first + second, "before_restart": first, "after_restart": second},
        "pools_tokens": plan.pool_tokens, "kv_bytes_per_token": KV_BYTES_PER_TOKEN,
        "conversations_kv_tokens": kv_tokens, "kv_over_pools": kv_tokens / pools if pools else None,
        "prefetch_policy": sizes.serving_prefetch_policy, "write_policy": sizes.serving_write_policy,
        "host_mode": sizes.serving_host_mode, "host_gb": sizes.serving_host_gb or None,
        "store_mib": sizes.serving_store_mib or None,
        "stop": sizes.serving_stop, "output_tokens": sizes.serving_output_tokens, "threads": sizes.serving_threads,
        "load_avg_end": os.getloadavg(), "concurrency": by_conc,
    }


def _floor_answers(runs: dict[str, Any], offset: int) -> None:
    """Count each floor probe's first answers that differ from the no-HiCache server's answer to the same visit
    in the run's second half (greedy: a restored prefix must not change a token)."""
    ref = runs["none"]["halves"][-1]["result"]["generated_texts"]
    for srv in runs.values():
        floor = srv.get("floor") or {}
        if "pairs" in floor:
            diff = [p["answer"] != ref[p["visit"] - offset] for p in floor["pairs"]]
            floor["answers_vs_none"] = {"compared": len(diff), "differing": sum(diff)}


def _conversation_tokens(by_conc: dict[str, Any], conversations: int) -> int:
    """The conversations' KV in tokens: the prompts of their last visits (the last `conversations` requests
    of a second half, which hold every earlier turn), as the server counted them."""
    for run in by_conc.values():
        for srv in run["servers"].values():
            lens = srv["halves"][-1]["result"]["input_lens"]
            return int(sum(lens[-conversations:]))
    return 0
