"""Every environment variable LifeboatCache reads, its parser, and `VARIABLES`: the table docs are checked against.

Each parser takes the environment as a mapping (tests pass a dict) and raises ConfigError whose
message starts with the variable's name and says what values are allowed, because the message is often
all a user sees (a launch stops on it). A blank value counts as unset where the variable is a launch
setting. The old homes re-export these names (`integrations.sglang_launch_rules`, `statsfile`,
`integrations.sglang_mlx`, `demo.mlx_serving`), so callers need not change.

`LIFEBOAT_CONFIG` is parsed by `config.find_config_file` and `LIFEBOAT_KEY_FILE` by
`config.parse_key_file_env` (load_settings applies it), because it is the first step of the config
file's lookup order and ConfigError lives there; this module re-exports it and lists the variable.

Core layer: imports only `config` (ConfigError, find_config_file).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Union

from .config import ENV_KEY_FILE, ConfigError, find_config_file, parse_key_file_env

Env = Mapping[str, str]

# ------------------------------------------------------------------------------------------ names
ENV_CONFIG = "LIFEBOAT_CONFIG"
ENV_ENABLE = "LIFEBOAT_CACHE"
ENV_PAGE_SIZE = "LIFEBOAT_SGLANG_PAGE_SIZE"
ENV_STAGING_TOKENS = "LIFEBOAT_SGLANG_STAGING_TOKENS"
ENV_HOST_GB = "LIFEBOAT_SGLANG_HOST_GB"
ENV_WRITE_POLICY = "LIFEBOAT_SGLANG_WRITE_POLICY"
ENV_ZERO_COPY = "LIFEBOAT_SGLANG_ZERO_COPY"
ENV_REBUILD_WAIT = "LIFEBOAT_MLX_REBUILD_WAIT_S"
ENV_INTERVAL = "LIFEBOAT_STATS_INTERVAL_S"
ENV_BLAS_PRELOAD = "LIFEBOAT_BLAS_PRELOAD"
ENV_LOG_LEVEL = "LIFEBOAT_LOG_LEVEL"
# ENV_KEY_FILE ("LIFEBOAT_KEY_FILE") lives in config.py, which applies it in load_settings

# ------------------------------------------------------------------------------------------ defaults
WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
DEFAULT_REBUILD_WAIT_S = 10.0
DEFAULT_INTERVAL_S = 5.0
DEFAULT_BLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DEFAULT_LOG_LEVEL = "WARNING"

HostGbSetting = Union[int, str, None]  # None: default rule; "auto"; or whole GB per rank


def _raw(env: Env, name: str) -> Optional[str]:
    """Value of `name`, or None when unset or blank (a blank export means 'not set')."""
    value = env.get(name)
    if value is None or not value.strip():
        return None
    return value.strip()


def _as_positive_int(name: str, value: str, allowed: str) -> int:
    """int(value) > 0, else a ConfigError naming the variable and the `allowed` values."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number <= 0:
        raise ConfigError(f"{name}={value!r} is invalid: allowed values are {allowed}")
    return number


def _positive_int(env: Env, name: str, what: str) -> Optional[int]:
    value = _raw(env, name)
    return None if value is None else _as_positive_int(name, value, f"a positive whole number ({what})")


def _switch(env: Env, name: str, default: bool, allowed: str) -> bool:
    """A "1" / "0" variable: `default` when unset, else a ConfigError naming it and the `allowed` values."""
    value = _raw(env, name)
    if value is None:
        return default
    if value in ("0", "1"):
        return value == "1"
    raise ConfigError(f"{name}={value!r} is invalid: allowed values are {allowed}")


# ------------------------------------------------------------------------------------------ SGLang launch
def parse_enable(env: Env) -> bool:
    """`LIFEBOAT_CACHE`: "1" turns LifeboatCache on for a launch, "0" or unset leaves it off."""
    return _switch(env, ENV_ENABLE, False, "'1' (on) and '0' (off)")


def parse_page_size(env: Env) -> Optional[int]:
    """`LIFEBOAT_SGLANG_PAGE_SIZE`: the default page size in tokens when the launch gives none."""
    return _positive_int(env, ENV_PAGE_SIZE, "tokens per page, e.g. 64")


def parse_staging_tokens(env: Env) -> Optional[int]:
    """`LIFEBOAT_SGLANG_STAGING_TOKENS`: bound of SGLang's GPU write-back staging buffer."""
    return _positive_int(env, ENV_STAGING_TOKENS, "tokens, e.g. 1024")


def parse_host_gb(env: Env) -> HostGbSetting:
    """`LIFEBOAT_SGLANG_HOST_GB`: whole GB per rank, or 'auto'; None means the default rule."""
    value = _raw(env, ENV_HOST_GB)
    if value is None:
        return None
    if value.lower() == "auto":
        return "auto"
    return _as_positive_int(ENV_HOST_GB, value, "a positive whole number of GB per rank (e.g. 64) or 'auto'")


def parse_write_policy(env: Env) -> Optional[str]:
    """`LIFEBOAT_SGLANG_WRITE_POLICY`: replaces the launch's `--hicache-write-policy` when set."""
    value = _raw(env, ENV_WRITE_POLICY)
    if value is None:
        return None
    if value not in WRITE_POLICIES:
        raise ConfigError(f"{ENV_WRITE_POLICY}={value!r} is invalid: allowed values are {', '.join(WRITE_POLICIES)}")
    return value


def parse_zero_copy(env: Env) -> bool:
    """`LIFEBOAT_SGLANG_ZERO_COPY`: "1" (default) zero-copy page I/O, "0" SGLang's copying interface."""
    return _switch(env, ENV_ZERO_COPY, True, "'1' (zero-copy, default) and '0'")


# ------------------------------------------------------------------------------------------ MLX, stats, demo
def parse_rebuild_wait(env: Any) -> float:
    """`LIFEBOAT_MLX_REBUILD_WAIT_S`: seconds the launch waits for the store's index (0 .. 3600).

    Raises ConfigError naming the variable and the allowed values when it is not such a number.
    """
    raw = (env.get(ENV_REBUILD_WAIT) or "").strip()
    if not raw:
        return DEFAULT_REBUILD_WAIT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 3600.0:
        raise ConfigError(f"{ENV_REBUILD_WAIT}={raw!r} is invalid: allowed values are seconds from 0 to 3600 "
                          f"(default {DEFAULT_REBUILD_WAIT_S:.0f}), e.g. {ENV_REBUILD_WAIT}=30")
    return value


def parse_interval(env: Optional[Env] = None) -> float:
    """`LIFEBOAT_STATS_INTERVAL_S` (seconds, 0.05 .. 3600; default os.environ); a bad value names the variable."""
    raw = (os.environ if env is None else env).get(ENV_INTERVAL)
    if raw is None or raw == "":
        return DEFAULT_INTERVAL_S
    try:
        v = float(raw)
    except ValueError:
        raise ConfigError(f"{ENV_INTERVAL}={raw!r}: expected seconds between stats-file writes, "
                          f"e.g. {ENV_INTERVAL}=5") from None
    if not 0.05 <= v <= 3600:
        raise ConfigError(f"{ENV_INTERVAL}={raw!r}: must be between 0.05 and 3600 seconds")
    return v


def parse_blas_preload(env: Env) -> Optional[str]:
    """`LIFEBOAT_BLAS_PRELOAD`: the OpenBLAS library MLX child processes preload on Linux; None when unset.

    Raises ConfigError when it names a file that does not exist."""
    given = env.get(ENV_BLAS_PRELOAD)
    if given and not os.path.isfile(given):
        raise ConfigError(f"{ENV_BLAS_PRELOAD}={given!r}: no such file; point it at an OpenBLAS "
                          f"libblas.so.3 (e.g. {DEFAULT_BLAS}) or unset it")
    return given or None


def parse_log_level(env: Any) -> str:
    """`LIFEBOAT_LOG_LEVEL` (DEBUG, INFO, WARNING, ERROR, CRITICAL; default WARNING) for plan and demo processes.

    Raises ConfigError naming the variable and the allowed values for any other value."""
    value = (env.get(ENV_LOG_LEVEL) or DEFAULT_LOG_LEVEL).strip().upper()
    if value not in LOG_LEVELS:
        raise ConfigError(f"{ENV_LOG_LEVEL}={env.get(ENV_LOG_LEVEL)!r} is invalid: allowed values are "
                          + ", ".join(LOG_LEVELS))
    return value


def parse_config(env: Env) -> Any:
    """`LIFEBOAT_CONFIG`: the lifeboat.yaml to load (config.find_config_file: a missing file is a ConfigError)."""
    return find_config_file(env)


# ------------------------------------------------------------------------------------------ the table
@dataclass(frozen=True)
class Variable:
    """One environment variable: its name, its default (as docs show it), what it does, its parser."""

    name: str
    default: str
    what: str
    parse: Callable[[Env], Any]


#: Every LIFEBOAT_* variable the package reads (tests check the source and docs/operating.md against it).
VARIABLES: tuple[Variable, ...] = (
    Variable(ENV_CONFIG, "unset: ./lifeboat.yaml, ~/.config/lifeboat/lifeboat.yaml, else built in",
             "path of lifeboat.yaml", parse_config),
    Variable(ENV_ENABLE, "0", "1 turns LifeboatCache on for an SGLang launch (CUDA HiCache or MLX radix cache)",
             parse_enable),
    Variable(ENV_PAGE_SIZE, "64", "default --page-size (tokens) of a LifeboatCache launch", parse_page_size),
    Variable(ENV_STAGING_TOKENS, "1024", "bound of SGLang's GPU write-back staging buffer (tokens)",
             parse_staging_tokens),
    Variable(ENV_HOST_GB, "10% of RAM, 2-16 GB", "host pool per rank: whole GB or auto", parse_host_gb),
    Variable(ENV_WRITE_POLICY, "the launch's", "replaces --hicache-write-policy: " + ", ".join(WRITE_POLICIES),
             parse_write_policy),
    Variable(ENV_ZERO_COPY, "1", "1 zero-copy page I/O, 0 SGLang's copying interface", parse_zero_copy),
    Variable(ENV_REBUILD_WAIT, f"{DEFAULT_REBUILD_WAIT_S:.0f}",
             "seconds an MLX launch waits for the store's index (0 to 3600)", parse_rebuild_wait),
    Variable(ENV_INTERVAL, f"{DEFAULT_INTERVAL_S:.0f}",
             "seconds between stats-file writes and lifeboat_* metric updates (0.05 to 3600)", parse_interval),
    Variable(ENV_BLAS_PRELOAD, DEFAULT_BLAS + " when present",
             "OpenBLAS preloaded into MLX child processes (demo, bench, tests) on Linux", parse_blas_preload),
    Variable(ENV_LOG_LEVEL, DEFAULT_LOG_LEVEL, "log level of the demo's and plan processes", parse_log_level),
    Variable(ENV_KEY_FILE, "unset: encryption.keys of lifeboat.yaml",
             "key file path(s) for sealed records, the first seals (replaces encryption.keys, turns sealing on)",
             parse_key_file_env),
)

BY_NAME: dict[str, Variable] = {v.name: v for v in VARIABLES}
