"""Launch tuning for SGLang on CUDA: pure rules for page size, staging, host pool and write policy.

Nothing here imports SGLang or torch. The SGLang plugin (`integrations/sglang_plugin.py`) gathers the
facts of a launch (what the command line gave, RAM, ranks, GPU memory) into `LaunchFacts`, calls
`plan_launch_tuning`, declares the returned fields through SGLang's argument resolution and logs each
`Decision`. Keeping the rules here means they are unit-tested over every input without a GPU.

Units: SGLang's `--hicache-size` is a whole number of GB (10**9 bytes) per rank, so every host-pool
result is an `int` in those units. The reserve is SGLang's own host reserve (10 GiB), so what we
choose also passes SGLang's "enough host memory" check at pool allocation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from ...config import ConfigError, raw_value
from .env import (
    ENV_ENABLE, ENV_HOST_GB, ENV_HOST_MODE, ENV_PAGE_SIZE, ENV_STAGING_TOKENS, ENV_WRITE_POLICY, ENV_ZERO_COPY,
    parse_enable, parse_host_gb, parse_host_mode, parse_page_size, parse_staging_tokens, parse_write_policy,
    parse_zero_copy)
from .sizing import (
    BACKEND_NAME, DEFAULT_HOST_MAX_GB, DEFAULT_HOST_MIN_GB, DEFAULT_PAGE_SIZE, DEFAULT_STAGING_TOKENS, GB, GIB,
    HOST_RESERVE_BYTES, SGLANG_STAGING_PAGE_CHUNK, auto_host_pool_gb, backend_extra_config_json, cpu_token_pool_warning,
    default_host_pool_gb, is_lifeboat_extra_config, staging_pages)


# --------------------------------------------------------------------------------------------
# The plan: what a launch gets, and why
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """One launch decision: `what` is set to `value` because of `why`; `fields` are declared to SGLang."""

    what: str
    value: Any
    why: str
    fields: Mapping[str, Any] = field(default_factory=dict)

    def message(self) -> str:
        return f"{self.what} {self.value} ({self.why})"


@dataclass(frozen=True)
class LaunchFacts:
    """What the launch gave (before LifeboatCache), plus the host facts the rules need.

    `page_size` None and `hicache_size` 0 with `hicache_ratio` None mean "the launch gave none".
    `extra_config` is the parsed `--hicache-storage-backend-extra-config` (None when absent).
    """

    page_size: Optional[int] = None
    hicache_size: int = 0
    hicache_ratio: Optional[float] = None
    write_policy: str = "write_through"
    max_total_tokens: Optional[int] = None  # --max-total-tokens (None: SGLang sizes the token pool itself)
    write_policy_given: bool = False  # the launch typed --hicache-write-policy (a flag beats the environment)
    host_mode: str = "cache"  # --hicache-host-memory-mode (SGLang 0.5.23's default: cache)
    host_mode_given: bool = False  # the launch typed --hicache-host-memory-mode
    enable_hierarchical_cache: bool = False
    storage_backend: Optional[str] = None
    extra_config: Optional[Mapping[str, Any]] = None
    disable_radix_cache: bool = False
    cuda_launch: bool = False
    device: Optional[str] = None
    available_ram_bytes: int = 0
    ranks_per_host: int = 1
    mem_layout: str = "page_first"  # the resolved --hicache-mem-layout (SGLang 0.5.23's default: page_first)
    io_backend: str = "kernel"  # --hicache-io-backend
    prefetch_policy: str = "timeout"  # --hicache-storage-prefetch-policy (SGLang 0.5.23's default: timeout)
    prefetch_policy_given: bool = False  # the launch typed it (`timeout` typed by hand is kept on CPU too)


@dataclass(frozen=True)
class LaunchPlan:
    """The outcome for one launch: `active` says whether LifeboatCache tunes it at all."""

    active: bool
    decisions: tuple[Decision, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def fields(self) -> dict[str, Any]:
        """ServerArgs fields to declare, in decision order (later decisions win)."""
        out: dict[str, Any] = {}
        for d in self.decisions:
            out.update(d.fields)
        return out

    def messages(self) -> list[str]:
        return [d.message() for d in self.decisions]


# Why each host layout is kept. Measured end to end against SGLang's `file` backend
# (`lifeboat bench --only sglang_vs_file`, docs/sglang.md): page_first (SGLang's default) is where
# LifeboatCache is fastest with its defaults; a layout set by hand is never switched.
LAYOUT_REASONS = {
    "page_first": "SGLang's default and LifeboatCache's fastest: 2 blocks (K, V) per page, written and read "
                  "straight from the page, and the GPU copy stays SGLang's kernel io backend",
    "page_first_direct": "2 blocks (K, V) per page like page_first; SGLang uses its direct io backend with it",
    "layer_first": "kept as given: its 2 x layers blocks per page go out and in with pwritev / preadv from "
                   "offsets computed once per pool; page_first is ~equally fast for LifeboatCache and gives the "
                   "GPU copy fewer, larger blocks",
}


def layout_decision(layout: str, io_backend: str = "kernel") -> Decision:
    """The host-pool layout decision: the launch's layout, with why it is a good one for LifeboatCache.

    SGLang's later `handle_hicache` step turns page_first with the direct io backend into
    page_first_direct; the decision names the layout the pools will really have.
    """
    if layout == "page_first" and io_backend == "direct":
        layout = "page_first_direct"
    why = LAYOUT_REASONS.get(layout, "kept as given; pages that are not plain views of the pool go through "
                                     "SGLang's page copies")
    return Decision("host layout", layout, why)


#: Off CUDA, SGLang 0.5.23's host pools can copy pages to and from the device only with this pair
#: (its copy kernels are CUDA / HIP / XPU only; `launch/cpu.py` gives the one op `direct` needs).
CPU_LAYOUT = ("layer_first", "direct")


def is_cpu_launch(facts: LaunchFacts) -> bool:
    """`--device cpu` (or no device on a host without CUDA)."""
    return not facts.cuda_launch and (facts.device or "cpu").split(":", 1)[0] == "cpu"


def cpu_layout_decision(facts: LaunchFacts) -> Decision:
    """On a CPU launch: layer_first + direct, declared over SGLang's defaults; any other typed pair stops.

    SGLang's defaults (page_first + kernel) cannot run off CUDA (the first backup raises NameError
    and kills the scheduler), so they are replaced; a pair typed by hand that cannot run either is
    refused with the flags to use instead of being switched silently.
    """
    given = (facts.mem_layout, facts.io_backend)
    why = "the only host layout / io backend pair SGLang 0.5.23 can copy pages with off CUDA"
    if given == CPU_LAYOUT:
        return Decision("host layout", "layer_first (io direct)", f"the launch gave it; {why}")
    if given == ("page_first", "kernel"):
        return Decision("host layout", "layer_first (io direct)", f"CPU launch: {why}; SGLang's default is "
                        "page_first / kernel", {"hicache_mem_layout": CPU_LAYOUT[0], "hicache_io_backend": CPU_LAYOUT[1]})
    raise ConfigError(
        f"--hicache-mem-layout {facts.mem_layout} --hicache-io-backend {facts.io_backend} cannot run on a CPU "
        f"launch ({why}): use --hicache-mem-layout layer_first --hicache-io-backend direct, or leave both unset"
    )


def cpu_prefetch_decision(facts: LaunchFacts) -> Decision:
    """On a CPU launch: wait_complete instead of SGLang's default timeout policy.

    The timeout policy gives a prefetch 1 s + 0.25 s per 1K tokens. On a CPU server SGLang's prefetch
    threads share the cores with the model, and under load the deadline passed before the read was
    even issued (measured: `batch_exists 46 keys -> 46`, no `batch_get_v1`, the prompt recomputed).
    wait_complete waits for the prefetch, which LifeboatCache bounds by `deadline_s` per call. A policy the
    launch typed, `timeout` included, is kept: a flag beats LifeboatCache's default, as everywhere here.
    """
    if facts.prefetch_policy != "timeout" or facts.prefetch_policy_given:
        return Decision("storage prefetch policy", facts.prefetch_policy, "the launch gave it")
    return Decision("storage prefetch policy", "wait_complete",
                    "CPU launch: the model shares the cores with SGLang's prefetch threads, and the timeout "
                    "policy's 1 s + 0.25 s per 1K tokens expired under load before the pages were read; each "
                    "LifeboatCache call returns by deadline_s", {"hicache_storage_prefetch_policy": "wait_complete"})


def flag_over_env(what: str, flag: str, field_name: str, launch_value: str, given: bool, env_name: str,
                  env_value: Optional[str]) -> tuple[Decision, Optional[str]]:
    """A setting with a flag and a LIFEBOAT_SGLANG_* variable: a typed flag beats the variable (as everywhere in
    SGLang), the variable beats the launch's default. Returns the decision and a warning when both were given
    and disagree."""
    if env_value is not None and given:
        differ = env_value != launch_value
        ignored = f"; {env_name}={env_value} ignored: a flag beats the environment" if differ else ""
        warning = (f"{flag} {launch_value} beats {env_name}={env_value} (a flag beats the environment); unset the "
                   "variable or drop the flag") if differ else None
        return Decision(what, launch_value, f"the launch gave {flag}{ignored}"), warning
    if env_value is not None:
        fields = {field_name: env_value} if env_value != launch_value else {}
        return Decision(what, env_value, f"{env_name}; launch had {launch_value}", fields), None
    return Decision(what, launch_value, f"the launch's {what}"), None


def uses_lifeboat_backend(facts: LaunchFacts) -> bool:
    """The launch configured LifeboatCache as its HiCache storage backend."""
    return facts.storage_backend == "dynamic" and is_lifeboat_extra_config(facts.extra_config)


def plan_launch_tuning(
    facts: LaunchFacts,
    env: Mapping[str, str],
    gpu_memory_bytes: Callable[[], Optional[int]] = lambda: None,
) -> LaunchPlan:
    """Decide a CUDA launch's LifeboatCache settings; untouched (inactive) unless LifeboatCache is in use.

    Precedence, for every setting: the launch's own flag > LIFEBOAT_SGLANG_* > LifeboatCache default
    (as everywhere in SGLang, a flag on the command line beats an environment variable); each decision
    says which source won, and an environment value a flag overrode is named as ignored.
    `gpu_memory_bytes` is only called for LIFEBOAT_SGLANG_HOST_GB=auto. Raises ConfigError for an
    invalid environment value, naming the variable and the allowed values.
    """
    enabled = parse_enable(env)
    decisions: list[Decision] = []
    warnings: list[str] = []

    if uses_lifeboat_backend(facts):
        if not facts.enable_hierarchical_cache:
            if not enabled:
                warnings.append(
                    "the launch names LifeboatCache as --hicache-storage-backend but does not pass "
                    "--enable-hierarchical-cache, so SGLang uses no storage backend; LifeboatCache leaves it "
                    f"unchanged (add --enable-hierarchical-cache or set {ENV_ENABLE}=1)"
                )
                return LaunchPlan(active=False, warnings=tuple(warnings))
            decisions.append(
                Decision(
                    "hierarchical cache",
                    "on",
                    f"{ENV_ENABLE}=1; the launch names LifeboatCache as its storage backend",
                    {"enable_hierarchical_cache": True},
                )
            )
    elif enabled:
        if facts.storage_backend is not None:
            warnings.append(
                f"{ENV_ENABLE}=1 but the launch configured --hicache-storage-backend {facts.storage_backend}; "
                "LifeboatCache leaves that launch unchanged"
            )
            return LaunchPlan(active=False, warnings=tuple(warnings))
        if not facts.cuda_launch:
            warnings.append(
                f"{ENV_ENABLE}=1 turns on SGLang's hierarchical cache only on CUDA launches "
                f"(device {facts.device or 'auto-detected: not CUDA'}); this launch is unchanged"
            )
            return LaunchPlan(active=False, warnings=tuple(warnings))
        if facts.disable_radix_cache:
            warnings.append(
                f"{ENV_ENABLE}=1 needs the radix cache, but the launch passed --disable-radix-cache; "
                "this launch is unchanged"
            )
            return LaunchPlan(active=False, warnings=tuple(warnings))
        decisions.append(
            Decision(
                "HiCache storage backend",
                BACKEND_NAME,
                f"{ENV_ENABLE}=1 on a CUDA launch that configured no storage backend",
                {
                    "enable_hierarchical_cache": True,
                    "hicache_storage_backend": "dynamic",
                    "hicache_storage_backend_extra_config": backend_extra_config_json(),
                },
            )
        )
    else:
        return LaunchPlan(active=False)

    # Validate every variable first so one bad value stops the launch before anything is decided.
    env_page = parse_page_size(env)
    env_staging = parse_staging_tokens(env)
    env_host = parse_host_gb(env)
    env_policy = parse_write_policy(env)
    env_host_mode = parse_host_mode(env)
    zero_copy = parse_zero_copy(env)

    # Page size.
    if facts.page_size is not None:
        page_size = facts.page_size
        decisions.append(Decision("page size", page_size, "the launch gave --page-size"))
    elif env_page is not None:
        page_size = env_page
        decisions.append(
            Decision("page size", page_size, f"{ENV_PAGE_SIZE}; launch gave none", {"page_size": page_size})
        )
    else:
        page_size = DEFAULT_PAGE_SIZE
        decisions.append(
            Decision("page size", page_size, "LifeboatCache default; launch gave none", {"page_size": page_size})
        )

    # Staging bound (applied in the scheduler, where the buffers are built).
    tokens = env_staging if env_staging is not None else DEFAULT_STAGING_TOKENS
    pages = staging_pages(tokens, page_size)
    source = ENV_STAGING_TOKENS if env_staging is not None else "LifeboatCache default"
    decisions.append(
        Decision(
            "GPU write-back staging",
            f"{pages * page_size} tokens",
            f"{source}: at most {tokens} tokens in whole {page_size}-token pages; SGLang alone: "
            f"{SGLANG_STAGING_PAGE_CHUNK * page_size} tokens",
        )
    )

    # Host pool.
    if facts.hicache_size > 0 or facts.hicache_ratio is not None:
        if facts.hicache_size > 0:
            given = f"--hicache-size {facts.hicache_size}"
        else:
            given = f"--hicache-ratio {facts.hicache_ratio}"
        ignored = f"; {ENV_HOST_GB} ignored" if env_host is not None else ""
        decisions.append(Decision("host pool", given, f"the launch gave it{ignored}"))
    elif env_host == "auto":
        gpu = gpu_memory_bytes()
        if gpu is None or gpu <= 0:
            raise ConfigError(
                f"{ENV_HOST_GB}=auto needs the GPU's memory and no GPU was found: allowed values are a positive "
                "whole number of GB per rank (e.g. 64) or 'auto' on a GPU host"
            )
        gb = auto_host_pool_gb(gpu, facts.available_ram_bytes, facts.ranks_per_host)
        decisions.append(
            Decision(
                "host pool",
                f"{gb} GB per rank",
                f"{ENV_HOST_GB}=auto: min(2 x GPU {gpu / GB:.1f} GB, half of available RAM "
                f"{facts.available_ram_bytes / GB:.1f} GB less the {HOST_RESERVE_BYTES // GIB} GiB reserve, split "
                f"over {facts.ranks_per_host} rank(s))",
                {"hicache_size": gb},
            )
        )
    elif env_host is not None:
        gb = int(env_host)
        decisions.append(Decision("host pool", f"{gb} GB per rank", ENV_HOST_GB, {"hicache_size": gb}))
    else:
        gb = default_host_pool_gb(facts.available_ram_bytes)
        decisions.append(
            Decision(
                "host pool",
                f"{gb} GB per rank",
                f"LifeboatCache default: 10% of available RAM {facts.available_ram_bytes / GB:.1f} GB, "
                f"clamped to {DEFAULT_HOST_MIN_GB}-{DEFAULT_HOST_MAX_GB} GB; launch gave none",
                {"hicache_size": gb},
            )
        )
    chosen = decisions[-1].fields.get("hicache_size")
    if chosen:
        room = max(0, facts.available_ram_bytes - HOST_RESERVE_BYTES) // max(1, facts.ranks_per_host)
        if chosen * GB > room:
            warnings.append(
                f"a {chosen} GB host pool per rank exceeds this host's room ({room / GB:.1f} GB per rank after "
                f"the {HOST_RESERVE_BYTES // GIB} GiB reserve); SGLang will refuse to allocate it. Set "
                f"{ENV_HOST_GB} or --hicache-size lower"
            )

    for d, w in (flag_over_env("write policy", "--hicache-write-policy", "hicache_write_policy", facts.write_policy,
                               facts.write_policy_given, ENV_WRITE_POLICY, env_policy),
                 flag_over_env("host memory mode", "--hicache-host-memory-mode", "hicache_host_memory_mode",
                               facts.host_mode, facts.host_mode_given, ENV_HOST_MODE, env_host_mode)):
        decisions.append(d)
        warnings += [w] if w else []

    if is_cpu_launch(facts):
        decisions += [cpu_layout_decision(facts), cpu_prefetch_decision(facts)]
        tight = cpu_token_pool_warning(facts.available_ram_bytes, facts.hicache_size or int(chosen or 0),
                                       facts.max_total_tokens)
        warnings += [tight] if tight else []
    else:
        decisions.append(layout_decision(facts.mem_layout, facts.io_backend))

    # Zero-copy (the backend reads the variable; validated here so a typo stops the launch).
    decisions.append(
        Decision(
            "zero-copy page I/O",
            "on" if zero_copy else "off",
            ENV_ZERO_COPY if raw_value(env, ENV_ZERO_COPY) is not None else "default",
        )
    )
    return LaunchPlan(active=True, decisions=tuple(decisions), warnings=tuple(warnings))
