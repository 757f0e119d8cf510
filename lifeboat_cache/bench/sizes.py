"""Which sections there are and how big each runs: the full preset (fits ~15 minutes on a 2-core
machine; the server section adds ~7 minutes, the serving section far more: eight SGLang starts and
bench_serving runs per concurrency, ~30 minutes for one concurrency at the sizes of docs/perf/serving.md
on a loaded 2-core VM), the quick preset (the harness end to end: CI runs every section but `server`, which
`scripts/stress.sh` runs, and `serving`, its own test; `server` starts four SGLang CPU servers, 45-55 s
each on a 2-core VM, `serving` five more plus two short bench_serving runs each), and `--size key=value` overrides."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

SECTIONS = ("ceilings", "sglang_vs_file", "sealing", "index_scale", "compression", "retention", "interference",
            "busy_tier", "s3", "mlx", "server", "serving")  # in run order


@dataclass(frozen=True)
class Sizes:
    ceiling_mib: int = 256           # bytes per ceiling measurement (memcpy, plain file, codec)
    reps: int = 3                    # interleaved reps per contender pair (medians + spread)
    case_mib: int = 192              # page bytes written per contender per rep and case
    batch_pages: int = 32            # pages per controller batch call
    write_pause_ms: int = 3000       # idle time before a timed write (a server's backups come in bursts)
    runway_mib: int = 4096           # new bytes per call size in the ceilings' write runway
    torch_threads: int = 1           # torch intra-op threads, pinned for both contenders
    compression: str = "default"     # LifeboatCache `compression:` for the SGLang section (default: its own)
    lifeboat_tier: str = "local"     # LifeboatCache's tier type in the SGLang section: local, or nfs (compressed
    #                                  by default; on a local directory here, so it measures the codec, not a link)
    realkv_tokens: int = 1024        # SmolLM2 tokens of real text behind the real-KV pages
    index_pages: str = "10000,100000,1000000,10000000"
    s3_pages: int = 64
    s3_page_kib: int = 512
    s3_io_workers: int = 16
    s3_latency_ms: str = "0,20"       # added per-request latency of the local S3 server (a real endpoint: tens of ms)
    mlx_tokens: str = "512,2048,8000"  # prompts get ~20 chat-template tokens; SmolLM2 holds 8,192
    mlx_new_tokens: int = 8
    mlx_processes: int = 3           # 3: cold / restored / baseline in fresh processes; 1: one process (quick)
    shapes: str = "small,8b"
    layouts: str = "page_first,layer_first"
    kinds: str = "real,random"
    # a real SGLang CPU server: returning prompts (SmolLM2 holds 8,192, so 8K is 8,000 + 1 new token), the
    # filler pages of the big-store start, and the greedy tokens compared with the cold run
    server_tokens: str = "1024,4096,8000"
    server_store_pages: int = 100_000
    server_filler_kib: int = 4
    server_check_tokens: int = 8
    # many returning users at once (bench/serving.py): SGLang's load generator on our seeded trace, four
    # servers, a restart after serving_restart_turn turns; pools sized so the conversations' KV is several
    # times device + host (SmolLM2 float32: 45 KiB a token)
    serving_servers: str = "none,host,file,lifeboat"
    serving_concurrency: str = "4,16"
    serving_conversations: int = 24  # > concurrency, so a conversation returns after the others
    serving_turns: int = 3
    serving_restart_turn: int = 2    # turns before the restart
    serving_system_words: int = 300
    serving_user_words: int = 100
    serving_reply_words: int = 40
    serving_output_tokens: int = 16
    serving_device_tokens: int = 3072   # --max-total-tokens
    serving_host_ratio: str = "2"       # --hicache-ratio: host pool = ratio x device pool
    serving_host_gb: int = 0            # >0: a host pool of this many GB instead (LIFEBOAT_SGLANG_HOST_GB)
    serving_store_mib: int = 0          # >0: a store this small (LifeboatCache capacity:, file max_size)
    serving_prefetch_policy: str = "wait_complete"  # or timeout (SGLang's default), best_effort
    serving_write_policy: str = "write_through"     # or write_through_selective, write_back
    serving_host_mode: str = "cache"                # --hicache-host-memory-mode: or buffer_only
    serving_stop: str = "sigterm"                   # or sigkill: the restart in the middle
    serving_dataset: str = "multi_turn"             # or shared_prefix: SGLang's generated-shared-prefix
    serving_shared_prefix: str = "8,6,900,48"       # its groups, users per group, system and question tokens
    serving_seed: int = 1
    serving_threads: int = 1                        # OMP_NUM_THREADS of every server (see serving.py)
    serving_floor_prompts: int = 8                  # returning prompts probed alone afterwards (serving_floor.py)
    # what a backend's threads cost a Python thread in its process (interference.py; 3 s each with --quick)
    interference_s: int = 20            # seconds of steps per contender
    interference_pages: int = 11        # pages (768 KiB) per backup burst: one 700-token prompt's pages
    interference_period_ms: int = 100   # a burst this often (110 pages/s, ~80 MB/s); every other one read back
    interference_io_workers: str = "8,1"  # LifeboatCache contenders (engine io_workers; 8 is the default)
    interference_io_scheduling: str = "batch,normal"  # ... each under these io_scheduling (batch: the default)
    # reads and puts beside a process's backups, per tier kind (busy_tier.py; 2 s each with --quick)
    busy_tier_kinds: str = "local,nfs"  # nfs: on a local directory (its seals fdatasync, seal_after_s 2)
    busy_tier_s: int = 15               # seconds per kind
    busy_tier_mb_s: int = 200           # backups' rate
    busy_tier_pages: int = 8            # pages (768 KiB) per put
    busy_tier_segment: str = "64MiB"    # segment_size: a put fills one every ~0.3 s


QUICK = Sizes(ceiling_mib=8, reps=2, case_mib=4, runway_mib=16, batch_pages=4, write_pause_ms=1, realkv_tokens=64,
              index_pages="1000,10000", s3_pages=8, s3_page_kib=64, s3_io_workers=4, s3_latency_ms="0",
              mlx_tokens="128", mlx_new_tokens=2, mlx_processes=1, server_tokens="512", server_store_pages=2000,
              serving_servers="none,lifeboat", serving_concurrency="4", serving_conversations=8, serving_turns=2,
              serving_restart_turn=1, serving_system_words=250, serving_user_words=60, serving_output_tokens=8,
              serving_device_tokens=4096, serving_floor_prompts=2, interference_io_workers="8")
# quick server prompt: 512, not 256 tokens: SGLang prefetches from storage only when at least its
# prefetch threshold (256 tokens) is there, and a 256-token prompt leaves 192 restorable


CHOICES = {"lifeboat_tier": ("local", "nfs")}  # sizes that name one of a few things
ZERO_MEANS = {"serving_floor_prompts": "no floor probe",  # counts where 0 has a meaning of its own
              "serving_host_gb": "the host pool is sized by serving_host_ratio",
              "serving_store_mib": "the store is not bounded"}


def make(quick: bool, overrides: list[str]) -> Sizes:
    """The preset with `key=value` overrides; a bad key or value names the field."""
    base = QUICK if quick else Sizes()
    types = {f.name: f.type for f in fields(Sizes)}
    kw = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in types:
            raise ValueError(f"--size {item!r}: expected KEY=VALUE with KEY one of {', '.join(types)}")
        if types[key] in (int, "int"):
            try:
                kw[key] = int(value)
            except ValueError:
                raise ValueError(f"--size {key}: {value!r} is not an integer") from None
            if kw[key] < 0 or (kw[key] == 0 and key not in ZERO_MEANS):
                raise ValueError(f"--size {key}: must be " + (f">= 0 (0: {ZERO_MEANS[key]})" if key in ZERO_MEANS
                                                              else "> 0"))
        elif key in CHOICES and value.strip() not in CHOICES[key]:
            raise ValueError(f"--size {key}: {value!r} is not one of {', '.join(CHOICES[key])}")
        else:
            kw[key] = value.strip()
    return replace(base, **kw)


def ints(csv: str) -> list[int]:
    return [int(x) for x in csv.split(",") if x.strip()]


def names(csv: str) -> list[str]:
    return [x.strip() for x in csv.split(",") if x.strip()]
